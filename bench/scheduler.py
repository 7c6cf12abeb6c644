"""Scheduler core throughput and latency on this machine (pure core, no NATS).

A fleet of --nodes x 8 GPUs in racks of 32, ten teams with quotas, --jobs pending jobs of mixed
sizes (1-8 GPUs on one node, gangs of 2-4 x 8) and priorities. Measures:
- placements_per_s: jobs admitted by the first (full) cycle per second, counting the cycle and
  folding its events back into the state in runs of 5,000, with the decider host's collector policy
  around each (services/runtime/collector.py, timed with them: what the service does; the loaded
  state is collected and frozen out of the garbage collector first, as the service does when it
  has caught up);
- incremental_p50_ms / p99_ms: one cycle (plus folding, the same way) after a single submit or a
  single completion.
`*_cpu_*`: the same from this process's CPU time, less moved by other work on a shared machine.
`decisions_sha256` hashes every decision and wait of every cycle: two checkouts that decide alike
print the same (the summary says whether they do).
Prints one JSON object; with `--before DIR` (another checkout, e.g. `git archive 3993ac3 | tar -x -C
DIR`) runs both, alternating, each in its own process, and adds a summary with after/before ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The checkout to measure comes first on the path: `--code DIR` (set by --before's runs), else this one.
sys.path.insert(
    0,
    str(
        Path(
            sys.argv[sys.argv.index("--code") + 1] if "--code" in sys.argv[:-1] else Path(__file__).parents[1]
        ).resolve()
    ),
)

from events import GpuInfo, JobCompleted, JobSpec, JobSubmitted, NodeDiscovered, PriorityClass, TeamQuotaSet
from services.scheduler.core import SchedulerState, events_for, evolve, schedule

try:  # the decider host's collector policy around deciding and folding (absent before 2026-12)
    from services.runtime.collector import paused_collector
except ImportError:  # an older checkout: the collector ran as it was

    def paused_collector() -> Any:
        return contextlib.nullcontext()


FOLD_RUN = 5000  # messages the host folds in one synchronous run (services/runtime/decider.py)

PRIORITIES = [PriorityClass.CRITICAL, PriorityClass.HIGH, PriorityClass.NORMAL, PriorityClass.LOW]
ROOT = Path(__file__).resolve().parents[1]
METRICS = (
    "placements_per_s",
    "placements_per_cpu_s",
    "incremental_p50_ms",
    "incremental_p99_ms",
    "incremental_cpu_p50_ms",
    "incremental_cpu_p99_ms",
)
SHAPES = [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4)]  # gpus per replica, replicas


def a_job(rng: random.Random, i: int, teams: int, at: float) -> JobSubmitted:
    per, replicas = rng.choices(SHAPES, weights=[30, 25, 20, 15, 7, 3])[0]
    return JobSubmitted(
        job_id=f"j{i}",
        at=at,
        spec=JobSpec(
            team=f"team{rng.randrange(teams)}",
            gpus_per_replica=per,
            replicas=replicas,
            priority=rng.choices(PRIORITIES, weights=[2, 18, 60, 20])[0],
            expected_duration_s=rng.choice([None, 600.0, 3600.0, 36000.0]),
            checkpoint_interval_s=rng.choice([None, 900.0]),
        ),
    )


def run(nodes: int, jobs: int, teams: int, samples: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    state = SchedulerState()
    for n in range(nodes):
        gpus = [GpuInfo(index=i, uuid=f"GPU-{n}-{i}", model="H100") for i in range(8)]
        evolve(state, NodeDiscovered(cluster="c1", node=f"n{n:05d}", at=0.0, gpus=gpus, labels={"rack": f"r{n // 32}"}))
    share = nodes * 8 // teams
    # Teams may run critical work (a quota setting since 3993ac3, which let every team)
    may: dict[str, Any] = {"critical": True} if "critical" in TeamQuotaSet.__struct_fields__ else {}
    for t in range(teams):
        quota = TeamQuotaSet(team=f"team{t}", pool="default", at=0.0, guaranteed_gpus=share, borrow_limit=share, **may)
        evolve(state, quota)
    for i in range(jobs):
        evolve(state, a_job(rng, i, teams, at=float(i) / 1000))

    now = 100.0
    # The service folds the log, then collects and freezes what it built before its first cycle
    # (runtime/decider.py, on catching up): so does the bench, so that the first cycle is not timed
    # walking the loaded state (full collections whose number depends on how the loading went).
    gc.collect()
    gc.freeze()
    t0, c0 = time.perf_counter(), time.process_time()
    cycle = _cycle(state, now, None)
    full_s, full_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    digest = hashlib.sha256()
    _fold_into(digest, cycle)
    placed = sum(1 for d in cycle.decisions if type(d).__name__ == "Admit")
    mark = cycle.mark

    latencies: list[float] = []
    cpu: list[float] = []
    next_id = jobs
    for k in range(samples):
        now += 1.0
        if k % 2 == 0:
            evolve(state, a_job(rng, next_id, teams, at=now))
            next_id += 1
        else:
            running = sorted(j.id for j in state.jobs.values() if j.state.value == "running")
            evolve(state, JobCompleted(job_id=rng.choice(running), at=now))
        t1, c1 = time.perf_counter(), time.process_time()
        cycle = _cycle(state, now, mark)
        latencies.append((time.perf_counter() - t1) * 1000)
        cpu.append((time.process_time() - c1) * 1000)
        mark = cycle.mark
        _fold_into(digest, cycle)
    latencies.sort()
    cpu.sort()
    pending = sum(1 for j in state.jobs.values() if j.state.value in ("pending", "suspended"))
    return {
        "nodes": nodes,
        "gpus": nodes * 8,
        "pending_jobs": jobs,
        "placed_first_cycle": placed,
        "still_pending": pending,
        "first_cycle_s": round(full_s, 3),
        "placements_per_s": round(placed / full_s, 1),
        "first_cycle_cpu_s": round(full_cpu_s, 3),
        "placements_per_cpu_s": round(placed / full_cpu_s, 1),
        "incremental_samples": samples,
        "incremental_p50_ms": round(statistics.median(latencies), 2),
        "incremental_p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
        "incremental_max_ms": round(latencies[-1], 2),
        "incremental_cpu_p50_ms": round(statistics.median(cpu), 2),
        "incremental_cpu_p99_ms": round(_p99(cpu), 2),
        "decisions_sha256": digest.hexdigest(),
    }


def _cycle(state: SchedulerState, now: float, mark: Any) -> Any:
    """What the service does for one cycle: decide (one synchronous section), then fold the
    decisions' events back as the host folds its input, in runs of `FOLD_RUN` (one section each);
    the collector policy of each section (services/runtime/collector.py) is timed with it."""
    with paused_collector():
        cycle = schedule(state, now, mark)
        events = [event for event, _ in events_for(cycle.decisions, now)]
    for start in range(0, len(events), FOLD_RUN):
        with paused_collector():
            for event in events[start : start + FOLD_RUN]:
                evolve(state, event)
    return cycle


def _fold_into(digest: Any, cycle: Any) -> None:
    """Add a cycle's decisions and waits (in order) to the running hash (outside the timed part)."""
    digest.update(repr(cycle.decisions).encode())
    digest.update(repr(sorted(cycle.waiting.items())).encode())


