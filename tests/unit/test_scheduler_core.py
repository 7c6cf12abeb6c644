"""The scheduler's pure core, scenario by scenario."""

from __future__ import annotations

import pytest

from events import (
    GpuIsolated,
    JobPreempted,
    JobResumed,
    JobScheduled,
    JobSuspended,
    NodeIsolated,
    PoolDefined,
)
from events.codec import stable_id
from services.scheduler.core import Admit, Policy, Preempt, Requeue, explain, queue_rows, select_victims
from tests.scheduler_builders import Driver, a_job, a_node, a_quota, done


def test_a_job_that_fits_one_node_goes_to_the_fullest_node_that_fits() -> None:
    d = Driver().given(a_node("n1"), a_node("n2"), a_job("small", gpus=6, at=1))
    d.cycle()
    assert d.where("small") == {"n1": [0, 1, 2, 3, 4, 5]}
    d.given(a_job("two", gpus=2, at=2))
    d.cycle()
    assert d.where("two") == {"n1": [6, 7]}  # best fit: fills n1 rather than breaking n2


def test_a_gang_is_placed_whole_or_not_at_all() -> None:
    d = Driver().given(a_node("n1"), a_node("n2"), a_job("gang", gpus=8, replicas=3))
    cycle = d.cycle()
    assert cycle.decisions == [] and d.state_of("gang") == "pending"
    assert "waiting for capacity" in d.waiting["gang"]
    assert d.state.capacity.class_free == [16]  # nothing was left half-taken


def test_a_gang_prefers_one_rack() -> None:
    d = Driver().given(
        a_node("a1", rack="a"),
        a_node("b1", rack="b"),
        a_node("b2", rack="b"),
        a_node("a2", rack="a"),
        a_job("busy", gpus=4, at=0),
    )
    d.cycle()
    assert d.where("busy") == {"a1": [0, 1, 2, 3]}
    d.given(a_job("gang", gpus=8, replicas=2, at=1))
    d.cycle()
    assert set(d.where("gang")) == {"b1", "b2"}  # rack b is whole; rack a would need a1's leftovers


def test_queue_order_is_priority_then_fair_share_then_submit_time() -> None:
    from events import FairShareUpdated

    d = Driver().given(
        a_node("n1", gpus=2),
        a_job("late-high", gpus=1, priority="high", at=5, team="a"),
        a_job("early-normal", gpus=1, at=1, team="a"),
        a_job("heavy-user", gpus=1, at=0, team="b"),
        FairShareUpdated(team="b", pool="default", at=0, factor=0.2, decayed_usage_gpu_s=1e6, share=0.5),
    )
    d.cycle()
    assert d.state_of("late-high") == "running" and d.state_of("early-normal") == "running"
    assert d.state_of("heavy-user") == "pending"


def test_a_team_borrows_idle_quota_up_to_its_borrow_limit() -> None:
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_quota("vision", 8),
        a_quota("nlp", 8, borrow=4),
        a_job("b1", team="nlp", gpus=8, at=1),
        a_job("b2", team="nlp", gpus=4, at=2),
        a_job("b3", team="nlp", gpus=2, at=3),
    )
    cycle = d.cycle()
    admitted = {x.job_id: x.borrowed_gpus for x in cycle.decisions if isinstance(x, Admit)}
    assert admitted == {"b1": 0, "b2": 4}
    assert "borrow limit 4" in d.waiting["b3"]


def test_reclaim_preempts_the_borrower_and_it_resumes_when_the_lender_finishes() -> None:
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_quota("vision", 8),
        a_quota("nlp", 8),
        a_job("own", team="nlp", gpus=8, at=1),
        a_job("borrow", team="nlp", gpus=8, priority="low", at=2, checkpoint=60),
    )
    d.cycle(now=10)
    assert d.state_of("borrow") == "running" and d.state.jobs["borrow"].borrowed_gpus == 8
    d.given(a_job("urgent", team="vision", gpus=8, priority="high", at=20))
    cycle = d.cycle(now=100)
    preempts = [x for x in cycle.decisions if isinstance(x, Preempt)]
    assert [(p.job_id, p.reason.value, p.preemptor) for p in preempts] == [("borrow", "reclaim", "urgent")]
    assert preempts[0].lost_work_gpu_s == (90 % 60) * 8
    assert d.state_of("borrow") == "suspended" and d.state_of("urgent") == "running"
    assert "preempted by urgent (reclaim" in explain(d.state, "borrow", d.waiting)["text"]
    d.given(done("urgent", at=200))
    cycle = d.cycle(now=200)
    assert [type(x) for x in cycle.decisions] == [Admit] and cycle.decisions[0].resume
    assert d.state_of("borrow") == "running"


