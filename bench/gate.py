"""What the agents' gate streams cost the server: CPU time per node sample stored in TELEMETRY when
it is published straight into TELEMETRY, and when it goes through AGENT_TELEMETRY (which TELEMETRY
copies). The samples are the agent's own (its runner over the simulated fleet, 8 GPUs a node).

Starts one nats-server per run in a temp dir and reads the server process's CPU time from /proc
(Linux), so the client's own work is not counted. Each node publishes `--intervals` samples, under
the gate's 100 per 10 s. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events import subjects
from node_agent.runner import NodeFacts, NodeRunner
from node_agent.sim.fleet import SimFleet
from node_agent.sim.models import gpu_model
from node_agent.spool import Kind, Record
from services.runtime import connect, ensure_streams
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess


def samples(nodes: int, intervals: int, gpus: int) -> list[Record]:
    """The agent's sample records, interval by interval, every node in each."""
    fleet = SimFleet(seed=1, nodes=nodes, gpus_per_node=gpus, model=gpu_model("H100-80GB"), prefix="bench")
    fleet.assign({name: {g: f"job-{g}" for g in range(gpus)} for name in fleet.nodes})
    runners = [NodeRunner("bench", name, node, NodeFacts(simulated=True)) for name, node in fleet.nodes.items()]
    out: list[Record] = []
    for t in range(intervals):
        for runner in runners:
            out += [r for r in runner.tick(1_800_000_000.0 + t, 1.0) if r.kind == Kind.SAMPLE]
    return out


def server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def publish_all(url: str, records: list[Record], gated: bool, window: int = 2000) -> None:
    nc = await connect(url, name="bench")
    js = nc.jetstream()
    await ensure_streams(js)
    acks: list[bytes] = []
    done = asyncio.Event()
    inbox = nc.new_inbox()

    async def on(msg: object) -> None:
        acks.append(getattr(msg, "data", b""))
        if len(acks) % window == 0 or len(acks) == len(records):
            done.set()

    await nc.subscribe(f"{inbox}.*", cb=on)
    for start in range(0, len(records), window):
        done.clear()
        for i, r in enumerate(records[start : start + window], start):
            subject = subjects.ingest(r.subject) if gated else r.subject
            await nc.publish(subject, r.body, reply=f"{inbox}.{i}", headers=r.headers)
        await asyncio.wait_for(done.wait(), 60)
    assert not [a for a in acks if b'"error"' in a], "a publish was refused"
    # the copies from the gate: the server tells no one when it makes them, so ask
    while (await js.stream_info("TELEMETRY")).state.messages < len(records):  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    await nc.close()


def run_once(records: list[Record], gated: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServerProcess(Path(tmp) / "js")
        server.start()
        try:
            assert server.proc is not None
            before = server_cpu_s(server.proc.pid)
            asyncio.run(publish_all(server.url, records, gated))
            return (server_cpu_s(server.proc.pid) - before) / len(records) * 1e6
        finally:
            server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--intervals", type=int, default=50)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, alternating (the median is printed)")
    args = parser.parse_args()
    configure_logging("error")
    records = samples(args.nodes, args.intervals, args.gpus)
    direct, gated = [], []
    for _ in range(args.rounds):
        direct.append(run_once(records, gated=False))
        gated.append(run_once(records, gated=True))
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(
        json.dumps(
            {
                "samples": len(records),
                "bytes_per_sample": round(sum(len(r.body) for r in records) / len(records)),
                "server_cpu_us_per_sample_direct": round(median(direct), 1),
                "server_cpu_us_per_sample_through_gate": round(median(gated), 1),
                "ratio": round(median(gated) / median(direct), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