def _p99(values: list[float]) -> float:
    return values[min(len(values) - 1, int(len(values) * 0.99))]


def side_by_side(before: Path, args: argparse.Namespace) -> None:
    """Both checkouts, alternating, each run in its own process; the best of each, and the ratios."""
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    sizes = ["--nodes", str(args.nodes), "--jobs", str(args.jobs), "--teams", str(args.teams)]
    for _ in range(args.rounds):
        for label, code in (("before", before.resolve()), ("after", ROOT)):
            cmd = [sys.executable, __file__, "--code", str(code), *sizes, "--samples", str(args.samples)]
            out = subprocess.run([*cmd, "--seed", str(args.seed)], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"the bench failed for {code}:\n{out.stderr[-2000:]}")
            result = {"run": label, **json.loads(out.stdout.strip().splitlines()[-1])}
            runs[label].append(result)
            print(json.dumps(result), flush=True)
    summary: dict[str, Any] = {"summary": "scheduler", "rounds": args.rounds}
    for metric in METRICS:
        higher_is_better = metric.startswith("placements_per")
        pick = max if higher_is_better else min  # the least disturbed run
        best = {label: pick(float(r[metric]) for r in rs) for label, rs in runs.items()}
        summary[metric] = best
        summary[f"{metric}_ratio"] = round(best["after"] / best["before"], 2) if best["before"] else None
    digests = {r["decisions_sha256"] for rs in runs.values() for r in rs}
    summary["same_decisions"] = len(digests) == 1
    summary["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(summary), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--teams", type=int, default=10)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--before", type=Path, help="another checkout to measure side by side")
    parser.add_argument("--rounds", type=int, default=1, help="with --before: runs of each, alternating")
    parser.add_argument("--code", type=Path, help=argparse.SUPPRESS)  # the checkout this process measures
    args = parser.parse_args()
    if args.before is not None:
        if not (args.before / "services" / "scheduler" / "core").is_dir():
            raise SystemExit(f"--before {args.before}: not a Chamber checkout (no services/scheduler/core)")
        side_by_side(args.before, args)
        return
    print(json.dumps(run(args.nodes, args.jobs, args.teams, args.samples, args.seed)))


if __name__ == "__main__":
    main()
