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
The query's threads run at `--nice` (the engine's `os_thread_priority`, only where the process may
renice: CAP_SYS_NICE) and, with `--sched idle` (not the recorder's default), under SCHED_IDLE while it
runs; the query also runs at the engine priority below the writer's (`priority`: the engine pauses it
while an insert runs; `--no-yield` turns that off). Quiet and heavy rounds alternate (`--rounds`
pairs, quiet first), so a change in the machine's load falls on both of a pair; `ratio` is the median
over the pairs of heavy over quiet (the target: >= 0.9, wall clock), `pair_ratios` each pair's.
`--compare yield,nice,idle` compares ways of running the query in one run: a quiet round, then each
one's heavy round after a quiet round, `--rounds` times, and a last quiet one; each heavy round over
the mean of the quiet rounds either side of it (`ratio_by_variant`). yield: the recorder's default;
nice: without the engine priority; idle: nice and SCHED_IDLE, without the engine priority.
Where the CPU went over each round's timed part, in CPUs (`cpus_used`): ingest (this process's
threads but the query's), the query's threads, nats-server, and `others`: every other process on
the machine. A round where `others` is high measured the machine's load, not the query's cost. The
CPU-normalised rate, GPU samples per CPU second of ingest (this process and nats-server), is less
moved by other processes; `ratio_per_ingest_cpu` is its median pair ratio: below 1, the query made
ingest's own work slower (shared caches, locks), while the wall-clock ratio also counts the CPU time
ingest did not get. `ingest_wait_ms_per_1k` is how long ingest's threads were runnable but waited
for a CPU (the kernel's schedstat), per 1,000 node samples: a query that delays ingest raises it.
Prints one JSON object. Run: `python bench/sql_isolation.py --messages 50000 --rounds 4` (a few minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

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

TICK = os.sysconf("SC_CLK_TCK")
SCHED_IDLE = 5


def _stat_fields(path: str) -> list[str] | None:
    try:
        with open(path) as f:
            text = f.read()
    except OSError:  # the thread or process ended
        return None
    return text[text.rindex(")") + 2 :].split()


class CpuWatch:
    """CPU seconds while `timing` is set, sampled every `every_s`: this process's threads split into the
    heavy query's (nice > 0 or SCHED_IDLE: what the engine and the door set on them) and ingest's (all
    others), nats-server's, and the rest of the machine's (other processes; steal apart); and how long
    ingest's threads waited for a CPU while runnable (schedstat's run-queue delay, `ingest_wait`)."""

    def __init__(self, nats_pid: int, every_s: float = 0.2) -> None:
        self.nats_pid = nats_pid
        self.every_s = every_s
        self.timing = threading.Event()
        self.totals = dict.fromkeys(("ingest", "query", "nats", "others", "steal", "ingest_wait", "wall"), 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-watch", daemon=True)

    def _sample(self) -> tuple[float, dict[int, tuple[int, bool, int]], int, tuple[int, int]]:
        threads: dict[int, tuple[int, bool, int]] = {}
        task_dir = f"/proc/{os.getpid()}/task"
        for tid in os.listdir(task_dir):
            f = _stat_fields(f"{task_dir}/{tid}/stat")
            try:
                with open(f"{task_dir}/{tid}/schedstat") as fh:
                    waited_ns = int(fh.read().split()[1])
            except (OSError, IndexError):
                waited_ns = 0
            if f is not None:
                threads[int(tid)] = (int(f[11]) + int(f[12]), int(f[16]) > 0 or int(f[38]) == SCHED_IDLE, waited_ns)
        nats = _stat_fields(f"/proc/{self.nats_pid}/stat")
        with open("/proc/stat") as fh:
            cpu = [int(x) for x in fh.readline().split()[1:]]
        busy = sum(cpu[:8]) - cpu[3] - cpu[4] - cpu[7]  # user nice system irq softirq (idle, iowait, steal out)
        return time.perf_counter(), threads, int(nats[11]) + int(nats[12]) if nats else 0, (busy, cpu[7])

    def _run(self) -> None:
        last = self._sample()
        while not self._stop.wait(self.every_s):
            now = self._sample()
            if self.timing.is_set():
                t0, threads0, nats0, (busy0, steal0) = last
                t1, threads1, nats1, (busy1, steal1) = now
                own = 0
                for tid, (ticks, query, waited) in threads1.items():
                    before = threads0.get(tid, (0, False, 0))
                    delta = ticks - before[0]
                    self.totals["query" if query else "ingest"] += delta / TICK
                    own += delta
                    if not query:
                        self.totals["ingest_wait"] += (waited - before[2]) / 1e9
                self.totals["nats"] += (nats1 - nats0) / TICK
                self.totals["others"] += (busy1 - busy0 - own - (nats1 - nats0)) / TICK
                self.totals["steal"] += (steal1 - steal0) / TICK
                self.totals["wall"] += t1 - t0
            last = now

    def __enter__(self) -> CpuWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


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


async def one_round(
    url: str, data_dir: Path, n: int, *, heavy: bool, limits: Limits, watch: CpuWatch
) -> dict[str, object]:
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
        if first_fetch and not watch.timing.is_set():
            watch.timing.set()
        await asyncio.sleep(0.01)
    watch.timing.clear()
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
        # CPUs used on average over the timed part (ingest: this process less the query's threads)
        "cpus_used": {
            k: round(v / watch.totals["wall"], 2) for k, v in watch.totals.items() if k not in ("wall", "ingest_wait")
        },
        # ms ingest's threads waited for a CPU while runnable, per 1,000 node samples stored
        "ingest_wait_ms_per_1k": round(watch.totals["ingest_wait"] * 1e6 / n, 1),
        # the CPU-normalised rate: GPU samples per CPU second of ingest (this process and nats-server)
        "gpu_samples_per_ingest_cpu_s": round(n * ingest_bench.GPUS / (watch.totals["ingest"] + watch.totals["nats"])),
        "heavy_queries": outcomes,
    }


# `--compare`: how each heavy variant runs the query (the Limits it changes)
VARIANTS: dict[str, dict[str, bool]] = {
    "yield": {"idle": False, "yield_to_ingest": True},
    "nice": {"idle": False, "yield_to_ingest": False},
    "idle": {"idle": True, "yield_to_ingest": False},
}


def compare_variants(rounds: list[dict[str, Any]]) -> dict[str, object]:
    """`--compare`: each heavy round over the mean of the quiet rounds either side of it."""
    by: dict[str, dict[str, list[float]]] = {}
    for i, r in enumerate(rounds):
        if r["variant"] != "quiet":
            ratios = by.setdefault(r["variant"], {"wall": [], "cpu": []})
            for key, field in (("wall", "gpu_samples_per_s"), ("cpu", "gpu_samples_per_ingest_cpu_s")):
                quiet = (rounds[i - 1][field] + rounds[i + 1][field]) / 2
                ratios[key].append(round(r[field] / quiet, 3))
    return {
        "ratio_by_variant": {k: round(statistics.median(v["wall"]), 3) for k, v in by.items()},
        "pair_ratios_by_variant": {k: v["wall"] for k, v in by.items()},
        "ratio_per_ingest_cpu_by_variant": {k: round(statistics.median(v["cpu"]), 3) for k, v in by.items()},
        "pair_ratios_per_ingest_cpu_by_variant": {k: v["cpu"] for k, v in by.items()},
        "others_cpus": [r["cpus_used"]["others"] for r in rounds],
        "ingest_wait_ms_per_1k": [r["ingest_wait_ms_per_1k"] for r in rounds],
        "target_ratio": 0.9,
        "cpus": os.cpu_count() or 0,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10_000, help="node samples (8 GPUs each) per round")
    parser.add_argument("--rounds", type=int, default=2, help="quiet rounds and heavy rounds, alternating (2)")
    parser.add_argument("--query-threads", type=int, default=0, help="threads of the heavy query (0: the default)")
    parser.add_argument("--query-time-limit", type=int, default=5, help="seconds each heavy query runs (5)")
    parser.add_argument("--nice", type=int, default=Limits().nice, help=f"the query threads' nice ({Limits().nice})")
    parser.add_argument(
        "--sched",
        choices=["idle", "nice"],
        default="idle" if Limits().idle else "nice",
        help="idle: the query's threads also run under SCHED_IDLE; nice: only reniced",
    )
    parser.add_argument(
        "--no-yield", action="store_true", help="the query does not run at the engine priority below the writer's"
    )
    parser.add_argument(
        "--compare",
        default="",
        help=f"heavy variants to compare in one run, comma-separated ({', '.join(VARIANTS)}): quiet, then each "
        "variant after a quiet round, `--rounds` times, and a last quiet one",
    )
    args = parser.parse_args()
    configure_logging("error")
    limits = Limits(
        max_execution_time_s=args.query_time_limit,
        max_threads=args.query_threads,
        nice=args.nice,
        idle=args.sched == "idle",
        yield_to_ingest=not args.no_yield,
    )
    variants = [v for v in args.compare.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; pick from {', '.join(VARIANTS)}")
    kinds = [k for v in variants for k in ("quiet", v)] * args.rounds + ["quiet"] if variants else []
    out: dict[str, object] = {"load_average_1m_at_start": round(os.getloadavg()[0], 2), "rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(len(kinds) or args.rounds * 2):
            heavy = kinds[i] != "quiet" if kinds else i % 2 == 1
            if kinds and heavy:
                limits = replace(limits, **VARIANTS[kinds[i]])
            server = NatsServerProcess(Path(tmp) / f"nats-{i}")
            server.start()
            try:
                assert server.proc is not None
                with CpuWatch(server.proc.pid) as watch:
                    result = asyncio.run(
                        one_round(
                            server.url, Path(tmp) / f"wh-{i}", args.messages, heavy=heavy, limits=limits, watch=watch
                        )
                    )
            finally:
                server.stop()
            result["variant"] = kinds[i] if kinds else "heavy" if heavy else "quiet"
            out["rounds"].append(result)  # type: ignore[attr-defined]
    rounds: list[dict[str, object]] = out["rounds"]  # type: ignore[assignment]
    if kinds:
        print(json.dumps({**out, **compare_variants(rounds), "messages": args.messages, "heavy_query": HEAVY}))
        return
    rates = [int(r["gpu_samples_per_s"]) for r in rounds]  # type: ignore[call-overload]
    quiet, loaded = statistics.median(rates[0::2]), statistics.median(rates[1::2])
    pairs = [round(h / q, 3) for q, h in zip(rates[0::2], rates[1::2], strict=True)]
    per_cpu = [int(r["gpu_samples_per_ingest_cpu_s"]) for r in rounds]  # type: ignore[call-overload]
    cpu_pairs = [round(h / q, 3) for q, h in zip(per_cpu[0::2], per_cpu[1::2], strict=True)]
    out.update(
        {
            "messages": args.messages,
            "quiet_gpu_samples_per_s": round(quiet),
            "heavy_gpu_samples_per_s": round(loaded),
            "ratio": round(statistics.median(pairs), 3),
            "pair_ratios": pairs,
            "others_cpus": [r["cpus_used"]["others"] for r in rounds],  # type: ignore[index]
            "ratio_per_ingest_cpu": round(statistics.median(cpu_pairs), 3),
            "pair_ratios_per_ingest_cpu": cpu_pairs,
            "ingest_wait_ms_per_1k": [r["ingest_wait_ms_per_1k"] for r in rounds],
            "target_ratio": 0.9,
            "heavy_query": HEAVY,
            "query_threads": limits.settings()["max_threads"],
            "query_time_limit_s": limits.max_execution_time_s,
            "query_nice": limits.nice,
            "query_sched": args.sched,
            "query_yields_to_ingest": limits.yield_to_ingest,
            "cpus": os.cpu_count() or 0,
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        }
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
