"""Idle reclaim wired in: the idle decider's verdicts and commands (services/idle/service.py), and the
scheduler acting on a `suspend` verdict as a preemption its owner resumes (services/scheduler/core/idle.py)."""

from __future__ import annotations

import random

import pytest

from events import JobPreempted, PreemptionReason
from events.commands import ResumeJob, SetIdlePolicy
from events.idle import IdleModeName, IdlePolicySet, JobIdleDetected, JobResumeRequested
from events.jobs import JobScheduled
from events.names import decode_request
from services.idle import service as idle
from services.idle import sim
from services.idle.core import IdleMode, IdleState, evolve
from services.runtime.commands import CommandRefused
from services.scheduler.core import explain
from services.scheduler.service import validate_resume
from tests.scheduler_builders import Driver, a_job, a_node

HOUR = 3600.0


def watched(state: IdleState, *, start: float, end: float, job: str = "j") -> list[JobIdleDetected]:
    """Fold idle telemetry of `job` from `start` to `end`, deciding after each sample."""
    out: list[JobIdleDetected] = []
    quiet = sim.idle_after(0.0, random.Random(1))
    for e in sim.samples(cluster="c", node="n1", gpus=2, start=start, end=end, interval_s=30.0, activity=quiet):
        evolve(state, e)
        due = [ev for ev, _ in idle.decide(state, e.observed_at) if isinstance(ev, JobIdleDetected)]
        for ev in due:  # folded back from the log, as the host does
            evolve(state, ev)
        out += due
    return out


def test_a_policy_set_by_command_is_the_event_the_decider_folds() -> None:
    state = IdleState()
    req = decode_request(b'{"team": " Vision ", "mode": "suspend", "idle_minutes": 20}', SetIdlePolicy)
    accepted = idle.validate_policy(state, req, now=100.0)
    [append] = accepted.appends
    assert isinstance(append.event, IdlePolicySet) and append.event.team == "vision"
    assert accepted.result["mode"] == "suspend" and accepted.result["idle_minutes"] == 20.0
    evolve(state, append.event)
    assert state.policy("vision").mode is IdleMode.SUSPEND
    assert idle.answer_idle(state, idle.NoArguments(), 0.0)["policies"]["vision"]["idle_minutes"] == 20.0


def test_a_bad_mode_is_refused_at_the_door() -> None:
    with pytest.raises(Exception, match="mode"):
        decode_request(b'{"team": "vision", "mode": "kill"}', SetIdlePolicy)


def test_a_job_is_judged_only_on_telemetry_watched_for_a_whole_window() -> None:
    """After a restart nothing of the telemetry is replayed: a job that ran for hours is not idle for
    lack of samples; it is flagged once the decider itself watched it idle for `idle_minutes`."""
    state = IdleState()
    evolve(state, IdlePolicySet(team="ml", at=0.0, mode=IdleModeName.NOTIFY, idle_minutes=30.0, grace_minutes=15.0))
    evolve(state, JobScheduled(job_id="j", at=0.0, team="ml", placements=sim.placement("c", "n1", 2), pool="p"))
    assert idle.decide(state, 5 * HOUR) == []  # hours since its start, but never watched
    out = watched(state, start=5 * HOUR, end=6 * HOUR)
    assert len(out) == 1 and out[0].action == "notify" and out[0].gpus == 2
    assert out[0].at - 5 * HOUR == pytest.approx(30 * 60.0, abs=31.0)
    assert "for 30 min" in out[0].reason


def test_samples_that_stop_are_no_evidence() -> None:
    state = IdleState()
    evolve(state, IdlePolicySet(team="ml", at=0.0, mode=IdleModeName.SUSPEND, idle_minutes=10.0, grace_minutes=0.0))
    evolve(state, JobScheduled(job_id="j", at=0.0, team="ml", placements=sim.placement("c", "n1", 2), pool="p"))
    assert watched(state, start=0.0, end=5 * 60.0) == []
    assert idle.decide(state, 2 * HOUR) == []  # the agent went away: not idle for it


def test_a_verdict_come_back_from_the_log_is_not_decided_again() -> None:
    state = IdleState()
    evolve(state, IdlePolicySet(team="ml", at=0.0, mode=IdleModeName.NOTIFY, idle_minutes=10.0, grace_minutes=0.0))
    evolve(state, JobScheduled(job_id="j", at=0.0, team="ml", placements=sim.placement("c", "n1", 2), pool="p"))
    evolve(state, JobIdleDetected(job_id="j", at=1.0, team="ml"))  # another replica decided it
    assert watched(state, start=0.0, end=HOUR) == []