def test_reclaim_leaves_a_team_within_its_guarantee_alone() -> None:
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_quota("vision", 8),
        a_quota("nlp", 8),
        a_job("nlp-own", team="nlp", gpus=8, priority="low"),
        a_job("vision-own", team="vision", gpus=8, priority="low"),
    )
    d.cycle()
    d.given(a_job("vision-more", team="vision", gpus=8, priority="high", at=5))
    d.cycle()
    assert d.state_of("nlp-own") == "running"  # nlp is at its guarantee: vision may only preempt its own
    assert d.state_of("vision-own") == "suspended" and d.state_of("vision-more") == "running"
    assert d.state.jobs["vision-own"].preempt_reason == "priority"


def test_victims_lose_the_least_work_and_only_as_many_as_needed() -> None:
    d = Driver().given(
        a_node("n1", gpus=4),
        a_node("n2", gpus=4),
        a_job("old", gpus=4, priority="low", at=0),
        a_job("new", gpus=4, priority="low", at=1),
    )
    d.cycle(now=0)
    d.state.jobs["new"].running_since = 90.0  # started later: less work to lose
    d.given(a_job("urgent", gpus=4, priority="high", at=95))
    before = d.state.capacity.digest(), dict(d.state.usage)
    assert select_victims(d.state, "urgent", now=100) == [("new", select_victims(d.state, "urgent", 100)[0][1])]
    assert (d.state.capacity.digest(), dict(d.state.usage)) == before  # computing victims changes nothing


def test_a_job_preempted_before_weighs_its_loss_by_one_more_than_its_preemptions() -> None:
    d = Driver().given(
        a_node("n1", gpus=4),
        a_node("n2", gpus=4),
        a_job("steady", gpus=4, priority="low", at=0),
        a_job("bumped", gpus=4, priority="low", at=1),
    )
    d.cycle(now=0)
    d.given(a_job("urgent", gpus=4, priority="high", at=95))
    d.state.jobs["bumped"].running_since = 60.0  # restarted later: 40 s lost against steady's 100 s
    assert [v for v, _ in select_victims(d.state, "urgent", now=100)] == ["bumped"]
    d.state.jobs["bumped"].preemptions = 2  # but already re-run twice: 40 x 3 > 100
    assert [v for v, _ in select_victims(d.state, "urgent", now=100)] == ["steady"]


def test_no_preemption_unless_the_preemptor_then_fits() -> None:
    d = Driver().given(
        a_node("n1", gpus=4), a_job("low", gpus=2, priority="low"), a_job("big", gpus=8, priority="high", at=2)
    )
    d.cycle()
    assert select_victims(d.state, "big", now=10) is None
    assert d.state_of("low") == "running"


def test_critical_work_preempts_lower_classes_of_other_teams() -> None:
    d = Driver().given(
        a_node("n1"), a_quota("a", 8), a_quota("b", 0, critical=True), a_job("a-normal", team="a", gpus=8)
    )
    d.cycle()
    d.given(a_job("b-critical", team="b", gpus=8, priority="critical", at=3))
    cycle = d.cycle()
    assert [(x.job_id, x.reason.value) for x in cycle.decisions if isinstance(x, Preempt)] == [("a-normal", "critical")]
    # explain says why the victim could be preempted, and who may take the borrowed GPUs back
    said = explain(d.state, "b-critical", d.waiting)["text"]
    assert "after preempting a-normal (preemptible by critical work of any team)" in said
    assert "(8 GPUs borrowed: the team that lent them may take them back)" in said


