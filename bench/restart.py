"""Restart cost of the scheduler (and other deciders) after a deploy, through the real services.

Starts a real nats-server under the users and permissions `chamber nats-config` generates
(tests/secured_bus.py, as the tests and `chamber up` do), fills it as `admin` with a history, then
runs `chamber service NAME` as its own process, logged in as its own NATS user, and times it to
ready. Histories (`--histories`):

- `recent`: `--recent` jobs (default 200,000) that all finished within the last hour;
- `spread`: `--spread` jobs (default 1,000,000) spread evenly over the last 30 days.

Each job is three JOBS events (submitted, scheduled with its pool, completed) on a fleet of `--nodes`
nodes x 8 GPUs with a quota per team, plus the CostAccrued lines billing's own core writes for that
history on BILLING. Per history and checkout, in order:

1. `first`: no snapshot: the service folds the whole log; stopped, it saves its snapshot;
2. `--tail` more jobs finish (the history a snapshot taken up to `--snapshot-every` earlier misses);
3. `same_build`: started again from the snapshot with the same code;
4. `--tail` more jobs finish; `new_build`: started from the snapshot with a copy of the checkout that
   differs only by a comment in the scheduler's fold (`services/scheduler/core/state.py`): a deploy.

Each row: `ready_s` (wall seconds from process start to its "caught up" log line), `cpu_s` (the
process's user + system CPU seconds by then: on a shared machine wall time counts the neighbours,
CPU time does not), `host_s` (the host's own seconds, after interpreter and imports), `rss_mb` (resident
memory when ready), `peak_rss_mb` (VmHWM: the most it held on the way), `replayed` (events folded
until ready), `restored` (it started from its snapshot) and `snapshot_bytes` (saved on stop).

`--before DIR` runs every start also with another checkout (`git archive COMMIT | tar -x -C DIR`),
side by side (the same store; each checkout's first start makes its own snapshot; `--before-user
admin` for a release older than the generated users). `--store DIR`
keeps the filled JetStream store (and its users' passwords) in DIR/<history>-<jobs> and reuses it:
a 1,000,000-job fill is about 4 M events. `--jobs N` sets both histories' job counts (a quick run).
Prints one JSON object per fill and per start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
from services.runtime import connect
from services.runtime.logs import configure_logging
from services.runtime.snapshots import SnapshotStore
from tests.secured_bus import SecuredNatsServer

ROOT = Path(__file__).resolve().parents[1]
READY_LINES = ("caught up", "state rebuilt from the log", "caught up with the log")  # host, and older shells
RESTORED_LINE = "state restored from snapshot"
TEAMS = 10
HOUR, DAY = 3600.0, 86400.0
RUN_S = 0.25  # how long each job ran
# The packages a service process imports: what a "new build" copies (and changes one comment in).
CODE_DIRS = ("services", "events", "node_agent", "chamber_hooks", "schemas")
NEW_BUILD_FILE = "services/scheduler/core/state.py"

Item = tuple[object, str | None, float]


@dataclass(frozen=True)
class History:
    name: str
    jobs: int
    span_s: float  # the jobs finish evenly over this span, which ends `--tail` jobs before now


# -- filling the log ------------------------------------------------------------------------------
async def publish_fast(nc: Any, js: Any, items: Iterator[Item], every: int = 2000) -> int:
    """The envelopes the services write (`events.encode`, with their ids), published without waiting
    for each ack: every `every` messages one acked publish is awaited (JetStream stores a connection's
    messages in order, so its ack means the ones before it are stored too). Returns the count."""
    last: tuple[str, bytes, dict[str, str]] | None = None
    n = 0
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
    return n


async def fill(url: str, history: History, nodes: int) -> dict[str, Any]:
    nc = await connect(url, name="bench-fill")
    js = nc.jetstream()
    t0 = time.perf_counter()
    published = await publish_fast(nc, js, fleet_and_history(history, nodes, end=time.time() - 60.0))
    fill_s = time.perf_counter() - t0
    info = {s: (await js.stream_info(s)).state.messages for s in ("FLEET", "QUOTA", "JOBS", "BILLING")}
    await nc.drain()
    return {
        "fill": history.name,
        "jobs": history.jobs,
        "span_h": round(history.span_s / HOUR, 1),
        "fill_s": round(fill_s, 1),
        "events_per_s": round(published / fill_s),
        "events": sum(info.values()),
        **{f"{k.lower()}_events": v for k, v in info.items()},
    }


def fleet_and_history(history: History, nodes: int, end: float) -> Iterator[Item]:
    """The fleet, the quotas, then the finished jobs evenly over the span ending at `end`, with the
    CostAccrued billing's core decides for every period they cover, in the order they are written."""
    base = end - history.span_s
    books = billing.BillingState()  # billing's default period and settle time

    def booked(item: Item) -> Item:
        billing.evolve(books, item[0], item[1] or "")  # type: ignore[arg-type]
        return item

    for n in range(nodes):
        gpus = [GpuInfo(index=i, uuid=f"GPU-{n}-{i}", model="H100") for i in range(8)]
        node = NodeDiscovered(cluster="c1", node=f"n{n:05d}", at=base, gpus=gpus, labels={"rack": f"r{n // 32}"})
        yield booked((node, None, base))
    share = nodes * 8 // TEAMS
    for t in range(TEAMS):
        yield TeamQuotaSet(team=f"team{t}", pool="default", at=base, guaranteed_gpus=share), None, base
    gap = history.span_s / max(1, history.jobs)
    for i in range(history.jobs):
        at = base + i * gap
        for decision in billing.decide(books, at):  # periods closed by now: accrued as billing would
            yield booked((decision[0], decision[1], at))
        yield from (booked(item) for item in finished_job(f"job-{i:07d}", i, nodes, at))


