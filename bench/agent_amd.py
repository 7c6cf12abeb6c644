"""Agent cost per AMD node sample: the real agent (`chamber agent --vendor amd`) on a recorded sysfs tree of
an 8 x MI300X node (tests/amd_sysfs_tree.py, amdgpu's layout), or on the fake amdsmi 7.x module
(--amdsmi-fake), each interval sample + detect + encode + publish to a real JetStream (acks awaited).

Starts its own nats-server in a temp dir. Reports process CPU time (the agent's process only) per node
sample. The tree lives on this machine's filesystem, so what the kernel's amdgpu driver spends answering
each sysfs read on a real GPU (gpu_metrics asks the SMU firmware) is not in the figure. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats

from events.streams import AGENT_FAULTS, AGENT_TELEMETRY, GATE_PER_WINDOW, TELEMETRY
from node_agent.agent import Agent, AgentOptions
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess
from services.runtime.streams import ensure_streams
from tests.amd_sysfs_tree import write_amd_node


async def widen_gates(url: str, per_subject: int) -> None:
    """The gates let a node publish GATE_PER_WINDOW messages per subject in GATE_WINDOW_S: an agent at
    its interval never gets near that, but this bench's burst of --intervals samples would be refused
    and retried, and the retries counted as the sample's cost. Its gates keep `per_subject` instead (at
    most what the stream they feed keeps, which the server requires)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        for gate in (AGENT_TELEMETRY, AGENT_FAULTS):
            config = (await js.stream_info(gate.name)).config
            config.max_msgs_per_subject = per_subject
            await js.update_stream(config)
    finally:
        await nc.close()


async def measure(url: str, work: Path, gpus: int, ticks: int, amdsmi: Any, partition: str) -> dict[str, object]:
    await widen_gates(url, min(TELEMETRY.max_msgs_per_subject or ticks + 10, max(GATE_PER_WINDOW, ticks + 10)))
    root = work / "root"
    write_amd_node(root, gpus, compute_partition=partition, memory_partition="NPS4" if partition == "CPX" else "NPS1")
    opts = AgentOptions(
        nats=url, cluster="bench", node="mi300-0001", interval_s=1.0, spool_dir=work / "spool", vendor="amd",
        sysfs_root=root,
    )  # fmt: skip
    agent = Agent(opts, amdsmi=amdsmi)
    source = agent.runners[0].sampler.source.name  # type: ignore[attr-defined]
    stop = asyncio.Event()
    pump = asyncio.create_task(agent.outbox.run(stop))
    connector = asyncio.create_task(agent._connect(stop))
    for _ in range(600):
        if agent.outbox.connected:
            break
        await asyncio.sleep(0.05)
    now = 1_800_000_000.0
    agent.outbox.submit(agent.collect(now))  # warm-up: inventory, first connection, streams
    assert await agent.outbox.drained(60)
    # The node's runner does one interval's work: sample + detect + encode; the outbox publishes it. The
    # agent also rewrites its sequence file once per interval (Agent.collect -> SeqStore.save), whatever
    # the vendor; that is measured apart (`us_seq_file_per_interval`): it is this filesystem's rename.
    runner = agent.runners[0]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sample_cpu = 0.0
    per_tick: list[float] = []
    for t in range(1, ticks + 1):
        s0 = time.process_time()
        records = runner.tick(now + t, 1.0)
        took = time.process_time() - s0
        sample_cpu += took
        per_tick.append(took)
        agent.outbox.submit(records)
        if t % 50 == 0:
            assert await agent.outbox.drained(60), "publishing stalled"
    assert await agent.outbox.drained(60)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    q0 = time.process_time()
    for _ in range(200):
        agent.seqs.save(agent.runners)
    seq_file = (time.process_time() - q0) / 200
    stop.set()
    await pump
    connector.cancel()
    if agent.nc is not None:
        await agent.nc.drain()
    agent.spool.close()
    gpus_seen = len(agent.runners[0].sampler.inventory_gpus())
    agent.runners[0].sampler.close()  # type: ignore[attr-defined]
    per_tick.sort()
    return {
        "us_per_node_sample": round(cpu / ticks * 1e6, 1),
        "us_per_node_sample_without_publish": round(sample_cpu / ticks * 1e6, 1),
        "us_p99_without_publish": round(per_tick[int(0.99 * (len(per_tick) - 1))] * 1e6, 1),
        "us_seq_file_per_interval": round(seq_file * 1e6, 1),
        "source": source,
        "gpus_per_node": gpus,
        "gpus_reported": gpus_seen,
        "partition": partition,
        "intervals": ticks,
        "published": agent.outbox.published,
        "wall_s": round(wall, 2),
        "measures": "process CPU time of sample + detect + encode + publish (JetStream acks awaited) per node "
        "sample; the per-interval sequence-file write apart",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--intervals", type=int, default=1000, help="samples measured (1000; at most 1,990)")
    parser.add_argument("--amdsmi-fake", action="store_true", help="through the fake amdsmi module, not sysfs")
    parser.add_argument("--partition", default="SPX", choices=["SPX", "CPX"], help="compute partition mode")
    args = parser.parse_args()
    configure_logging("warning")
    amdsmi = None
    if args.amdsmi_fake:
        from tests.unit import fake_amdsmi

        amdsmi = fake_amdsmi.make(args.gpus_per_node)
    with tempfile.TemporaryDirectory(prefix="chamber-bench-amd-") as tmp:
        server = NatsServerProcess(Path(tmp) / "nats")
        server.start()
        try:
            result = asyncio.run(
                measure(server.url, Path(tmp), args.gpus_per_node, args.intervals, amdsmi, args.partition)
            )
        finally:
            server.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