def test_a_job_moved_off_an_isolated_node_by_preempting_says_why_it_moved() -> None:
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_quota("a", 8),
        a_quota("b", 8, critical=True),
        a_job("crit", team="b", gpus=8, priority="critical"),
    )
    d.cycle()
    d.given(a_job("a-normal", team="a", gpus=8, at=2))
    d.cycle(now=10)
    assert set(d.where("crit")) == {"n1"} and set(d.where("a-normal")) == {"n2"}
    d.given(NodeIsolated(cluster="c1", node="n1", at=20, reason="xid 79", fault_ids=["f1"]))
    d.cycle(now=21)
    assert set(d.where("crit")) == {"n2"} and d.state_of("a-normal") == "suspended"
    said = explain(d.state, "crit", d.waiting)["text"]
    assert "after preempting a-normal" in said and "moved here: a GPU or node it ran on went out of service" in said


def test_jobs_on_an_isolated_node_or_gpu_are_requeued_and_resume_elsewhere() -> None:
    d = Driver().given(a_node("n1"), a_node("n2", gpus=4), a_job("big", gpus=6), a_job("small", gpus=3, at=2))
    d.cycle()
    assert set(d.where("big")) == {"n1"} and set(d.where("small")) == {"n2"}
    d.given(NodeIsolated(cluster="c1", node="n1", at=20, reason="xid 79", fault_ids=["f1", "f2"]))
    cycle = d.cycle(now=21)
    assert [type(x) for x in cycle.decisions] == [Requeue]  # 6 GPUs do not fit on n2's 1 free one
    [requeue] = cycle.decisions
    assert isinstance(requeue, Requeue) and requeue.fault_ids == ("f1", "f2")  # the requeue says why
    assert requeue.reason == "a GPU or node it ran on went out of service (n1: xid 79)"
    assert d.state_of("big") == "pending" and "requeued" in d.state.jobs["big"].reason
    d.given(GpuIsolated(cluster="c1", node="n2", gpu_index=0, at=22, reason="ecc", fault_ids=["f3"]))
    [requeue, _] = d.cycle(now=23).decisions
    assert isinstance(requeue, Requeue) and (requeue.reason, requeue.fault_ids) == (
        "a GPU or node it ran on went out of service (n2 GPU 0: ecc)",
        ("f3",),
    )
    assert d.where("small") == {"n2": [1, 2, 3]}  # requeued and resumed on the node's healthy GPUs
    d.given(a_node("n3"))
    d.cycle(now=30)
    assert d.where("big") == {"n3": [0, 1, 2, 3, 4, 5]}


def test_easy_backfill_lets_short_jobs_run_but_not_delay_the_reserved_one() -> None:
    d = Driver().given(a_node("n1", gpus=4), a_job("running", gpus=3, estimate=100, at=0))
    d.cycle(now=0)
    d.given(
        a_job("wide", gpus=4, at=1),
        a_job("short", gpus=1, at=2, estimate=50),
        a_job("long", gpus=1, at=3, estimate=500),
    )
    d.cycle(now=10)
    assert d.state_of("wide") == "pending" and "reserved" in d.waiting["wide"]
    assert d.state_of("short") == "running"  # ends (t=60) before the reservation (t=100)
    assert d.state_of("long") == "pending" and "backfill: would delay wide" in d.waiting["long"]


def test_pools_select_nodes_by_model_and_jobs_by_team_quota() -> None:
    d = Driver().given(
        a_node("h1", model="H100"),
        a_node("a1", model="A100"),
        PoolDefined(pool="hopper", at=0, gpu_model="H100"),
        a_quota("vision", 8, pool="hopper"),
        a_job("v", team="vision", gpus=8),
        a_job("x", team="other", gpus=8, at=2),
        a_job("y", team="other", gpus=1, at=3),
    )
    d.cycle()
    assert d.where("v") == {"h1": list(range(8))} and d.where("x") == {"a1": list(range(8))}
    assert "waiting for capacity" in d.waiting["y"]


