"""Idle reclaim on seeded synthetic telemetry: idle jobs and busy bursty controls, through the core.

Prints JSON: false_reclaims (verdicts on busy controls; must be 0), reclaimed_gpu_hours_by_team
(GPU-hours from each suspend verdict to the job's scheduled end). Usage: python bench/idle_reclaim.py [seed]
"""

from __future__ import annotations

import json
import random
import sys

from events.jobs import JobScheduled
from services.idle import sim
from services.idle.core import IdleMode, IdlePolicy, IdleState, decide, event_of, evolve

HORIZON_S = 12 * 3600.0
TEAMS = {
    "vision": IdlePolicy(mode=IdleMode.SUSPEND, idle_minutes=30.0, grace_minutes=15.0),
    "nlp": IdlePolicy(mode=IdleMode.SUSPEND, idle_minutes=20.0, grace_minutes=30.0),
    "research": IdlePolicy(mode=IdleMode.NOTIFY, idle_minutes=30.0, grace_minutes=15.0),
}


def main(seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    state = IdleState(policies=TEAMS)
    busy: set[str] = set()
    streams = []
    for team in TEAMS:
        for k in range(6):
            job, gpus = f"{team}-{k}", rng.choice((1, 2, 4, 8))
            evolve(
                state, JobScheduled(job_id=job, at=0.0, team=team, placements=sim.placement("c", job, gpus), pool="p")
            )
            if k % 2 == 0:  # busy control: gaps up to 15 min, some with NCCL progress and low SM
                busy.add(job)
                act = sim.bursty(random.Random(rng.random()), max_gap_s=15 * 60.0)
                ops = (lambda t: int(t // 30)) if k == 4 else None
            else:  # goes idle after a busy start (a notebook left open, a stalled loop)
                act, ops = sim.idle_after(rng.uniform(0.5, 6.0) * 3600.0, random.Random(rng.random())), None
            streams.append(
                sim.samples(
                    cluster="c",
                    node=job,
                    gpus=gpus,
                    start=0.0,
                    end=HORIZON_S,
                    interval_s=30.0,
                    activity=act,
                    comm_ops=ops,
                )
            )
    events = sorted((e for s in streams for e in s), key=lambda e: e.observed_at)  # type: ignore[attr-defined]
    verdicts = []
    for e in events:
        evolve(state, e)
        due = decide(state, e.observed_at)  # type: ignore[attr-defined]
        for v in due:  # as the host does: the verdict comes back from the log
            evolve(state, event_of(v))
        verdicts += due
    reclaimed: dict[str, float] = {t: 0.0 for t in TEAMS}
    notified: dict[str, int] = {t: 0 for t in TEAMS}
    for v in verdicts:
        if v.action is IdleMode.SUSPEND and v.job_id not in busy:
            reclaimed[v.team] += v.gpus * (HORIZON_S - v.at) / 3600.0
        elif v.action is IdleMode.NOTIFY:
            notified[v.team] += 1
    idle_jobs = len(state.jobs) - len(busy)
    return {
        "seed": seed,
        "busy_controls": len(busy),
        "idle_jobs": idle_jobs,
        "false_reclaims": sum(1 for v in verdicts if v.job_id in busy),
        "idle_jobs_flagged": sum(1 for v in verdicts if v.job_id not in busy),
        "reclaimed_gpu_hours_by_team": {t: round(h, 2) for t, h in reclaimed.items()},
        "notified_by_team": notified,
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 7), indent=2))