def finished_job(job: str, i: int, nodes: int, at: float) -> Iterator[Item]:
    """A job's three events: submitted, scheduled on one GPU (round robin over the fleet), completed."""
    team = f"team{i % TEAMS}"
    node, gpu = divmod(i % (nodes * 8), 8)
    placement = Placement(cluster="c1", node=f"n{node:05d}", gpu_indices=[gpu])
    yield JobSubmitted(job_id=job, at=at, spec=JobSpec(team=team, gpus_per_replica=1)), stable_id("submitted", job), at
    scheduled = JobScheduled(job_id=job, at=at, team=team, placements=[placement], pool="default")
    yield scheduled, stable_id("scheduled", job, 0), at
    yield JobCompleted(job_id=job, at=at + RUN_S), stable_id("completed", job), at


async def finish_more(url: str, jobs: int, nodes: int) -> int:
    """`jobs` more jobs that finish now (ids unique to this call): the tail a snapshot does not cover."""
    if jobs <= 0:
        return 0
    nc = await connect(url, name="bench-tail")
    token, now = secrets.token_hex(3), time.time()
    items = (it for i in range(jobs) for it in finished_job(f"tail-{token}-{i:05d}", i, nodes, now - jobs + i))
    try:
        return await publish_fast(nc, nc.jetstream(), items)
    finally:
        await nc.drain()


