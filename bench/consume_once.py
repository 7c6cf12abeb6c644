"""One consume measurement against a filled nats-server, with the runtime of a given checkout.

`bench/runtime.py` fills a server once, then runs this script once per checkout (`--code`: this one,
and with `--before DIR` another, e.g. `git archive <commit> | tar -x -C DIR`), alternating, so the
before and after figures come from the same run on the same data and the same machine load.
Prints one JSON object:
- `domain_events`: the scheduler's manifest on the decider host folds FLEET, QUOTA, JOBS and
  BILLING from the start until caught up (batched pull, merge, decode, the scheduler's `evolve`);
- `node_samples`: an ephemeral runtime Consumer (batched pull, decode, per-message handler and ack)
  reads every TELEMETRY message.
`cpu_s` is this process's CPU time over the measurement: a figure less moved by other work on the
machine than the wall-clock rate (the nats-server's CPU is not in it). `steady_*`: the same between
10 % and 90 % of the fold, without the start and the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any


async def domain_events(url: str) -> dict[str, object]:
    import dataclasses

    from services.runtime import connect
    from services.runtime.decider import DeciderHost
    from services.runtime.host import ServiceContext, serve
    from services.scheduler.service import Scheduler

    args = argparse.Namespace(
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

    nc = await connect(url, name="bench-count")
    js = nc.jetstream()
    total = sum([(await js.stream_info(s)).state.messages for s in ("FLEET", "QUOTA", "JOBS", "BILLING")])
    await nc.drain()
    task = asyncio.create_task(serve("scheduler", url, setup, stop, health_port=None))
    await installed.wait()
    cpu0 = time.process_time()
    window = asyncio.create_task(steady_window(hosts[0], total))
    await hosts[0].caught_up_event.wait()
    cpu_s = time.process_time() - cpu0
    seconds = hosts[0].stats.ready_after_s or 0.0  # from the host's start: connect excluded
    folded = hosts[0].stats.folded
    stop.set()
    await task
    steady = await window
    return {
        "measure": "domain_events",
        "events": folded,
        "seconds": round(seconds, 3),
        "events_per_s": round(folded / seconds),
        "cpu_s": round(cpu_s, 3),
        "events_per_cpu_s": round(folded / cpu_s),
        **steady,
    }


async def steady_window(host: Any, total: int) -> dict[str, object]:
    """The fold rate between 10 % and 90 % of the events folded: the steady rate, without the start
    (consumers opened) and the end (caught-up checks, the collector's pass before ready)."""
    marks: list[tuple[int, float, float]] = []
    for share in (0.1, 0.9):
        while host.stats.folded < share * total:  # noqa: ASYNC110 - the host signals no count
            await asyncio.sleep(0.002)
        marks.append((host.stats.folded, time.perf_counter(), time.process_time()))
    (n0, t0, c0), (n1, t1, c1) = marks
    return {
        "steady_events_per_s": round((n1 - n0) / (t1 - t0)),
        "steady_events_per_cpu_s": round((n1 - n0) / (c1 - c0)),
    }


async def node_samples(url: str, batch: int) -> dict[str, object]:
    from services.runtime import Consumer, ConsumerOptions, Delivery, connect

    nc = await connect(url, name="bench-consume")
    js = nc.jetstream()
    total = (await js.stream_info("TELEMETRY")).state.messages
    if not total:  # TELEMETRY keeps 15 minutes: a server filled longer ago has nothing left
        raise SystemExit("TELEMETRY is empty: fill the server again")
    done = asyncio.Event()
    count = 0

    async def handle(delivery: Delivery) -> None:
        nonlocal count
        count += 1
        if count == total:
            done.set()

    consumer = Consumer(js, ConsumerOptions(stream="TELEMETRY", durable=None, batch=batch), handler=handle, nc=nc)
    await consumer.start()
    stop = asyncio.Event()
    t0, cpu0 = time.perf_counter(), time.process_time()
    task = asyncio.create_task(consumer.run(stop))
    await done.wait()
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    stop.set()
    await task
    await consumer.unsubscribe()
    await nc.drain()
    return {
        "measure": "node_samples",
        "events": count,
        "seconds": round(seconds, 3),
        "events_per_s": round(count / seconds),
        "cpu_s": round(cpu_s, 3),
        "events_per_cpu_s": round(count / cpu_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--code", type=Path, required=True, help="the checkout whose runtime is measured")
    parser.add_argument("--url", required=True)
    parser.add_argument("--measure", choices=("domain_events", "node_samples"), required=True)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    sys.path.insert(0, str(args.code.resolve()))
    from services.runtime.logs import configure_logging

    configure_logging("error", json=True)
    if args.measure == "domain_events":
        result = asyncio.run(domain_events(args.url))
    else:
        result = asyncio.run(node_samples(args.url, args.batch))
    import services.runtime.decider as decider  # which checkout's runtime this was, to be sure

    print(json.dumps({**result, "code": str(Path(decider.__file__).parents[2])}), flush=True)


if __name__ == "__main__":
    main()
