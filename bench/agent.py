"""Agent cost per node sample: simulate 1,000 nodes x 8 GPUs in one process, and for each node per
interval sample + detect + encode + publish to a real JetStream (acks awaited).

Starts its own nats-server in a temp dir. Reports process CPU time (the agent's process only; the
server runs in another process) divided by node samples. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node_agent.agent import Agent, AgentOptions
from node_agent.spool import Kind
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess


async def measure(
    url: str,
    spool: Path,
    nodes: int,
    gpus: int,
    ticks: int,
    model: str,
    busy: bool = True,
    fabric: bool = True,
) -> dict[str, object]:
    opts = AgentOptions(
        nats=url, cluster="bench", node="sim", interval_s=1.0, spool_dir=spool, simulate=True,
        nodes=nodes, gpus_per_node=gpus, gpu_model=model, seed=1, sysfs_root=Path("/") if fabric else None,
    )  # fmt: skip
    agent = Agent(opts)
    if busy:  # a job on every GPU: processes, memory, power and clocks as under load
        assert agent.fleet is not None and agent.executor is not None
        agent.fleet.assign({name: {g: f"job-{name}-{g}" for g in range(gpus)} for name in agent.fleet.nodes})
        agent._alloc_version = agent.executor.version  # the (empty) executor must not clear them
    stop = asyncio.Event()
    pump = asyncio.create_task(agent.outbox.run(stop))
    connector = asyncio.create_task(agent._connect(stop))
    for _ in range(600):  # up to 30 s for the first connection
        if agent.outbox.connected:
            break
        await asyncio.sleep(0.05)
    now = 1_800_000_000.0
    agent.tick(now)  # warm-up: inventories, first connection, stream set-up
    assert await agent.outbox.drained(60)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    sample_cpu = 0.0
    for t in range(1, ticks + 1):
        s0 = time.process_time()
        agent.tick(now + t)
        sample_cpu += time.process_time() - s0
        assert await agent.outbox.drained(60), "publishing stalled"
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    node_samples = ticks * nodes
    sizes = [
        len(r.body) for t in range(2, 62) for r in agent.runners[0].tick(now + ticks + t, 1.0) if r.kind == Kind.SAMPLE
    ]
    stop.set()
    await pump
    connector.cancel()
    if agent.nc is not None:
        await agent.nc.drain()
    agent.spool.close()
    assert agent.spool.stats.spooled == 0, "something went to the spool: NATS was not keeping up"
    return {
        "us_per_node_sample": round(cpu / node_samples * 1e6, 1),
        "us_per_node_sample_without_publish": round(sample_cpu / node_samples * 1e6, 1),
        "nodes": nodes,
        "gpus_per_node": gpus,
        "gpu_model": model,
        "intervals": ticks,
        "node_samples": node_samples,
        "published": agent.outbox.published,
        "busy": busy,
        "bytes_per_sample": round(sum(sizes) / len(sizes)),  # a minute of one node: full samples included
        "bytes_per_sample_max": max(sizes),
        "wall_s_per_interval": round(wall / ticks, 4),
        "measures": "process CPU time of sample + detect + encode + publish (JetStream acks awaited) per node sample",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--intervals", type=int, default=10)
    parser.add_argument("--gpu-model", default="H100-80GB")
    parser.add_argument("--idle", action="store_true", help="no jobs on the GPUs (default: a job on every GPU)")
    parser.add_argument("--no-fabric", action="store_true", help="without the companion fabric samples")
    args = parser.parse_args()
    configure_logging("error")
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServerProcess(Path(tmp) / "js")
        server.start()
        try:
            result = asyncio.run(
                measure(
                    server.url,
                    Path(tmp) / "spool",
                    args.nodes,
                    args.gpus_per_node,
                    args.intervals,
                    args.gpu_model,
                    busy=not args.idle,
                    fabric=not args.no_fabric,
                )
            )
        finally:
            server.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
