"""Warehouse ingest and query speed on this machine, with the samples the agent really publishes.

The messages are built by the simulated agent's own code (`SimFleet` nodes read through `NodeRunner`:
the compact wire form, the slow fields every minute or on change), 125 nodes x 8 H100s, a job on every
GPU. Two cases, each in its own nats-server and warehouse:
- typical: that fleet as it runs;
- worst: every GPU has NVLink errors on every link, all 18 counting every interval (each listed in
  the samples that carry per-link counters, once a minute; the others carry the per-GPU totals).
For each: 1. end to end: published to TELEMETRY, then consumed by the recorder's consumers (fetch, bulk
decode into Arrow columns, chDB insert, ack) until all are stored, timed from the first pull request;
the minute rollups recomputed in rounds as the recorder does (`--rollups per-batch`: after every
batch), with the closing round that rolls up what is left timed apart (`last_rollup_round_s`);
2. the ceiling: the same messages through the same pull consumer path (the same number of consumers,
fetch + ack per message), without decoding or storing. `ratio` is 1. over 2.
3. The fleet efficiency query over 24 h of a 1,000-GPU fleet (one sample per GPU per minute, jobs
holding about half the GPUs), repeated; p50 and p95.
Prints one JSON object. Short run: `python bench/ingest.py --skip-query` (about a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import pyarrow as pa
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from events.telemetry import NodeSample, NvLinkCounters
from node_agent.detectors import Reading
from node_agent.runner import NodeFacts, NodeRunner
from node_agent.sim.fleet import SimFleet, SimNode
from node_agent.sim.models import gpu_model
from node_agent.spool import Kind, Record
from node_agent.wire import old_form_body
from services.recorder.rows import TS
from services.recorder.samples import FETCH_MAX_BYTES, SampleConsumer
from services.recorder.service import setup_recorder
from services.recorder.writer import Writer
from services.runtime import ConsumerOptions, connect, ensure_streams
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess
from services.warehouse import migrate
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.efficiency import efficiency_sql
from services.warehouse.rollup import insert_samples

GPUS = 8
NODES = 125


class EveryLinkErrors:
    """The worst case: a simulated node whose GPUs count errors on every NVLink link, every interval."""

    def __init__(self, node: SimNode) -> None:
        self.node = node

    def read(self, cluster: str, seq: int, now: float, interval_s: float) -> Reading:
        reading = self.node.read(cluster, seq, now, interval_s)
        gpus = [
            msgspec.structs.replace(
                g,
                nvlink=[
                    NvLinkCounters(
                        link=i,
                        crc_flit_errors=1000 + seq * 3 + i,
                        crc_data_errors=seq + i,
                        replay_errors=seq + 1,
                        recovery_errors=1 + i,
                    )
                    for i in range(self.node.model.nvlink_links)
                ],
            )
            for g in reading.sample.gpus
        ]
        return Reading(msgspec.structs.replace(reading.sample, gpus=gpus), reading.xids, reading.lost_gpus)

    def inventory_gpus(self):  # type: ignore[no-untyped-def]
        return self.node.inventory_gpus()

    def limits(self):  # type: ignore[no-untyped-def]
        return self.node.limits()


def agent_samples(n: int, now: float, *, worst: bool, old_form: bool = False) -> tuple[list[Record], int]:
    """n node-sample records as the simulated agent publishes them (one interval of every node after
    another), and the size the first one would have had in the old full form. `old_form`: the bodies
    as agents sent them before the compact form (the "before" of the README's table)."""
    fleet = SimFleet(seed=1, nodes=NODES, gpus_per_node=GPUS, model=gpu_model("H100-80GB"), prefix="bench")
    fleet.assign({name: {g: f"job-{name}-{g}" for g in range(GPUS)} for name in fleet.nodes})
    runners = [
        NodeRunner("bench", name, EveryLinkErrors(node) if worst else node, NodeFacts(simulated=True), source="bench")
        for name, node in fleet.nodes.items()
    ]
    if old_form:
        for runner in runners:
            runner.wire = lambda sample: sample  # type: ignore[assignment,method-assign,return-value]
    out: list[Record] = []
    start = now - 3600
    tick = 0
    while len(out) < n:
        for runner in runners:
            out.extend(r for r in runner.tick(start + tick, 1.0) if r.kind == Kind.SAMPLE)
        tick += 1
    if old_form:
        out = [
            msgspec.structs.replace(r, body=old_form_body(msgspec.json.decode(r.body, type=NodeSample)))
            for r in out[:n]
        ]
    first = runners[0].sampler.read("bench", 0, start, 1.0).sample
    return out[:n], len(old_form_body(first))


async def publish(js: JetStreamContext, records: list[Record], window: int = 1000) -> None:
    futures: list[asyncio.Future[object]] = []
    for r in records:
        futures.append(await js.publish_async(r.subject, r.body, headers=r.headers))
        if len(futures) >= window:
            await asyncio.gather(*futures)
            futures.clear()
    await asyncio.gather(*futures)


async def end_to_end(
    url: str,
    data_dir: Path,
    n: int,
    batch: int,
    consumers: int,
    fetch_max_bytes: int,
    *,
    worst: bool,
    old_form: bool = False,
    rollups: str = "deferred",
) -> dict[str, object]:
    nc = await connect(url, name="bench")
    js = nc.jetstream()
    await ensure_streams(js)
    records, old_size = agent_samples(n, time.time(), worst=worst, old_form=old_form)
    sizes = [len(r.body) for r in records]
    await publish(js, records)
    del records  # a running recorder holds no such list; keeping it would slow the garbage collector
    raw_s = await raw_consume(nc, js, n, batch, consumers, fetch_max_bytes)

    warehouse = ChdbWarehouse(data_dir)
    migrate(warehouse)
    writer = TimedWriter(warehouse, deferred_rollups=rollups == "deferred")
    stop = asyncio.Event()
    holder: list[ServiceContext] = []

    first_fetch: list[float] = []

    async def setup(ctx: ServiceContext) -> None:
        holder.append(ctx)
        await setup_recorder(
            ctx,
            writer,
            batch_size=batch,
            flush_interval=1.0,
            telemetry_consumers=consumers,
            fetch_max_bytes=fetch_max_bytes,
        )
        for consumer in ctx.consumers:  # the clock starts when the first pull request goes out
            if consumer.options.stream == "TELEMETRY":
                consumer.fetch = _timed(consumer.fetch, first_fetch)  # type: ignore[method-assign]

    t0 = time.perf_counter()
    task = asyncio.create_task(serve("recorder", url, setup, stop))
    while not holder or _telemetry_handled(holder[0]) < n:  # a runtime counter, no event to wait on
        if task.done():
            task.result()  # the recorder failed: raise its error instead of waiting forever
            raise RuntimeError("the recorder stopped before storing every sample")
        await asyncio.sleep(0.01)
    e2e_s = writer.last_end - first_fetch[0]  # from the first pull request, not process start
    startup_s = first_fetch[0] - t0
    round_s = 0.0
    if writer.rollups is not None:  # what the periodic rounds did not cover yet, timed
        rounds = writer.rollups
        t1 = time.perf_counter()
        await writer.call(lambda: rounds.run(settle_s=0.0))
        round_s = time.perf_counter() - t1
    stop.set()
    await task
    stored = warehouse.count("gpu_samples")
    rolled_up = int(warehouse.query("SELECT sum(samples) FROM gpu_minute").scalar() or 0)
    writer.close()
    warehouse.close()
    await nc.close()
    return {
        "case": ("worst" if worst else "typical") + (", old form" if old_form else ""),
        "messages": n,
        "message_bytes": round(statistics.mean(sizes)),
        "message_bytes_max": max(sizes),
        "message_bytes_old_form": old_size,
        "gpu_samples_stored": stored,
        "gpu_samples_per_s": round(n * GPUS / e2e_s),
        "rollups": rollups,
        "last_rollup_round_s": round(round_s, 3),
        "gpu_samples_per_s_incl_last_round": round(n * GPUS / (e2e_s + round_s)),
        "gpu_samples_rolled_up": rolled_up,
        "raw_consume_gpu_samples_per_s": round(n * GPUS / raw_s),
        "raw_consume_msgs_per_s": round(n / raw_s),
        "e2e_msgs_per_s": round(n / e2e_s),
        "telemetry_consumers": consumers,
        "recorder_startup_s": round(startup_s, 2),
        # CPU of this process (consume, decode, columns, chDB insert) per GPU sample: steadier than
        # wall-clock rates on a shared machine.
        "recorder_cpu_us_per_gpu_sample": round((writer.last_cpu - writer.first_cpu) * 1e6 / (n * GPUS), 2),
        "ratio": round(raw_s / e2e_s, 3),
    }


async def raw_consume(
    nc: Client, js: JetStreamContext, n: int, batch: int, consumers: int, fetch_max_bytes: int
) -> float:
    """Seconds for `consumers` pull consumers (the recorder's fetch, on their own durable) to fetch and
    ack all n messages, without decoding or storing: the ceiling of the consume path."""
    options = ConsumerOptions(stream="TELEMETRY", durable="raw", batch=batch)
    pullers = [
        SampleConsumer(js, options, nc=nc, batch_handler=_noop, table_handler=_noop, fetch_max_bytes=fetch_max_bytes)
        for _ in range(consumers)
    ]
    for puller in pullers:
        await puller.start()
    seen = 0

    async def pull(puller: SampleConsumer) -> None:
        nonlocal seen
        while seen < n:
            msgs = await puller.fetch()
            for msg in msgs:
                await msg.ack()
            seen += len(msgs)

    t0 = time.perf_counter()
    await asyncio.gather(*(pull(p) for p in pullers))
    raw_s = time.perf_counter() - t0
    for puller in pullers:
        await puller.unsubscribe()
    return raw_s


def _timed(fetch: Callable[[], Awaitable[list[Msg]]], first: list[float]) -> Callable[[], Awaitable[list[Msg]]]:
    async def timed() -> list[Msg]:
        if not first:
            first.append(time.perf_counter())
        return await fetch()

    return timed


class TimedWriter(Writer):
    """Times the stores: the end of the last one, and the process CPU from the first to the last."""

    first_start = 0.0
    last_end = 0.0
    first_cpu = 0.0
    last_cpu = 0.0

    async def store_tables(self, tables: dict[str, pa.Table], *, suspect: bool) -> None:
        if not self.first_start:
            self.first_start, self.first_cpu = time.perf_counter(), time.process_time()
        await super().store_tables(tables, suspect=suspect)
        self.last_end, self.last_cpu = time.perf_counter(), time.process_time()


def _telemetry_handled(ctx: ServiceContext) -> int:
    return sum(c.stats.handled for c in ctx.consumers if c.options.stream == "TELEMETRY")


async def _noop(*_: object) -> None:
    return None


def efficiency_query(data_dir: Path, repeats: int) -> dict[str, float]:
    """24 h x 1,000 GPUs at one sample per minute (1.44 M raw rows), 2,000 job intervals."""
    warehouse = ChdbWarehouse(data_dir)
    migrate(warehouse)
    until = float(int(time.time()) // 60 * 60)
    since = until - 86400
    nodes, per_node, minutes = 125, 8, 1440
    total = nodes * per_node * minutes
    import numpy as np

    idx = np.arange(total)
    minute = idx // (nodes * per_node)
    gpu = idx % (nodes * per_node)
    table = pa.table(
        {
            "cluster": pa.array(["bench"] * total).dictionary_encode(),
            "node": pa.array([f"node-{g // per_node:03d}" for g in gpu]),
            "gpu_index": pa.array(gpu % per_node, pa.uint16()),
            "gpu_uuid": pa.array([""] * total),
            "ts": pa.array(((since + minute * 60) * 1000).astype("int64"), TS),
            "interval_s": pa.array(np.full(total, 60.0, dtype="float32")),
            "seq": pa.array(minute.astype("uint64")),
            "utilization_pct": pa.array(((idx * 7) % 100).astype("float32")),
            "event_id": pa.array([""] * total),
        }
    ).cast(
        pa.schema(
            [
                ("cluster", pa.string()),
                ("node", pa.string()),
                ("gpu_index", pa.uint16()),
                ("gpu_uuid", pa.string()),
                ("ts", TS),
                ("interval_s", pa.float32()),
                ("seq", pa.uint64()),
                ("utilization_pct", pa.float32()),
                ("event_id", pa.string()),
            ]
        )
    )
    t0 = time.perf_counter()
    insert_samples(warehouse, table)
    insert_s = time.perf_counter() - t0
    # Jobs: 2,000 intervals of 4 GPUs, each held for 6 h, spread over the day and the fleet.
    jobs = []
    for j in range(2000):
        node = (j * 7) % nodes
        start = since + (j % 4) * 21600
        gpus = [
            {"cluster": "bench", "node": f"node-{node:03d}", "gpu_index": (j // nodes) % 2 * 4 + k} for k in range(4)
        ]
        for kind, at in (("submitted", start - 300), ("scheduled", start), ("completed", start + 21600)):
            jobs.append(
                {
                    "event_id": f"{j}-{kind}",
                    "job_id": f"j{j}",
                    "kind": kind,
                    "at": int(at * 1000),
                    "stream_seq": len(jobs),
                    "team": f"team-{j % 10}",
                    "gpus_requested": 4,
                    "gpus": gpus if kind == "scheduled" else [],
                }
            )
    job_table = pa.Table.from_pylist(
        jobs,
        schema=pa.schema(
            [
                ("event_id", pa.string()),
                ("job_id", pa.string()),
                ("kind", pa.string()),
                ("at", TS),
                ("stream_seq", pa.uint64()),
                ("team", pa.string()),
                ("gpus_requested", pa.uint32()),
                (
                    "gpus",
                    pa.list_(pa.struct([("cluster", pa.string()), ("node", pa.string()), ("gpu_index", pa.uint16())])),
                ),
            ]
        ),
    )
    warehouse.insert("job_events", job_table)
    sql = efficiency_sql(since, until)
    timings = []
    result = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = warehouse.query(sql)
        timings.append((time.perf_counter() - t0) * 1000)
    assert result is not None
    fleet = result.as_dicts()[0]
    warehouse.close()
    timings.sort()
    return {
        "efficiency_raw_rows": total,
        "efficiency_insert_rows_per_s": round(total / insert_s),
        "efficiency_query_p50_ms": round(statistics.median(timings), 1),
        "efficiency_query_p95_ms": round(timings[min(len(timings) - 1, int(0.95 * len(timings)))], 1),
        "efficiency_capacity_gpu_hours": round(fleet["capacity_gpu_hours"], 1),
        "efficiency_allocation_ratio": round(fleet["allocation_ratio"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000, help="node samples (8 GPUs each) per case")
    parser.add_argument("--batch", type=int, default=2000, help="recorder fetch batch, in messages")
    parser.add_argument(
        "--fetch-max-bytes", type=int, default=FETCH_MAX_BYTES, help="recorder fetch batch, in bytes (the default)"
    )
    parser.add_argument("--case", choices=("typical", "worst", "both"), default="both")
    parser.add_argument(
        "--old-form", action="store_true", help="publish the samples in the old full form (before compaction)"
    )
    parser.add_argument("--repeats", type=int, default=20, help="efficiency query runs")
    parser.add_argument("--consumers", type=int, default=3, help="recorder pull consumers on TELEMETRY")
    parser.add_argument("--skip-query", action="store_true", help="measure ingest only")
    parser.add_argument(
        "--rollups",
        choices=("deferred", "per-batch"),
        default="deferred",
        help="minute rollups recomputed in rounds, as the recorder does (default), or after every batch",
    )
    args = parser.parse_args()
    configure_logging("error")
    # Other processes on the machine change every rate here: say how busy it was.
    out: dict[str, object] = {"cases": [], "load_average_1m_at_start": round(os.getloadavg()[0], 2)}
    if args.skip_query:
        args.repeats = 0
    cases = ["typical", "worst"] if args.case == "both" else [args.case]
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            server = NatsServerProcess(Path(tmp) / f"nats-{case}")
            server.start()
            try:
                result = asyncio.run(
                    end_to_end(
                        server.url,
                        Path(tmp) / f"ingest-{case}",
                        args.messages,
                        args.batch,
                        args.consumers,
                        args.fetch_max_bytes,
                        worst=case == "worst",
                        old_form=args.old_form,
                        rollups=args.rollups,
                    )
                )
            finally:
                server.stop()
            out["cases"].append(result)  # type: ignore[attr-defined]
        if args.repeats:
            out.update(efficiency_query(Path(tmp) / "query", args.repeats))
    out["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    out["cpus"] = os.cpu_count() or 0
    out["batch"] = args.batch
    out["fetch_max_bytes"] = args.fetch_max_bytes
    out["target_gpu_samples_per_s"] = 100_000
    out["target_ratio"] = 0.9
    print(json.dumps(out))


if __name__ == "__main__":
    main()
