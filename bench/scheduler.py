"""Scheduler core throughput and latency on this machine (pure core, no NATS).

A fleet of --nodes x 8 GPUs in racks of 32, ten teams with quotas, --jobs pending jobs of mixed
sizes (1-8 GPUs on one node, gangs of 2-4 x 8) and priorities. Measures:
- placements_per_s: jobs admitted by the first (full) cycle per second, counting the cycle and
  folding its events back into the state (what the service does);
- incremental_p50_ms / p99_ms: one cycle (plus folding) after a single submit or a single completion
  (the state loaded so far is frozen out of the garbage collector first, as the service does).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events import GpuInfo, JobCompleted, JobSpec, JobSubmitted, NodeDiscovered, PriorityClass, TeamQuotaSet
from services.scheduler.core import SchedulerState, events_for, evolve, schedule

PRIORITIES = [PriorityClass.CRITICAL, PriorityClass.HIGH, PriorityClass.NORMAL, PriorityClass.LOW]
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
    for t in range(teams):
        evolve(
            state,
            TeamQuotaSet(
                team=f"team{t}", pool="default", at=0.0, guaranteed_gpus=share, borrow_limit=share, critical=True
            ),
        )
    for i in range(jobs):
        evolve(state, a_job(rng, i, teams, at=float(i) / 1000))

    now = 100.0
    t0 = time.perf_counter()
    cycle = schedule(state, now)
    for event, _ in events_for(cycle.decisions, now):
        evolve(state, event)
    full_s = time.perf_counter() - t0
    placed = sum(1 for d in cycle.decisions if type(d).__name__ == "Admit")
    mark = cycle.mark
    # As the service does once it has replayed the log: move the long-lived state out of the
    # collector's way, so a full collection does not walk 20,000 jobs in the middle of a cycle.
    gc.collect()
    gc.freeze()

    latencies: list[float] = []
    next_id = jobs
    for k in range(samples):
        now += 1.0
        if k % 2 == 0:
            evolve(state, a_job(rng, next_id, teams, at=now))
            next_id += 1
        else:
            running = sorted(j.id for j in state.jobs.values() if j.state.value == "running")
            evolve(state, JobCompleted(job_id=rng.choice(running), at=now))
        t1 = time.perf_counter()
        cycle = schedule(state, now, mark)
        for event, _ in events_for(cycle.decisions, now):
            evolve(state, event)
        latencies.append((time.perf_counter() - t1) * 1000)
        mark = cycle.mark
    latencies.sort()
    pending = sum(1 for j in state.jobs.values() if j.state.value in ("pending", "suspended"))
    return {
        "nodes": nodes,
        "gpus": nodes * 8,
        "pending_jobs": jobs,
        "placed_first_cycle": placed,
        "still_pending": pending,
        "first_cycle_s": round(full_s, 3),
        "placements_per_s": round(placed / full_s, 1),
        "incremental_samples": samples,
        "incremental_p50_ms": round(statistics.median(latencies), 2),
        "incremental_p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
        "incremental_max_ms": round(latencies[-1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--teams", type=int, default=10)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps(run(args.nodes, args.jobs, args.teams, args.samples, args.seed)))


if __name__ == "__main__":
    main()
