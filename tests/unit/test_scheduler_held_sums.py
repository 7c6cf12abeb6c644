"""What other teams hold in a pool (`Work.held_by_others`, kept as a sum by `Work.count`) is exactly
what summing every other team gives (`quota._held_by_others`), through any sequence of admissions and
releases; with a share (a float term) it answers None, for the caller to sum as before."""

from __future__ import annotations

import random

from events import GpuShare, JobSpec, JobSubmitted, TeamQuotaSet
from services.scheduler.core import SchedulerState, evolve
from services.scheduler.core.policy import CHAMBER
from services.scheduler.core.quota import _held_by_others
from services.scheduler.core.state import Job
from services.scheduler.core.work import Work


def _state(jobs: int, rng: random.Random) -> SchedulerState:
    state = SchedulerState()
    # lend limit 4: teams 1 and 2 keep back 4 and 12 GPUs used or not; team3 has no quota
    for t in range(4):
        if t < 3:
            evolve(
                state,
                TeamQuotaSet(
                    team=f"t{t}", pool="default", at=0.0, guaranteed_gpus=8 * t, borrow_limit=16, lend_limit=4
                ),
            )
    for i in range(jobs):
        spec = JobSpec(team=f"t{rng.randrange(4)}", gpus_per_replica=rng.choice([1, 2, 4, 8]), replicas=1)
        evolve(state, JobSubmitted(job_id=f"j{i}", at=float(i), spec=spec))
    return state


def test_the_kept_sum_is_the_sum_of_the_others() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        state = _state(30, rng)
        work = Work(state, 100.0, CHAMBER)
        jobs = list(state.jobs.values())
        counted: list[Job] = []
        for _ in range(60):
            if counted and rng.random() < 0.4:
                job = counted.pop(rng.randrange(len(counted)))
                work.count(job, -1)
            else:
                job = rng.choice(jobs)
                work.count(job, +1)
                counted.append(job)
            for team in ("t0", "t1", "t2", "t3", "nobody"):
                teams = work.teams("default")
                kept = work.held_by_others("default", team, teams)
                assert kept == _held_by_others(state, work.usage, "default", team, teams), (seed, team)


def test_a_share_is_summed_by_the_caller() -> None:
    state = _state(0, random.Random(0))
    share = JobSpec(team="t3", gpus_per_replica=1, replicas=1, share=GpuShare(gpu_milli=500))
    evolve(state, JobSubmitted(job_id="s", at=0.0, spec=share))
    work = Work(state, 100.0, CHAMBER)
    work.count(state.jobs["s"], +1, gpus=1)  # whole: kept as a sum
    assert work.held_by_others("default", "t0", work.teams("default")) == 4 + 12 + 1
    work.count(state.jobs["s"], -1, gpus=0.5)  # now half a GPU: no longer a sum of whole numbers
    assert work.held_by_others("default", "t0", work.teams("default")) is None