def test_suspend_verdict_preempts_the_job_and_only_its_owner_resumes_it() -> None:
    d = Driver().given(a_node("n1"), a_job("idle-nb", gpus=4, at=1.0), a_job("train", gpus=4, at=2.0))
    d.cycle(now=10.0)
    assert d.state_of("idle-nb") == "running" and d.state_of("train") == "running"
    d.given(JobIdleDetected(job_id="idle-nb", at=4000.0, team="vision", action=IdleModeName.NOTIFY, idle_since=2000.0))
    d.cycle(now=4001.0)
    assert d.state_of("idle-nb") == "running"  # notify: a flag, nothing else
    text = explain(d.state, "idle-nb", d.waiting, now=4002.0)["text"]  # type: ignore[index]
    assert "flagged idle" in text and "policy is notify" in text
    d.given(JobIdleDetected(job_id="idle-nb", at=4100.0, team="vision", action=IdleModeName.SUSPEND, idle_since=2000.0))
    d.cycle(now=4101.0)
    assert d.state_of("idle-nb") == "suspended" and d.state_of("train") == "running"
    [preempted] = [e for e in d.log if isinstance(e, JobPreempted)]
    assert preempted.reason is PreemptionReason.IDLE and preempted.preemptor_job_id is None
    d.mark = None
    d.cycle(now=4200.0)  # free GPUs, yet it stays suspended: it waits for its owner
    assert d.state_of("idle-nb") == "suspended"
    assert "chamber resume idle-nb" in d.waiting["idle-nb"]
    assert "suspended as idle" in explain(d.state, "idle-nb", d.waiting, now=4201.0)["text"]  # type: ignore[index]
    with pytest.raises(CommandRefused, match="not suspended as idle"):
        validate_resume(d.state, ResumeJob(job="train"), now=4202.0)
    [append] = validate_resume(d.state, ResumeJob(job="idle-nb", by="alice"), now=4203.0).appends
    assert isinstance(append.event, JobResumeRequested)
    d.given(append.event)
    d.cycle(now=4204.0)
    assert d.state_of("idle-nb") == "running"


def test_a_stale_suspend_verdict_does_not_touch_a_later_run() -> None:
    d = Driver().given(a_node("n1"), a_job("j", gpus=4, at=1.0))
    d.cycle(now=10.0)
    d.given(JobIdleDetected(job_id="j", at=50.0, team="vision", action=IdleModeName.SUSPEND))
    d.state.idle_reclaim["j"].generation -= 1  # as if the verdict was about the run before this one
    d.cycle(now=60.0)
    assert d.state_of("j") == "running"


def test_the_gateway_job_view_shows_the_flag_of_the_current_run() -> None:
    from events import JobResumed, JobSpec, JobSubmitted
    from services.gateway import core as gateway
    from services.gateway import views

    state = gateway.GatewayState()
    placements = sim.placement("c", "n1", 2)
    gateway.evolve(state, JobSubmitted(job_id="nb", at=0.0, spec=JobSpec(team="ml", gpus_per_replica=2)))
    gateway.evolve(state, JobScheduled(job_id="nb", at=1.0, team="ml", placements=placements, pool="p"))
    assert views.job_view(state.jobs["nb"]).idle is None
    reason = "no SM activity, memory change or collective progress on its 2 GPU(s) for 30 min"
    flag = JobIdleDetected(job_id="nb", at=1900.0, team="ml", idle_since=100.0, gpus=2, reason=reason)
    gateway.evolve(state, flag)
    shown = views.job_view(state.jobs["nb"]).idle
    assert shown is not None and reason in shown and "notify" in shown
    gateway.evolve(state, JobResumed(job_id="nb", at=2000.0, placements=placements, pool="p"))
    assert views.job_view(state.jobs["nb"]).idle is None  # a new run


def test_billing_counts_the_gpu_hours_reclaimed_per_team_until_the_owner_resumes() -> None:
    from events import JobResumed
    from services.billing import core as billing
    from services.billing.service import ReclaimedRequest, answer_reclaimed

    state = billing.BillingState()
    t0 = 1_764_547_200.0  # 2025-12-01 00:00 UTC
    for job, gpus in (("nb", 4), ("other", 2)):
        billing.evolve(state, JobIdleDetected(job_id=job, at=t0, team="vision", action=IdleModeName.SUSPEND, gpus=gpus))
        billing.evolve(
            state, JobPreempted(job_id=job, at=t0 + 10, team="vision", reason=PreemptionReason.IDLE, detail="idle")
        )
    billing.evolve(state, JobResumed(job_id="nb", at=t0 + 10 + 1800, placements=[], pool="p"))
    # nb: 4 GPUs x 0.5 h closed; other: 2 GPUs x 1 h still open at `now`
    answer = answer_reclaimed(state, ReclaimedRequest(), t0 + 10 + 3600)
    assert answer["gpu_hours_by_team"] == {"vision": pytest.approx(4.0)}
    assert answer_reclaimed(state, ReclaimedRequest(month="2025-11"), t0 + 3610)["gpu_hours_by_team"] == {}
    # a preemption for another reason reclaims nothing
    billing.evolve(state, JobPreempted(job_id="x", at=t0, team="nlp", reason=PreemptionReason.PRIORITY))
    assert "nlp" not in answer_reclaimed(state, ReclaimedRequest(), t0 + 7200)["gpu_hours_by_team"]
