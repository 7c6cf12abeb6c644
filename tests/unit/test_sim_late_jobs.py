"""bench/sim_late_jobs.py's whole-node floor (how long no node could have been whole for a job) and
each class's longest waits."""

from __future__ import annotations

import sys
from pathlib import Path

from events import PriorityClass
from services.tracesim.engine import FleetSpec, Simulation
from services.tracesim.model import TraceJob
from services.tracesim.quotas import equal_shares
from services.tracesim.run import make_policy

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.sim_late_jobs import Recording, _longest_by_class, _whole_node_jobs

HOUR = 3600.0


def _job(
    jid: str, at_h: float, hours: float, gpus: int, priority: PriorityClass, preemptible: bool = False
) -> TraceJob:
    return TraceJob(
        id=jid,
        submit_s=at_h * HOUR,
        duration_s=hours * HOUR,
        gpus=gpus,
        team="a",
        priority=priority,
        preemptible=preemptible,
    )


def test_a_whole_node_job_s_floor_is_the_soonest_node_free_of_non_preemptible_work() -> None:
    jobs = [
        _job("long", 0, 100, 8, PriorityClass.HIGH),  # node 0 until hour 100
        _job("short", 0, 10, 7, PriorityClass.HIGH),  # node 1 until hour 10
        _job("filler", 0, 50, 1, PriorityClass.LOW, preemptible=True),  # node 1 too, but preemptible
        _job("whole", 1, 2, 8, PriorityClass.NORMAL),  # arrives at hour 1: no node whole before hour 10
    ]
    policy = Recording(make_policy("chamber").policy)
    outcome = Simulation(jobs, FleetSpec(gpus=16, gpus_per_node=8), equal_shares(["a"], 16), policy).run()

    assert set(policy.no_whole_node) == {"whole"}  # only the job that needs a whole node
    assert policy.no_whole_node["whole"] == 9.0
    found = _whole_node_jobs(outcome, policy.no_whole_node, policy.waited)
    started = outcome.jobs["whole"].first_start
    assert started is not None and started >= 10 * HOUR  # the floor holds: it cannot start sooner
    assert found["by_class"]["normal"]["jobs"] == 1
    assert found["by_class"]["normal"]["mean_no_whole_node_h"] == 9.0
    row = found["longest_waits"][0]
    assert row["job"] == "whole" and row["team"] == "a" and row["wait_h"] >= 9.0 and row["mostly"]


def test_a_class_mean_that_rests_on_one_job_says_so() -> None:
    """One 8-GPU job waits for the fleet's long runner; the class's other jobs start at once."""
    jobs = [_job("long", 0, 100, 4, PriorityClass.HIGH), _job("big", 1, 1, 8, PriorityClass.NORMAL)]
    jobs += [_job(f"small-{i}", 1 + i, 1, 1, PriorityClass.NORMAL) for i in range(3)]
    policy = Recording(make_policy("chamber").policy)
    outcome = Simulation(jobs, FleetSpec(gpus=8, gpus_per_node=8), equal_shares(["a"], 8), policy).run()

    normal = _longest_by_class(outcome, policy.waited)["normal"]
    assert normal["jobs"] == 4
    assert normal["longest"][0]["job"] == "big" and normal["longest"][0]["wait_h"] == 99.0
    assert normal["mean_h"] == 24.75  # 99 h over four jobs
    assert normal["mean_without_longest_h"][0] == 0.0  # the other three started at once
    assert len(normal["mean_without_longest_h"]) == 3  # never every job left out