# -- one start of a service -----------------------------------------------------------------------
def proc_status(pid: int, key: str) -> float:
    """A memory figure of /proc/PID/status in MB (VmRSS now, VmHWM the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process used so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def logged(line: str) -> dict[str, Any]:
    try:
        found = json.loads(line)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def start_to_ready(service: str, url: str, code: Path, timeout_s: float) -> dict[str, Any]:
    """From process start until it logs that it caught up: wall, host and CPU seconds, memory now and
    at its peak, events folded, whether it restored a snapshot; then stops it (a decider host saves
    its snapshot on the way out) and reads that snapshot's size."""
    env = {**os.environ, "PYTHONPATH": str(code), "CHAMBER_HEALTH_PORT": ""}
    extra = ["--cluster", "c1"] if service in ("scheduler", "discovery", "health") else []
    cmd = [sys.executable, "-m", "services.cli", "service", service, "--nats", url, *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    out: dict[str, Any] = {"ready_s": -1.0, "restored": False}
    try:
        for line in proc.stdout:
            if RESTORED_LINE in line:
                out["restored"], out["restore_s"] = True, logged(line).get("seconds")
            if any(marker in line for marker in READY_LINES):
                out["ready_s"] = round(time.perf_counter() - t0, 2)
                out["cpu_s"], out["host_s"] = cpu_s(proc.pid), logged(line).get("seconds")
                out["rss_mb"], out["peak_rss_mb"] = proc_status(proc.pid, "VmRSS"), proc_status(proc.pid, "VmHWM")
                out["replayed"] = logged(line).get("folded")
                break
            if time.perf_counter() - t0 > timeout_s:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rest, _ = proc.communicate(timeout=300)
            for line in rest.splitlines():
                if "snapshot saved" in line:
                    out["snapshot_bytes"] = logged(line).get("bytes")
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


async def forget_snapshot(url: str, service: str) -> None:
    """Remove the service's snapshot, so its next start folds from the start."""
    nc = await connect(url, name="bench-forget")
    try:
        await SnapshotStore(nc.jetstream()).delete(service)
    finally:
        await nc.drain()


def new_build(code: Path, into: Path) -> Path:
    """A copy of the checkout's packages that differs only by a comment in the scheduler's fold."""
    for name in CODE_DIRS:
        if (code / name).is_dir():
            shutil.copytree(code / name, into / name, ignore=shutil.ignore_patterns("__pycache__"))
    changed = into / NEW_BUILD_FILE
    changed.write_text(changed.read_text() + "\n# a new build: this comment is all that changed\n")
    return into


def starts(
    service: str, server: SecuredNatsServer, code: Path, args: argparse.Namespace, user: str = ""
) -> Iterator[dict[str, Any]]:
    """First start, same-build restart, new-build restart, with `--tail` jobs finishing before each
    restart; the service logs in as its own NATS user, or as `user`."""
    url = server.url_for(user or service)
    asyncio.run(forget_snapshot(server.url, service))
    yield {"start": "first", **start_to_ready(service, url, code, args.timeout)}
    asyncio.run(finish_more(server.url, args.tail, args.nodes))
    yield {"start": "same_build", **start_to_ready(service, url, code, args.timeout)}
    asyncio.run(finish_more(server.url, args.tail, args.nodes))
    with tempfile.TemporaryDirectory(prefix="chamber-new-build-") as tmp:
        yield {"start": "new_build", **start_to_ready(service, url, new_build(code, Path(tmp)), args.timeout)}


# -- the store --------------------------------------------------------------------------------------
@contextlib.contextmanager
def secured_server(where: Path) -> Iterator[SecuredNatsServer]:
    """nats-server under the generated users, given time to open and to flush a store of millions."""
    server = SecuredNatsServer(where)
    server.start(timeout_s=600.0)
    try:
        yield server
    finally:
        server.stop(timeout_s=300.0)
        refused = server.violations()
        if refused:
            print(json.dumps({"refused_permissions": refused[:20]}), flush=True)


def histories(args: argparse.Namespace) -> list[History]:
    recent = args.jobs if args.jobs is not None else args.recent
    spread = args.jobs if args.jobs is not None else args.spread
    known = {"recent": History("recent", recent, HOUR), "spread": History("spread", spread, 30 * DAY)}
    return [known[name] for name in args.histories]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--histories", nargs="+", choices=("recent", "spread"), default=["recent", "spread"])
    parser.add_argument("--recent", type=int, default=200_000, help="jobs finished within the last hour")
    parser.add_argument("--spread", type=int, default=1_000_000, help="jobs finished over the last 30 days")
    parser.add_argument("--jobs", type=int, help="job count of every history (overrides --recent and --spread)")
    parser.add_argument("--tail", type=int, default=1000, help="jobs that finish after each snapshot (default 1000)")
    parser.add_argument("--nodes", type=int, default=200, help="nodes of 8 GPUs in FLEET (default 200)")
    parser.add_argument("--services", nargs="+", default=["scheduler"], help="services to start (default scheduler)")
    parser.add_argument("--before", type=Path, help="another checkout, run side by side")
    parser.add_argument(
        "--before-user",
        default="",
        metavar="USER",
        help="the NATS user the --before checkout's services log in as (default: their own; `admin` for a "
        "release older than the generated users, whose services the users' permissions refuse)",
    )
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds to wait for a service to be ready")
    parser.add_argument("--store", type=Path, help="keep and reuse filled JetStream stores under this directory")
    args = parser.parse_args()
    configure_logging("error", json=True)
    codes = {"this": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    for history in histories(args):
        root = args.store or Path(tempfile.mkdtemp(prefix="chamber-restart-"))
        where = root / f"{history.name}-{history.jobs}"
        where.mkdir(parents=True, exist_ok=True)
        marker = where / "filled.json"
        with secured_server(where) as server:
            if not marker.exists():
                marker.write_text(json.dumps(asyncio.run(fill(server.url, history, args.nodes))))
            print(marker.read_text(), flush=True)
            for service in args.services:
                for label, code in codes.items():
                    user = args.before_user if label == "before" else ""
                    for row in starts(service, server, code, args, user):
                        meta = {"history": history.name, "jobs": history.jobs, "service": service, "code": label}
                        load = {"load_avg_1m": round(os.getloadavg()[0], 1)}
                        print(json.dumps({**meta, **row, **load}), flush=True)
        if args.store is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
