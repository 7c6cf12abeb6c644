"""Restart cost of the deciders with N finished jobs in the log (issue 14's proof).

Starts its own nats-server, fills FLEET (--nodes nodes x 8 GPUs), QUOTA (a quota per team), JOBS
(N jobs, each submitted, scheduled with its pool, and completed: 3 events, the shape the services
write) and BILLING (what billing's own core accrues for that history, period by period: the
CostAccrued events a running billing service writes), then per service:
1. removes the service's snapshot, starts `chamber service NAME` as its own process
   (`python -m services.cli`) and times it until it logs that it caught up (`first_start_*`: a full
   replay; `--parallel K` runs K services' full replays at once), stops it (a decider host saves
   its snapshot on the way out);
2. starts it again, alone, and times it to caught up (`restart_to_ready_s`), then reads its
   resident memory (`rss_mb`, /proc VmRSS).
Each start also reports `cpu_s` (the process's user + system CPU seconds until ready: on a shared
machine wall time counts the neighbours, CPU time does not), `host_s` (the host's own time to
caught up, after the interpreter and imports), `folded` and `snapshot_bytes`.
`--code DIR` runs the services from another checkout (`git archive COMMIT | tar -x -C DIR`) for the
"before" figures. `--store DIR` keeps the filled JetStream store in DIR/n<N>-nodes<M> and reuses it
on the next run (a 1,000,000-job fill is 4 M events: fill once, measure often); `--fast-fill`
publishes the same envelopes with one ack per 2,000. The history ends an hour before the fill, so
billing has no years of periods to catch up with.
Prints one JSON object per service and N.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events import (
    GpuInfo,
    JobCompleted,
    JobScheduled,
    JobSpec,
    JobSubmitted,
    NodeDiscovered,
    Placement,
    TeamQuotaSet,
    encode,
    subject_for,
)
from events.codec import stable_id
from services.billing import core as billing
from services.runtime import Publisher, connect, ensure_streams
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess
from services.runtime.snapshots import SnapshotStore

ROOT = Path(__file__).resolve().parents[1]
READY_LINES = ("caught up", "state rebuilt from the log", "caught up with the log")  # host, and older shells
TEAMS = 10


Item = tuple[object, str | None, float]


async def publish_fast(nc: Any, js: Any, items: Iterator[Item], every: int = 2000) -> None:
    """The same envelopes (`events.encode`, with their ids), published without a span and without
    waiting for each ack: every `every` messages one acked publish is awaited (JetStream stores a
    connection's messages in order, so its ack means the ones before it are stored too)."""
    last: tuple[str, bytes, dict[str, str]] | None = None
    for n, (event, event_id, when) in enumerate(items, 1):
        if last is not None:
            await nc.publish(last[0], last[1], headers=last[2])
        headers, body = encode(event, source="bench/restart", id=event_id, time=when)  # type: ignore[arg-type]
        last = (subject_for(event), body, headers)  # type: ignore[arg-type]
        if n % every == 0:
            await js.publish(*last[:2], headers=last[2], timeout=60.0)
            last = None
    if last is not None:  # the last one acked: everything before it is stored
        await js.publish(*last[:2], headers=last[2], timeout=60.0)


async def fill(url: str, jobs: int, nodes: int, fast: bool = False) -> dict[str, float]:
    nc = await connect(url, name="bench-fill")
    js = nc.jetstream()
    await ensure_streams(js)
    pub = Publisher(js, source="bench/restart")
    t0 = time.perf_counter()
    base = time.time() - jobs * 0.5 - 3600.0  # the history ends an hour ago
    if fast:
        await publish_fast(nc, js, history(jobs, nodes, base))
    else:
        await pub.publish_many(history(jobs, nodes, base))  # type: ignore[arg-type]
    fill_s = time.perf_counter() - t0
    info = {s: (await js.stream_info(s)).state.messages for s in ("FLEET", "QUOTA", "JOBS", "BILLING")}
    await nc.drain()
    return {
        "fill_s": round(fill_s, 1),
        "events": sum(info.values()),
        **{f"{k.lower()}_events": v for k, v in info.items()},
    }


def history(jobs: int, nodes: int, base: float) -> Iterator[Item]:
    """The fleet, the quotas, then N finished jobs (one every half second of log time) with the
    CostAccrued billing's core decides for every period they cover, in the order they would be written."""
    books = billing.BillingState()  # billing's default period and settle time

    def booked(item: Item) -> Item:
        billing.evolve(books, item[0], item[1] or "")  # type: ignore[arg-type]
        return item

    for n in range(nodes):
        gpus = [GpuInfo(index=i, uuid=f"GPU-{n}-{i}", model="H100") for i in range(8)]
        yield booked(
            (
                NodeDiscovered(cluster="c1", node=f"n{n:05d}", at=base, gpus=gpus, labels={"rack": f"r{n // 32}"}),
                None,
                base,
            )
        )
    share = nodes * 8 // TEAMS
    for t in range(TEAMS):
        yield TeamQuotaSet(team=f"team{t}", pool="default", at=base, guaranteed_gpus=share), None, base
    for i in range(jobs):
        at = base + 1_000.0 + i * 0.5
        for decision in billing.decide(books, at):  # periods closed by now: accrued as billing would
            yield booked((decision[0], decision[1], at))
        job = f"job-{i:07d}"
        team = f"team{i % TEAMS}"
        node, gpu = divmod(i % (nodes * 8), 8)
        placement = Placement(cluster="c1", node=f"n{node:05d}", gpu_indices=[gpu])
        yield booked(
            (
                JobSubmitted(job_id=job, at=at, spec=JobSpec(team=team, gpus_per_replica=1)),
                stable_id("submitted", job),
                at,
            )
        )
        yield booked(
            (
                JobScheduled(job_id=job, at=at, team=team, placements=[placement], pool="default"),
                stable_id("scheduled", job, 0),
                at,
            )
        )
        yield booked((JobCompleted(job_id=job, at=at + 0.25), stable_id("completed", job), at))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process used so far (/proc/PID/stat): the cost of getting
    ready on a shared machine, where wall time also counts the neighbours."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def logged(line: str) -> dict[str, object]:
    try:
        found = json.loads(line)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def start_to_ready(service: str, url: str, code: Path, timeout_s: float, extra: list[str]) -> dict[str, object]:
    """From process start until it logs that it caught up: wall seconds, the host's own seconds
    (after the interpreter and imports), CPU seconds, resident memory then; stops it and reads the
    size of the snapshot it saves on the way out."""
    env = {**os.environ, "PYTHONPATH": str(code), "CHAMBER_HEALTH_PORT": ""}
    cmd = [sys.executable, "-m", "services.cli", "service", service, "--nats", url, *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    out: dict[str, object] = {"ready_s": -1.0, "rss_mb": 0.0}
    try:
        for line in proc.stdout:
            if any(marker in line for marker in READY_LINES):
                out["ready_s"] = round(time.perf_counter() - t0, 2)
                out["rss_mb"], out["cpu_s"] = rss_mb(proc.pid), cpu_s(proc.pid)
                out["host_s"], out["folded"] = logged(line).get("seconds"), logged(line).get("folded")
                break
            if time.perf_counter() - t0 > timeout_s:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rest, _ = proc.communicate(timeout=120)
            for line in rest.splitlines():
                if "snapshot saved" in line:
                    out["snapshot_bytes"] = logged(line).get("bytes")
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


@contextlib.contextmanager
def running_server(store: Path) -> Iterator[NatsServerProcess]:
    """A nats-server on `store`, given time to open and to flush a store of millions of messages."""
    server = NatsServerProcess(store)
    server.start(timeout_s=600.0)
    try:
        yield server
    finally:
        server.stop(timeout_s=300.0)


def extra_args(service: str) -> list[str]:
    return ["--cluster", "c1"] if service in ("scheduler", "discovery", "health") else []


async def forget_snapshot(url: str, service: str) -> None:
    """Remove the service's snapshot, so its next start is a full replay."""
    nc = await connect(url, name="bench-forget")
    try:
        await SnapshotStore(nc.jetstream()).delete(service)
    finally:
        await nc.drain()


def filled_store(root: Path | None, n: int, nodes: int) -> tuple[Path, dict[str, float] | None]:
    """The store directory for N jobs and what its fill measured, if it was filled before."""
    if root is None:
        return Path(tempfile.mkdtemp(prefix="chamber-restart-")), None
    where = root / f"n{n}-nodes{nodes}"
    marker = where / "filled.json"
    return where, (json.loads(marker.read_text()) if marker.exists() else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, nargs="+", default=[10_000], help="finished jobs in JOBS (one run each)")
    parser.add_argument("--nodes", type=int, default=200, help="nodes of 8 GPUs in FLEET (default 200)")
    parser.add_argument("--services", nargs="*", default=["scheduler"], help="services to restart (none: fill only)")
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout to run the services from")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a service to be ready")
    parser.add_argument("--store", type=Path, help="keep and reuse filled JetStream stores under this directory")
    parser.add_argument(
        "--fast-fill", action="store_true", help="fill without per-message acks and spans (same events and ids)"
    )
    parser.add_argument("--no-first-start", action="store_true", help="restart from the snapshot there is only")
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="first starts (full replays) run this many services at once; restarts always run alone "
        "(compare first starts by first_start_cpu_s then)",
    )
    args = parser.parse_args()
    configure_logging("error", json=True)
    for n in args.jobs:
        where, filled = filled_store(args.store, n, args.nodes)
        with running_server(where / "js") as server:
            if filled is None:
                filled = asyncio.run(fill(server.url, n, args.nodes, fast=args.fast_fill))
                if args.store is not None:
                    (where / "filled.json").write_text(json.dumps(filled))
            firsts: dict[str, dict[str, object]] = {}
            if args.services and not args.no_first_start:
                for service in args.services:
                    asyncio.run(forget_snapshot(server.url, service))
                jobs = min(len(args.services), args.parallel)
                with concurrent.futures.ThreadPoolExecutor(jobs) as pool:  # threads wait on processes
                    started = {
                        s: pool.submit(start_to_ready, s, server.url, args.code, args.timeout, extra_args(s))
                        for s in args.services
                    }
                    firsts = {s: f.result() for s, f in started.items()}
            for service in args.services:
                first = {**firsts.get(service, {}), "parallel": args.parallel} if service in firsts else {}
                again = start_to_ready(service, server.url, args.code, args.timeout, extra_args(service))
                row = {
                    "service": service,
                    "history_jobs": n,
                    "restart_to_ready_s": again.pop("ready_s"),
                    "rss_mb": again.pop("rss_mb"),
                    **{f"restart_{k}": v for k, v in again.items()},
                    **{f"first_start_{k}": v for k, v in first.items()},
                    "load_avg_1m": round(os.getloadavg()[0], 1),
                    "nodes": args.nodes,
                    "code": str(args.code),
                    **filled,
                }
                print(json.dumps(row), flush=True)
        if args.store is None:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
