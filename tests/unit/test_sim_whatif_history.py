"""Recorded job facts folded into trace jobs: what counts as a job's duration, and the --since window."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from events import (
    JobCancelled,
    JobCompleted,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobSpec,
    JobSuspended,
    PriorityClass,
    TeamQuotaSet,
)
from services.tracesim.history import Lifecycle, Submitted, current_quotas, fold_jobs, parse_since
from services.tracesim.trace import TraceError

SCHED, RESUMED, DONE = JobScheduled.ce_type(), JobResumed.ce_type(), JobCompleted.ce_type()
PREEMPTED, SUSPENDED, REQUEUED = JobPreempted.ce_type(), JobSuspended.ce_type(), JobRequeued.ce_type()


def job(job_id: str = "j", at: float = 100.0, gpus: int = 2, **spec: object) -> Submitted:
    return Submitted(job_id, at, JobSpec(team="t", gpus_per_replica=gpus, **spec))  # type: ignore[arg-type]


def life(*steps: tuple[str, float] | tuple[str, float, float], job_id: str = "j") -> list[Lifecycle]:
    return [Lifecycle(job_id, *s) for s in steps]


def test_a_fault_keeps_only_whole_checkpoint_intervals_of_that_run() -> None:
    steps = life((SCHED, 0), (REQUEUED, 700), (SCHED, 800), (DONE, 1000))
    assert fold_jobs([job(checkpoint_interval_s=300)], steps, 0, 5000).jobs[0].duration_s == 600 + 200
    assert fold_jobs([job()], steps, 0, 5000).jobs[0].duration_s == 200  # no checkpoints: the first run is lost


def test_preempted_work_thrown_away_is_not_progress_but_a_suspension_keeps_it() -> None:
    steps = life((SCHED, 0), (PREEMPTED, 500, 2 * 100), (SUSPENDED, 500), (RESUMED, 900), (DONE, 1000))
    assert fold_jobs([job(gpus=2)], steps, 0, 5000).jobs[0].duration_s == 400 + 100
    kept = life((SCHED, 0), (SUSPENDED, 500), (RESUMED, 900), (DONE, 1000))
    assert fold_jobs([job()], kept, 0, 5000).jobs[0].duration_s == 600


def test_a_repeated_start_while_running_does_not_restart_the_clock() -> None:
    steps = life((SCHED, 0), (SCHED, 300), (DONE, 1000))
    assert fold_jobs([job()], steps, 0, 5000).jobs[0].duration_s == 1000


def test_jobs_that_never_ran_are_left_out_or_use_the_users_estimate() -> None:
    cancelled = life((JobCancelled.ce_type(), 50), job_id="c")
    loaded = fold_jobs([job("c", 10), job("p", 20), job("e", 30, expected_duration_s=900)], cancelled, 0, 5000)
    assert [(j.id, j.duration_s) for j in loaded.jobs] == [("e", 900)]
    assert (loaded.never_ran, loaded.pending_skipped, loaded.pending_estimated) == (1, 1, 1)


def test_submit_times_are_relative_to_the_first_submit_and_the_spec_carries_over() -> None:
    a = job("a", 1000, priority=PriorityClass.HIGH, preemptible=False, gpu_model="H100", replicas=3)
    b = job("b", 400)
    steps = life((SCHED, 1000), (DONE, 1100), job_id="a") + life((SCHED, 500), (DONE, 600), job_id="b")
    loaded = fold_jobs([a, b], steps, 0, 5000)
    assert [(j.id, j.submit_s) for j in loaded.jobs] == [("b", 0), ("a", 600)]
    first = loaded.jobs[1]
    assert (first.gpus, first.priority, first.preemptible, first.gpu_model) == (6, PriorityClass.HIGH, False, "H100")


@given(st.lists(st.tuples(st.floats(0, 1000), st.floats(0, 1000)), min_size=1, max_size=6))
def test_without_loss_the_duration_is_the_time_between_starts_and_stops(runs: list[tuple[float, float]]) -> None:
    t, steps, total = 0.0, [], 0.0
    for gap, ran in runs:
        t += gap
        steps.append((RESUMED, t))
        started, t = t, t + ran
        steps.append((SUSPENDED, t))
        total += t - started
    loaded = fold_jobs([job(at=0)], life(*steps), 0, t + 1)
    if total > 0:
        assert loaded.jobs[0].duration_s == pytest.approx(total)
    else:
        assert loaded.jobs == []


def test_the_latest_quota_of_each_team_is_the_current_one() -> None:
    def q(team: str, g: int) -> str:
        return msgspec.json.encode(TeamQuotaSet(team=team, pool="default", at=0, guaranteed_gpus=g)).decode()

    assert {t: x.guaranteed for t, x in current_quotas([q("a", 4), q("b", 2), q("a", 1)]).items()} == {"a": 1, "b": 2}


def test_since_takes_a_number_and_a_unit() -> None:
    assert [parse_since(s) for s in ("7d", "36h", "1.5h", "90m", "2w", "600s")] == [
        604800,
        129600,
        5400,
        5400,
        1209600,
        600,
    ]
    for bad in ("7", "0d", "-1d", "d7", "7 days", ""):
        with pytest.raises(TraceError, match="--since"):
            parse_since(bad)
