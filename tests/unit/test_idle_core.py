"""Idle reclaim core, as scenarios on synthetic telemetry (services/idle/sim.py)."""

from __future__ import annotations

import random

import pytest

from events.jobs import JobCompleted, JobScheduled
from services.idle import sim
from services.idle.core import IdleMode, IdlePolicy, IdleState, IdleVerdict, decide, event_of, evolve

POLICY = IdlePolicy(mode=IdleMode.SUSPEND, sm_below_pct=5.0, idle_minutes=30.0, grace_minutes=15.0)


def run(activity: sim.Activity, *, end: float, comm_ops=None, policy: IdlePolicy = POLICY) -> list[IdleVerdict]:
    state = IdleState(policies={"ml": policy})
    evolve(state, JobScheduled(job_id="j", at=0.0, team="ml", placements=sim.placement("c", "n1", 4), pool="p"))
    out: list[IdleVerdict] = []
    for e in sim.samples(
        cluster="c", node="n1", gpus=4, start=0.0, end=end, interval_s=30.0, activity=activity, comm_ops=comm_ops
    ):
        evolve(state, e)
        due = decide(state, e.observed_at)  # type: ignore[attr-defined]
        for v in due:  # folded back from the log, as the host does
            evolve(state, event_of(v))
        out += due
    return out


def test_idle_notebook_is_flagged_once_after_the_window() -> None:
    out = run(sim.idle_after(3600.0, random.Random(1)), end=4 * 3600.0)
    assert len(out) == 1
    v = out[0]
    assert v.action is IdleMode.SUSPEND and v.gpus == 4 and v.team == "ml"
    assert 3600.0 - 30.0 <= v.idle_since <= 3600.0  # the drop to a fixed footprint is its last change
    assert v.at - v.idle_since == pytest.approx(30 * 60.0, abs=31.0)


def test_bursty_training_with_short_gaps_is_never_flagged() -> None:
    for seed in range(5):
        assert run(sim.bursty(random.Random(seed), max_gap_s=20 * 60.0), end=12 * 3600.0) == []


def test_collectives_progressing_with_low_sm_is_never_flagged() -> None:
    quiet = sim.idle_after(0.0, random.Random(2))  # SM ~0 %, memory flat: only NCCL says it works
    assert run(quiet, end=6 * 3600.0, comm_ops=lambda t: int(t // 60)) == []


def test_collectives_that_stop_do_not_protect_it() -> None:
    quiet = sim.idle_after(0.0, random.Random(3))
    out = run(quiet, end=6 * 3600.0, comm_ops=lambda t: int(min(t, 7200.0) // 60))
    assert len(out) == 1 and out[0].idle_since == pytest.approx(7200.0, abs=60.0)


def test_first_minutes_are_never_flagged() -> None:
    grace = IdlePolicy(mode=IdleMode.NOTIFY, idle_minutes=10.0, grace_minutes=60.0)
    out = run(sim.idle_after(0.0, random.Random(4)), end=2 * 3600.0, policy=grace)
    assert len(out) == 1 and out[0].at >= 3600.0 and out[0].action is IdleMode.NOTIFY


def test_memory_change_counts_as_work() -> None:
    rng = random.Random(5)
    # SM always ~0, but memory grows by 1 GiB every 10 minutes (loading a dataset): not idle
    out = run(lambda t: (rng.uniform(0, 2), 1000.0 + 1024.0 * (t // 600)), end=6 * 3600.0)
    assert out == []


def test_off_policy_and_finished_jobs_emit_nothing() -> None:
    assert run(sim.idle_after(0.0, random.Random(6)), end=3 * 3600.0, policy=IdlePolicy()) == []
    state = IdleState(policies={"ml": POLICY})
    evolve(state, JobScheduled(job_id="j", at=0.0, team="ml", placements=sim.placement("c", "n1", 1), pool="p"))
    evolve(state, JobCompleted(job_id="j", at=10.0))
    assert decide(state, 10 * 3600.0) == []


def test_bad_policy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="sm_below_pct"):
        IdlePolicy(sm_below_pct=0.0)