def test_decisions_become_events_with_stable_ids() -> None:
    from services.scheduler.core import events_for

    d = Driver().given(a_node("n1"), a_job("j", gpus=2))
    cycle = d.cycle()
    [(event, eid)] = events_for(cycle.decisions, 10.0)
    assert isinstance(event, JobScheduled) and eid == stable_id("scheduled", "j", 0)
    assert event.placements[0].gpu_indices == [0, 1]
    # a preemption, then the resume: each id names the kind, the job and the job's generation
    p = Driver().given(a_node("n1"), a_quota("a", 8), a_job("low", team="a", gpus=8, priority="low"))
    p.cycle(now=0.0)
    p.given(a_job("hi", team="a", gpus=8, at=5, priority="high"))
    assert [(type(e), eid) for e, eid in events_for(p.cycle(now=10.0).decisions, 10.0)] == [
        (JobPreempted, stable_id("preempted", "low", 1)),
        (JobSuspended, stable_id("suspended", "low", 1)),
        (JobScheduled, stable_id("scheduled", "hi", 0)),
    ]
    p.given(done("hi", at=20))
    resumed = events_for(p.cycle(now=30.0).decisions, 30.0)
    assert [(type(e), eid) for e, eid in resumed] == [(JobResumed, stable_id("resumed", "low", 2))]


def test_queue_rows_and_explain_answer_for_every_state() -> None:
    d = Driver().given(a_node("n1", gpus=2), a_job("run", gpus=2), a_job("wait", gpus=2, at=2))
    d.cycle()
    rows = {r["id"]: r for r in queue_rows(d.state, d.waiting, now=10.0)}
    assert rows["run"]["state"] == "running" and rows["run"]["placement"] == {"n1": [0, 1]}
    assert rows["wait"]["state"] == "pending" and "waiting for capacity" in rows["wait"]["reason"]
    assert "is running on n1[0,1]" in explain(d.state, "run", d.waiting)["text"]
    d.given(done("run"))
    assert "is completed" in explain(d.state, "run", d.waiting)["text"]
    assert explain(d.state, "nope", d.waiting) is None


def test_an_incremental_cycle_only_looks_at_new_jobs() -> None:
    d = Driver().given(a_node("n1", gpus=2), *(a_job(f"j{i}", gpus=2, at=i) for i in range(50)))
    assert d.cycle().full
    d.given(a_job("new", gpus=2, at=99))
    cycle = d.cycle()
    assert not cycle.full and cycle.considered == 1
    d.given(done("j0"))
    cycle = d.cycle()
    assert cycle.full and d.state_of("j1") == "running"


def test_when_capacity_shrinks_below_guarantees_reclaim_still_spares_a_team_at_its_guarantee() -> None:
    d = Driver().given(
        a_node("n1"), a_node("n2"), a_quota("a", 8), a_quota("b", 8), a_job("b-own", team="b", gpus=8, priority="low")
    )
    d.cycle()
    node = next(iter(d.where("b-own")))
    d.given(NodeIsolated(cluster="c1", node="n2" if node == "n1" else "n1", at=5, reason="xid"))
    d.given(a_job("a-needs", team="a", gpus=8, priority="high", at=6))
    cycle = d.cycle(now=7)
    assert cycle.decisions == [] and d.state_of("b-own") == "running"
    assert "waiting for capacity" in d.waiting["a-needs"] or "quota" in d.waiting["a-needs"]


def test_a_lend_limit_keeps_part_of_an_idle_guarantee_back() -> None:
    d = Driver().given(
        a_node("n1"), a_node("n2"), a_quota("owner", 8, lend=2), a_quota("borrower", 8),
        a_job("big", team="borrower", gpus=8, replicas=2),
        a_job("small", team="borrower", gpus=2, at=2),
        a_job("more", team="borrower", gpus=2, at=3),
    )  # fmt: skip
    d.cycle()
    assert d.state_of("big") == "pending" and "quota: pool default has 10 GPUs" in d.waiting["big"]
    assert d.state_of("small") == "running" and d.state_of("more") == "running"
    d.given(a_job("third", team="borrower", gpus=8, at=4))
    d.cycle()
    assert "quota" in d.waiting["third"]  # 6 of owner's 8 idle GPUs are never lent


