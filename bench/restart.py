"""Restart cost of the deciders with N finished jobs in the log (issue 14's proof).

Starts its own nats-server, fills FLEET (--nodes nodes x 8 GPUs), QUOTA (a quota per team) and JOBS
(N jobs, each submitted, scheduled with its pool, and completed: 3 events, the shape the services
write), then per service:
1. starts `chamber service NAME` as its own process (`python -m services.cli`) and times it until it
   logs that it caught up (`first_start_s`: a full replay; there is no snapshot yet), stops it
   (a decider host saves its snapshot on the way out);
2. starts it again and times it to caught up (`restart_to_ready_s`), then reads its resident memory
   (`rss_mb`, /proc VmRSS).
`--code DIR` runs the services from another checkout (e.g. a `git worktree` of the commit before
the host) for the "before" figures. Prints one JSON object per service and N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events import GpuInfo, JobCompleted, JobScheduled, JobSpec, JobSubmitted, NodeDiscovered, Placement, TeamQuotaSet
from events.codec import stable_id
from services.runtime import Publisher, connect, ensure_streams
from services.runtime.logs import configure_logging
from services.runtime.nats_server import NatsServerProcess

ROOT = Path(__file__).resolve().parents[1]
READY_LINES = ("caught up", "state rebuilt from the log", "caught up with the log")  # host, and older shells
TEAMS = 10


async def fill(url: str, jobs: int, nodes: int) -> dict[str, float]:
    nc = await connect(url, name="bench-fill")
    js = nc.jetstream()
    await ensure_streams(js)
    pub = Publisher(js, source="bench/restart")
    t0 = time.perf_counter()
    fleet = [
        NodeDiscovered(
            cluster="c1",
            node=f"n{n:05d}",
            at=0.0,
            gpus=[GpuInfo(index=i, uuid=f"GPU-{n}-{i}", model="H100") for i in range(8)],
            labels={"rack": f"r{n // 32}"},
        )
        for n in range(nodes)
    ]
    await pub.publish_many((e, None, 0.0) for e in fleet)
    share = nodes * 8 // TEAMS
    await pub.publish_many(
        (TeamQuotaSet(team=f"team{t}", pool="default", at=0.0, guaranteed_gpus=share), None, 0.0) for t in range(TEAMS)
    )

    def history() -> object:
        for i in range(jobs):
            at = 1_000.0 + i * 0.5  # one finished job every half second of JOBS time
            job = f"job-{i:07d}"
            node, gpu = divmod(i % (nodes * 8), 8)
            yield (
                JobSubmitted(job_id=job, at=at, spec=JobSpec(team=f"team{i % TEAMS}", gpus_per_replica=1)),
                (stable_id("submitted", job)),
                at,
            )
            placement = Placement(cluster="c1", node=f"n{node:05d}", gpu_indices=[gpu])
            yield (
                JobScheduled(job_id=job, at=at, team=f"team{i % TEAMS}", placements=[placement], pool="default"),
                (stable_id("scheduled", job, 0)),
                at,
            )
            yield JobCompleted(job_id=job, at=at + 0.25), stable_id("completed", job), at

    await pub.publish_many(history())  # type: ignore[arg-type]
    fill_s = time.perf_counter() - t0
    await nc.drain()
    return {"fill_s": round(fill_s, 1), "events": jobs * 3 + nodes + TEAMS}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def start_to_ready(service: str, url: str, code: Path, timeout_s: float, extra: list[str]) -> tuple[float, float]:
    """Seconds from process start until it logs that it caught up, and its RSS then; stops it."""
    env = {**os.environ, "PYTHONPATH": str(code), "CHAMBER_HEALTH_PORT": ""}
    cmd = [sys.executable, "-m", "services.cli", "service", service, "--nats", url, *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    ready_s, rss = -1.0, 0.0
    try:
        for line in proc.stdout:
            if any(marker in line for marker in READY_LINES):
                ready_s = time.perf_counter() - t0
                rss = rss_mb(proc.pid)
                break
            if time.perf_counter() - t0 > timeout_s:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return round(ready_s, 2), rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, nargs="+", default=[10_000], help="finished jobs in JOBS (one run each)")
    parser.add_argument("--nodes", type=int, default=200, help="nodes of 8 GPUs in FLEET (default 200)")
    parser.add_argument("--services", nargs="+", default=["scheduler"], help="services to restart")
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout to run the services from")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a service to be ready")
    args = parser.parse_args()
    configure_logging("error", json=True)
    for n in args.jobs:
        with tempfile.TemporaryDirectory() as tmp, NatsServerProcess(Path(tmp) / "js") as server:
            filled = asyncio.run(fill(server.url, n, args.nodes))
            for service in args.services:
                extra = ["--cluster", "c1"] if service in ("scheduler", "discovery", "health") else []
                first_s, first_rss = start_to_ready(service, server.url, args.code, args.timeout, extra)
                again_s, again_rss = start_to_ready(service, server.url, args.code, args.timeout, extra)
                print(
                    json.dumps(
                        {
                            "service": service,
                            "history_jobs": n,
                            "nodes": args.nodes,
                            "first_start_s": first_s,
                            "first_start_rss_mb": first_rss,
                            "restart_to_ready_s": again_s,
                            "rss_mb": again_rss,
                            "code": str(args.code),
                            **filled,
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
