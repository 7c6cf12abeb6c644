"""Runtime throughput on this machine: JetStream publish (batched acks) and consume (decode + ack),
and the decider host's fold rate.

Starts its own nats-server in a temp dir. Prints one JSON object per measurement:
- `node_samples`: 8-GPU node samples (~3 KiB of JSON) published, then consumed by the runtime
  Consumer, through nats-py's `fetch` (`consume_path: fetch`) and through one pull request per batch
  (`consume_path: batched_pull`, what every service's consumers use);
- `domain_events`: small JOBS events (the scheduler's own kinds: submitted, scheduled, completed)
  folded by the scheduler's manifest on the decider host, from start to caught up
  (`folded_events_per_s`; includes decode, the merge across FLEET/QUOTA/JOBS, and `evolve`).
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

from events import NodeSample, encode
from services.runtime import Consumer, ConsumerOptions, Delivery, Publisher, connect, ensure_streams
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess
from tests.builders import a_node_sample


async def measure(url: str, n: int, batch: int, batched_pull: bool) -> dict[str, object]:
    nc = await connect(url, name="bench")
    js = nc.jetstream()
    await ensure_streams(js)
    samples = [a_node_sample(f"n{i % 64:02d}", seq=i) for i in range(n)]
    size = len(encode(samples[0], source="bench")[1])

    publisher = Publisher(js, source="bench")
    t0 = time.perf_counter()
    await publisher.publish_many((s, f"{s.node}:{s.seq}:{batched_pull}", s.observed_at) for s in samples)
    publish_s = time.perf_counter() - t0

    done = asyncio.Event()
    count = 0

    async def handle(delivery: Delivery) -> None:
        nonlocal count
        assert isinstance(delivery.envelope.event, NodeSample)
        count += 1
        if count == n:
            done.set()

    durable = "bench-pull" if batched_pull else "bench-fetch"
    consumer = Consumer(
        js,
        ConsumerOptions(stream="TELEMETRY", durable=durable, batch=batch),
        handler=handle,
        nc=nc if batched_pull else None,
    )
    await consumer.start()
    stop = asyncio.Event()
    t0 = time.perf_counter()
    task = asyncio.create_task(consumer.run(stop))
    await done.wait()
    consume_s = time.perf_counter() - t0
    stop.set()
    await task
    await consumer.unsubscribe()
    await nc.drain()
    return {
        "measure": "node_samples",
        "consume_path": "batched_pull" if batched_pull else "fetch",
        "messages": n,
        "message_bytes": size,
        "publish_msgs_per_s": round(n / publish_s),
        "consume_msgs_per_s": round(n / consume_s),
        "publish_mb_per_s": round(n * size / publish_s / 1e6, 1),
        "consume_batch": batch,
    }


async def fold_rate(url: str, jobs: int) -> dict[str, object]:
    """The scheduler manifest on the host, folding `jobs` x 3 JOBS events (plus a small fleet)."""
    import argparse as _argparse
    import dataclasses

    from bench.restart import fill
    from services.runtime.decider import DeciderHost
    from services.runtime.host import ServiceContext, serve
    from services.scheduler.service import Scheduler

    filled = await fill(url, jobs, nodes=50)
    args = _argparse.Namespace(
        topology_key="rack",
        interval=0.05,
        full_every=30.0,
        preemption_searches=4,
        leader_lease="",
        leader_lease_ttl=15.0,
        retention_hours=6.0,
        snapshot_every=300.0,
    )
    scheduler = Scheduler(args)
    stop = asyncio.Event()
    hosts: list[DeciderHost[object]] = []
    installed = asyncio.Event()

    async def setup(ctx: ServiceContext) -> None:
        manifest = dataclasses.replace(scheduler.manifest(), snapshot=None)  # a full fold, no snapshot
        host = DeciderHost(manifest, ctx)
        scheduler.host = host  # type: ignore[assignment]
        host.install()
        hosts.append(host)  # type: ignore[arg-type]
        installed.set()

    t0 = time.perf_counter()
    task = asyncio.create_task(serve("scheduler", url, setup, stop, health_port=None))
    await installed.wait()
    await hosts[0].caught_up_event.wait()
    with_start_s = time.perf_counter() - t0
    seconds = hosts[0].stats.ready_after_s or with_start_s  # from the host's start: connect excluded
    folded = hosts[0].stats.folded
    stop.set()
    await task
    return {
        "measure": "domain_events",
        "events": folded,
        "seconds": round(seconds, 2),
        "seconds_with_connect": round(with_start_s, 2),
        "folded_events_per_s": round(folded / seconds),
        "path": "decider host: batched pull, merge by timestamp, decode, scheduler evolve",
        "fill_s": filled["fill_s"],
    }


async def fold_rate_consumers(url: str, jobs: int, batched_pull: bool) -> dict[str, object]:
    """Before the host: the scheduler's old shell, one runtime Consumer per stream (per-message
    handler, span and ack), folding into the same core until every event is in."""
    from bench.restart import fill
    from services.runtime import Consumer, ConsumerOptions
    from services.scheduler.core import SchedulerState, evolve

    filled = await fill(url, jobs, nodes=50)
    total = int(filled["events"])
    nc = await connect(url, name="bench-consumers")
    js = nc.jetstream()
    state = SchedulerState()
    done = asyncio.Event()
    count = 0

    async def handle(delivery: Delivery) -> None:
        nonlocal count
        evolve(state, delivery.envelope.event)  # type: ignore[arg-type]
        count += 1
        if count == total:
            done.set()

    stop = asyncio.Event()
    t0 = time.perf_counter()
    consumers = [
        Consumer(js, ConsumerOptions(stream=s, durable=None), handler=handle, nc=nc if batched_pull else None)
        for s in ("FLEET", "QUOTA", "JOBS")
    ]
    tasks = [asyncio.create_task(c.run(stop)) for c in consumers]
    await done.wait()
    seconds = time.perf_counter() - t0
    stop.set()
    await asyncio.gather(*tasks)
    for c in consumers:
        await c.unsubscribe()
    await nc.drain()
    return {
        "measure": "domain_events",
        "events": count,
        "seconds": round(seconds, 2),
        "folded_events_per_s": round(count / seconds),
        "path": "three runtime Consumers (the shell before the host), "
        + ("batched pull" if batched_pull else "nats-py fetch")
        + ", per-message handler + ack, scheduler evolve",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs (x3 events) for the fold rate")
    args = parser.parse_args()
    configure_logging("error", json=True)
    for batched_pull in (False, True):
        with tempfile.TemporaryDirectory() as tmp, NatsServerProcess(Path(tmp) / "js") as server:
            print(json.dumps(asyncio.run(measure(server.url, args.messages, args.batch, batched_pull))), flush=True)
    for batched_pull in (False, True):
        with tempfile.TemporaryDirectory() as tmp, NatsServerProcess(Path(tmp) / "js") as server:
            print(json.dumps(asyncio.run(fold_rate_consumers(server.url, args.jobs, batched_pull))), flush=True)
    with tempfile.TemporaryDirectory() as tmp, NatsServerProcess(Path(tmp) / "js") as server:
        print(json.dumps(asyncio.run(fold_rate(server.url, args.jobs))), flush=True)


if __name__ == "__main__":
    main()