def test_a_gang_never_spans_clusters() -> None:
    d = Driver().given(a_node("a1", cluster="east"), a_node("b1", cluster="west"), a_job("gang", gpus=8, replicas=2))
    d.cycle()
    assert d.state_of("gang") == "pending"
    d.given(a_node("a2", cluster="east"))
    d.cycle()
    assert set(d.where("gang")) == {"a1", "a2"}


def test_explain_says_why_a_job_was_cancelled_or_failed() -> None:
    from events import JobCancelled, JobFailed

    d = Driver().given(a_node("n1"), a_job("c", gpus=2), a_job("f", gpus=2, at=2))
    d.cycle()
    d.given(JobCancelled(job_id="c", at=20, by="cli", reason="wrong data"), JobFailed(job_id="f", at=21, reason="OOM"))
    assert "is cancelled: cancelled by cli: wrong data" in explain(d.state, "c", d.waiting)["text"]
    assert "is failed: failed: OOM" in explain(d.state, "f", d.waiting)["text"]


def test_a_job_that_can_never_fit_says_so_and_reserves_nothing() -> None:
    d = Driver().given(a_node("n1", gpus=4), a_job("running", gpus=2, estimate=100, at=0))
    d.cycle(now=0)
    d.given(a_job("huge", gpus=16, at=1), a_job("long", gpus=1, at=2, estimate=10_000))
    d.cycle(now=5)
    assert "no node has 16 GPUs (the largest has 4)" in d.waiting["huge"]
    assert d.state_of("long") == "running"  # not held back for a job that cannot ever start


def test_baseline_policies_run_through_the_same_cycle() -> None:
    from services.scheduler.core import POLICIES, schedule

    d = Driver().given(
        a_node("n1", gpus=4), a_quota("a", 2), a_quota("b", 2),
        a_job("a-first", team="a", gpus=4, at=1), a_job("b-urgent", team="b", gpus=2, priority="high", at=2),
    )  # fmt: skip
    admitted = {name: [x.job_id for x in schedule(d.state, 5.0, policy=p).decisions] for name, p in POLICIES.items()}
    assert admitted["fifo"] == ["a-first"]  # submit order, no quotas
    assert admitted["chamber"] == ["b-urgent"]  # priority first; a-first may not borrow past what b holds back
    assert admitted["static-quota"] == ["b-urgent"]  # a-first exceeds a's guarantee of 2
    assert "static quota" in schedule(d.state, 5.0, policy=POLICIES["static-quota"]).waiting["a-first"]


def test_a_gang_may_name_its_own_topology_label() -> None:
    from events import JobSpec, JobSubmitted

    d = Driver().given(
        a_node("a1", zone="z1"), a_node("b1", zone="z2"), a_node("a2", zone="z1"), a_node("b2", zone="z2"),
        a_job("busy", gpus=4, at=0),
    )  # fmt: skip
    d.cycle()
    spec = JobSpec(team="vision", gpus_per_replica=8, replicas=2, topology_key="zone")
    d.given(JobSubmitted(job_id="gang", at=1, spec=spec))
    d.cycle()
    assert set(d.where("gang")) == {"b1", "b2"}  # zone z2 is whole (by node order alone: b1 and a2)


def test_replaying_jobs_ahead_of_the_fleet_gives_the_same_state() -> None:
    d = Driver().given(a_node("n1"), a_job("j", gpus=3))
    d.cycle()
    jobs_first = Driver().given(*[e for e in d.log if not hasattr(e, "node")], a_node("n1"))
    assert jobs_first.state.capacity.digest() == d.state.capacity.digest()
    assert not jobs_first.state.displaced and jobs_first.where("j") == {"n1": [0, 1, 2]}
    assert jobs_first.state.nodes[("c1", "n1")].owners == {0: "j", 1: "j", 2: "j"}


def two_teams_of_a_node_each(*jobs: object) -> Driver:
    """Two 8-GPU nodes, vision and nlp guaranteed one each, and `jobs`."""
    return Driver().given(a_node("n1"), a_node("n2"), a_quota("vision", 8), a_quota("nlp", 8), *jobs)


