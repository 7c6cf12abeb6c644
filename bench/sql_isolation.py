"""Ingest rate with and without a heavy analytics query running at the same time.

The recorder as it runs (`setup_recorder`: its TELEMETRY consumers, the bulk decode, the writer's
chDB session, the analytics door with its own session and slot) stores node samples the simulated
agent's own code builds (bench/ingest.py's typical fleet: 125 nodes x 8 H100s). Each round publishes
`--messages` samples to a fresh nats-server, then times the recorder from its first pull request to
the last sample stored:
- quiet: nothing else runs;
- heavy: a client keeps one heavy query in the recorder's door all the time, over the real request
  path (`chamber.cmd.recorder.sql`), each one running until the query time limit stops it (5 s
  here, `--query-time-limit`, so a round ends soon after its last sample; the next query follows at
  once, so the load does not pause).
Quiet and heavy rounds alternate (`--rounds` pairs, quiet first), so a change in the machine's load
falls on both of a pair; `ratio` is the median over the pairs of heavy over quiet (the target:
>= 0.9), `pair_ratios` each pair's. Prints one JSON object.
Run: `python bench/sql_isolation.py` (about two minutes).
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ingest as ingest_bench  # bench/ingest.py: the agent's samples, the timed writer

from services.recorder.service import setup_recorder
from services.runtime import connect, ensure_streams
from services.runtime.commands import CommandRefused, CommandUnavailable, request
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess
from services.warehouse import migrate
from services.warehouse.analytics import Limits
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.door import open_door

# CPU-bound until the time limit stops it: hashes a trillion numbers, reads no table.
HEAVY = "SELECT count() FROM numbers(1000000000000) WHERE cityHash64(number) % 7 = 3"


async def heavy_client(url: str, stop: asyncio.Event, outcomes: list[str]) -> None:
    """Keep one heavy query in the recorder's door until `stop`; note how each one ended."""
    nc = await connect(url, name="bench-heavy")
    try:
        while not stop.is_set():
            try:
                await request(nc, "recorder", "sql", {"sql": HEAVY, "max_rows": 1}, timeout=60)
                outcomes.append("answered")
            except CommandRefused as exc:
                outcomes.append("time limit" if "time limit" in str(exc) else str(exc)[:80])
            except CommandUnavailable:
                await asyncio.sleep(0.05)  # the recorder's command server is not up yet
    finally:
        await nc.close()


async def one_round(url: str, data_dir: Path, n: int, *, heavy: bool, limits: Limits) -> dict[str, object]:
    nc = await connect(url, name="bench")
    js = nc.jetstream()
    await ensure_streams(js)
    records, _ = ingest_bench.agent_samples(n, time.time(), worst=False)
    await ingest_bench.publish(js, records)
    del records
    warehouse = ChdbWarehouse(data_dir)
    migrate(warehouse)
    writer = ingest_bench.TimedWriter(warehouse, deferred_rollups=True)
    door = open_door(warehouse, limits=limits)
    stop = asyncio.Event()
    holder: list[ServiceContext] = []
    first_fetch: list[float] = []

    async def setup(ctx: ServiceContext) -> None:
        holder.append(ctx)
        await setup_recorder(ctx, writer, telemetry_consumers=3, door=door)
        for consumer in ctx.consumers:
            if consumer.options.stream == "TELEMETRY":
                consumer.fetch = ingest_bench._timed(consumer.fetch, first_fetch)  # type: ignore[method-assign,assignment]

    outcomes: list[str] = []
    heavy_stop = asyncio.Event()
    client = asyncio.create_task(heavy_client(url, heavy_stop, outcomes)) if heavy else None
    recorder = asyncio.create_task(serve("recorder", url, setup, stop))
    while not holder or ingest_bench._telemetry_handled(holder[0]) < n:
        if recorder.done():
            recorder.result()
            raise RuntimeError("the recorder stopped before storing every sample")
        await asyncio.sleep(0.01)
    seconds = writer.last_end - first_fetch[0]
    running_at_end = door.running
    heavy_stop.set()
    stop.set()
    await recorder
    if client is not None:
        client.cancel()
        await asyncio.gather(client, return_exceptions=True)
    stored = warehouse.count("gpu_samples")
    door.close()
    writer.close()
    warehouse.close()
    await nc.close()
    return {
        "heavy": heavy,
        "gpu_samples_per_s": round(n * ingest_bench.GPUS / seconds),
        "seconds": round(seconds, 2),
        "gpu_samples_stored": stored,
        "heavy_query_running_at_end": bool(running_at_end),
        "heavy_queries": outcomes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10_000, help="node samples (8 GPUs each) per round")
    parser.add_argument("--rounds", type=int, default=2, help="quiet rounds and heavy rounds, alternating (2)")
    parser.add_argument("--query-threads", type=int, default=0, help="threads of the heavy query (0: the default)")
    parser.add_argument("--query-time-limit", type=int, default=5, help="seconds each heavy query runs (5)")
    parser.add_argument("--nice", type=int, default=Limits().nice, help=f"the query threads' nice ({Limits().nice})")
    args = parser.parse_args()
    configure_logging("error")
    limits = Limits(max_execution_time_s=args.query_time_limit, max_threads=args.query_threads, nice=args.nice)
    out: dict[str, object] = {"load_average_1m_at_start": round(os.getloadavg()[0], 2), "rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds * 2):
            heavy = i % 2 == 1
            server = NatsServerProcess(Path(tmp) / f"nats-{i}")
            server.start()
            try:
                result = asyncio.run(
                    one_round(server.url, Path(tmp) / f"wh-{i}", args.messages, heavy=heavy, limits=limits)
                )
            finally:
                server.stop()
            out["rounds"].append(result)  # type: ignore[attr-defined]
    rounds: list[dict[str, object]] = out["rounds"]  # type: ignore[assignment]
    rates = [int(r["gpu_samples_per_s"]) for r in rounds]  # type: ignore[call-overload]
    quiet, loaded = statistics.median(rates[0::2]), statistics.median(rates[1::2])
    pairs = [round(h / q, 3) for q, h in zip(rates[0::2], rates[1::2], strict=True)]
    out.update(
        {
            "messages": args.messages,
            "quiet_gpu_samples_per_s": round(quiet),
            "heavy_gpu_samples_per_s": round(loaded),
            "ratio": round(statistics.median(pairs), 3),
            "pair_ratios": pairs,
            "target_ratio": 0.9,
            "heavy_query": HEAVY,
            "query_threads": limits.settings()["max_threads"],
            "query_time_limit_s": limits.max_execution_time_s,
            "query_nice": limits.nice,
            "cpus": os.cpu_count() or 0,
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        }
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