def a_borrower_running_since(t: float, *, estimate: float | None) -> Driver:
    """nlp borrows vision's idle node with a low job that has run since `t`; vision wants it back."""
    d = two_teams_of_a_node_each(
        a_job("own", team="nlp", gpus=8, at=0),
        a_job("borrow", team="nlp", gpus=8, priority="low", at=0, estimate=estimate),
    )
    d.cycle(now=t)
    d.given(a_job("urgent", team="vision", gpus=8, priority="high", at=t + 1))
    return d


def test_no_preemption_that_throws_away_more_work_than_the_wait_it_saves() -> None:
    """Issue 19: the borrower ends in 10 minutes by its estimate; preempting it after 5 hours would
    throw away 40 GPU-hours to save 80 GPU-minutes of waiting (worth 2: twice that, at most)."""
    d = a_borrower_running_since(0, estimate=5 * 3600 + 600)
    cycle = d.cycle(now=5 * 3600)
    assert not [x for x in cycle.decisions if isinstance(x, Preempt)]
    assert d.state_of("borrow") == "running" and d.state_of("urgent") == "pending"
    assert (
        "not preempting borrow: they would lose 40.0 GPU-hours, more than waiting for GPUs that free from "
        "about 1970-01-01 05:10:00 UTC (in 10 min) costs (1.3 GPU-hours)"
    ) in d.waiting["urgent"]
    d.given(done("borrow", at=18600))
    d.cycle(now=18600)
    assert d.state_of("urgent") == "running"


def test_preemption_when_the_wait_costs_more_than_the_work_lost_or_has_no_estimate() -> None:
    soon = a_borrower_running_since(0, estimate=3600)  # 5 min in (0.7 GPU-hours) of 60: waiting 55 min costs more
    soon.cycle(now=300)
    assert soon.state_of("borrow") == "suspended" and soon.state_of("urgent") == "running"
    unknown = a_borrower_running_since(0, estimate=None)  # no estimate: the wait is unknown, preempt as before
    unknown.cycle(now=5 * 3600)
    assert unknown.state_of("borrow") == "suspended" and unknown.state_of("urgent") == "running"
    always = a_borrower_running_since(0, estimate=5 * 3600 + 600)  # the old rule: preemption_worth None
    always.cycle(now=5 * 3600, policy=Policy(preemption_worth=None))
    assert always.state_of("borrow") == "suspended"


def test_a_victim_that_starved_before_it_started_counts_the_wait_it_would_face_again() -> None:
    """A borrower that queued 25 h before it started, 5 minutes in: its lost work is small, but
    thrown back it queues again (8 GPUs x 25 h = 200 GPU-hours), more than twice the 55 minutes the
    urgent job waits for it to end by its estimate. Counted by its lost work alone, it is preempted."""
    start = 25 * 3600

    def starved_borrower(policy: Policy) -> Driver:
        d = two_teams_of_a_node_each(
            a_job("own", team="nlp", gpus=8, at=0),
            a_job("blocker", team="vision", gpus=8, at=0, estimate=start),
            a_job("borrow", team="nlp", gpus=8, priority="low", at=0, estimate=3600),
        )
        d.cycle(now=0, policy=policy)
        assert d.state_of("borrow") == "pending"
        d.given(done("blocker", at=start))
        d.cycle(now=start, policy=policy)
        assert d.state_of("borrow") == "running"  # on vision's idle guarantee, after 25 h queued
        d.given(a_job("urgent", team="vision", gpus=8, priority="high", at=start + 300))
        d.cycle(now=start + 300, policy=policy)
        return d

    d = starved_borrower(Policy())
    assert d.state_of("borrow") == "running" and d.state_of("urgent") == "pending"
    assert "not preempting borrow: they would lose 200.7 GPU-hours (200.0 of them queued again" in d.waiting["urgent"]
    lost_work_only = starved_borrower(Policy(worth_counts_wait_again=False))
    assert lost_work_only.state_of("borrow") == "suspended" and lost_work_only.state_of("urgent") == "running"


def test_preemption_worth_must_be_a_positive_number() -> None:
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="preemption_worth"):
            Policy(preemption_worth=bad)
