"""Issue 19 in the scheduler core: one preemption rule, age in the queue order, the starvation guard,
and non-preemptible work that borrows only lent idle guarantees (given back by draining) and is not
held back by lower classes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import PreemptionReason, PriorityClass
from services.scheduler.core import CHAMBER, Admit, Preempt, events_for, explain, quota, schedule
from services.scheduler.core.policy import STRICT_CLASSES, Policy, by_multifactor_priority
from services.scheduler.core.preemption import eligible
from services.scheduler.core.quota import nonpreemptible
from services.scheduler.core.work import Work
from services.timefmt import when
from tests.scheduler_builders import Driver, a_job, a_node, a_quota, done

CRIT, HIGH, NORMAL, LOW = (PriorityClass(c).rank for c in ("critical", "high", "normal", "low"))
HOUR = 3600.0


# -- the preemption rule, as a table ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("rank", "victim_team", "victim_rank", "reclaim", "borrowing", "urgent", "expected"),
    [
        (HIGH, "a", LOW, False, False, False, PreemptionReason.PRIORITY),  # same team, less urgent
        (HIGH, "a", HIGH, False, False, False, None),  # same team, same class: never
        (LOW, "a", HIGH, True, True, False, None),  # same team, more urgent: never
        (NORMAL, "b", NORMAL, True, True, False, PreemptionReason.RECLAIM),  # lender takes back
        (NORMAL, "b", NORMAL, True, False, False, None),  # b is within its guarantee
        (LOW, "b", HIGH, True, True, False, None),  # never reclaim from more urgent work
        (NORMAL, "b", LOW, False, True, False, None),  # beyond its own guarantee: no reclaim
        (HIGH, "b", LOW, False, True, True, PreemptionReason.RECLAIM),  # urgent: lower-class borrower
        (HIGH, "b", HIGH, False, True, True, None),  # urgent, but not a lower class
        (HIGH, "b", LOW, False, False, True, PreemptionReason.PRIORITY),  # urgent: lower class, any team
        (HIGH, "b", HIGH, False, False, True, None),  # urgent, but not a lower class
        (CRIT, "b", LOW, False, False, False, PreemptionReason.CRITICAL),
        (CRIT, "b", CRIT, False, False, False, None),
    ],
)
def test_one_rule_says_who_may_preempt_whom(
    rank: int,
    victim_team: str,
    victim_rank: int,
    reclaim: bool,
    borrowing: bool,
    urgent: bool,
    expected: PreemptionReason | None,
) -> None:
    got = eligible("a", rank, victim_team, victim_rank, reclaim=reclaim, victim_borrowing=borrowing, urgent=urgent)
    assert got == expected


# -- age in the queue order ------------------------------------------------------------------------
def _busy_then_free(policy: Policy, waited: float) -> str:
    """One 8-GPU node, busy; a normal job queued at t=0 and a high one at t=`waited`; the node
    frees: which of the two gets it?"""
    fixed = {"gpus": 8, "preemptible": False}  # preemption goes by class alone: keep it out of this
    d = Driver().given(a_node("n1"), a_job("busy", at=0, priority="low", **fixed))  # type: ignore[arg-type]
    schedule_and_fold(d, 0.0, policy)
    d.given(
        a_job("old-normal", at=1.0, **fixed),  # type: ignore[arg-type]
        a_job("new-high", at=waited, priority="high", **fixed),  # type: ignore[arg-type]
    )
    schedule_and_fold(d, waited, policy)
    d.given(done("busy", at=waited + 1))
    schedule_and_fold(d, waited + 1, policy)
    return next(j for j in ("old-normal", "new-high") if d.state_of(j) == "running")


def schedule_and_fold(d: Driver, now: float, policy: Policy) -> None:
    from services.scheduler.core import events_for

    cycle = schedule(d.state, now, None, policy=policy)
    d.waiting.update(cycle.waiting)
    for event, _ in events_for(cycle.decisions, now):
        d.given(event)


def test_age_orders_work_within_its_class_and_never_lifts_it_above_a_higher_class() -> None:
    """Classes are strict in the default order (the starvation guard, not age, bounds a class's
    tail): fair share plus age stay below one class step, so however long a job waited and however
    good its team's share, it ranks below fresh work of the next class up with the worst share."""
    assert CHAMBER.fair_share_weight + CHAMBER.age_weight < CHAMBER.class_weight / 3
    for rank, up in ((LOW, NORMAL), (NORMAL, HIGH), (HIGH, CRIT)):
        aged = CHAMBER.priority((rank, -1.0, 0.0, "old"), CHAMBER.age_cap_s * 5)  # the best share, any age
        fresh = CHAMBER.priority((up, 0.0, 9.0, "new"), 0.0)  # the worst share, just queued
        assert aged < fresh
    # within a class, age counts up to the cap
    young = CHAMBER.priority((LOW, -0.5, 0.0, "l"), CHAMBER.age_cap_s / 2)
    assert (
        young
        < CHAMBER.priority((LOW, -0.5, 0.0, "l"), CHAMBER.age_cap_s)
        == CHAMBER.priority((LOW, -0.5, 0.0, "l"), CHAMBER.age_cap_s * 9)
    )


def test_age_lets_a_long_waiting_job_pass_fresher_work_of_a_higher_class() -> None:
    aging = replace(CHAMBER, starvation_bound_s=None, age_weight=1500.0)  # one and a half classes at the cap
    assert _busy_then_free(aging, waited=CHAMBER.age_cap_s / 4) == "new-high"  # a little age: class wins
    assert _busy_then_free(aging, waited=CHAMBER.age_cap_s + 10) == "old-normal"
    assert _busy_then_free(STRICT_CLASSES, waited=CHAMBER.age_cap_s * 10) == "new-high"  # no age: strict classes


def test_age_never_lifts_a_job_above_critical_work() -> None:
    policy = replace(CHAMBER, starvation_bound_s=None, age_weight=5000.0)  # even with a huge age weight
    order = by_multifactor_priority(policy, lambda jid: 0.0 if jid != "crit" else 1e9, 1e9)
    for rank in (HIGH, NORMAL, LOW):
        key_aged = (rank, -1.0, 0.0, "aged")
        key_crit_fresh = (CRIT, -0.001, 100.0, "crit")  # the lowest fair share, just submitted
        assert policy.priority(key_aged, 1e9) < policy.priority(key_crit_fresh, 0.0)
        assert order(key_crit_fresh) < order(key_aged)


def test_policy_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="age_cap_s"):
        Policy(age_cap_s=0)
    with pytest.raises(ValueError, match="starvation_bound_s"):
        Policy(starvation_bound_s=-1)


# -- the starvation guard --------------------------------------------------------------------------
def test_a_protected_job_holds_a_reservation_later_urgent_arrivals_cannot_pass() -> None:
    # the normal gang, once protected, queues with high work (by default it stays in its class)
    policy = replace(CHAMBER, starvation_bound_s=100.0, age_weight=0.0, guard_lifts_classes=1)
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_job("h0", gpus=8, at=0, priority="high", estimate=60),
        a_job("gang", gpus=8, replicas=2, at=0, estimate=10),
    )
    schedule_and_fold(d, 0.0, policy)
    assert d.state_of("h0") == "running" and d.state_of("gang") == "pending"
    # Without the guard, each new high job takes the free node first and the gang never has two.
    d.given(a_job("h1", gpus=8, at=50, priority="high", estimate=60))
    schedule_and_fold(d, 50.0, policy)
    assert d.state_of("h1") == "running"
    d.given(done("h0", at=110), a_job("h2", gpus=8, at=110, priority="high", estimate=60))
    schedule_and_fold(d, 110.0, policy)  # queued 110 s > bound: the gang is protected, first in line
    assert d.state_of("h2") == "pending" and d.state_of("gang") == "pending"
    assert "protected by the starvation guard since 1970-01-01 00:01:40 UTC (10 s ago)" in d.waiting["gang"]
    assert "backfill: would delay gang" in d.waiting["h2"]
    d.given(done("h1", at=120))
    schedule_and_fold(d, 120.0, policy)
    assert d.state_of("gang") == "running"


def test_while_a_protected_job_waits_for_capacity_later_jobs_do_not_take_the_free_gpus() -> None:
    # the low job, once protected, queues ahead of high work (by default it stays in its class)
    policy = replace(CHAMBER, starvation_bound_s=100.0, guard_holds_free_gpus=True, guard_lifts_classes=2)
    d = Driver().given(
        a_node("n1"),
        a_job("busy", gpus=4, at=0, priority="high"),  # no runtime estimate: no EASY reservation
        a_job("whole", gpus=8, at=1, priority="low"),
    )
    schedule_and_fold(d, 1.0, policy)
    assert d.state_of("busy") == "running" and d.state_of("whole") == "pending"
    first = schedule(d.state, 110.0, None, policy=policy)  # "whole" is protected from t=101
    assert first.decisions == [] and "protected by the starvation guard" in first.waiting["whole"]
    d.given(a_job("fresh", gpus=2, at=111, priority="high"))
    later = schedule(d.state, 111.0, first.mark, policy=policy)  # incremental: looks only at "fresh"
    assert not later.full and later.decisions == []
    assert later.waiting["fresh"].startswith("held back: whole is protected by the starvation guard")
    d.given(done("busy", at=120))
    schedule_and_fold(d, 120.0, policy)
    assert d.state_of("whole") == "running" and d.state_of("fresh") == "pending"
    default = Driver().given(a_node("n1"), a_job("busy", gpus=4, at=0, priority="high"), a_job("whole", gpus=8, at=1))
    schedule_and_fold(default, 1.0, replace(policy, guard_holds_free_gpus=False))
    default.given(a_job("fresh", gpus=2, at=111, priority="high"))
    schedule_and_fold(default, 111.0, replace(policy, guard_holds_free_gpus=False))
    assert default.state_of("fresh") == "running"  # the default: the small job passes


def test_explain_says_when_the_guard_protects_a_job_and_since_when() -> None:
    d = Driver().given(a_node("n1", gpus=4), a_job("big", gpus=8, at=10))
    schedule_and_fold(d, 20.0, CHAMBER)
    early = explain(d.state, "big", d.waiting, now=20.0, policy=CHAMBER)
    assert early is not None
    bound = CHAMBER.starvation_bound_s
    assert bound is not None
    assert early["starvation_guard"] == {"queued_since": 10.0, "protected_since": 10 + bound, "protected": False}
    assert f"protects it from {when(10 + bound, 20.0)} if it still waits" in early["text"]
    assert "(in 23 h 59 min)" in early["text"]  # a time people read: ISO and how far from now
    late = explain(d.state, "big", d.waiting, now=10 + bound + 1, policy=CHAMBER)
    assert late is not None and late["starvation_guard"]["protected"] is True
    assert f"protected by the starvation guard since {when(10 + bound, 11 + bound)}" in late["text"]


def test_a_preempted_job_ages_from_when_it_rejoined_the_queue() -> None:
    d = Driver().given(a_node("n1"), a_quota("a", 8), a_job("low", team="a", gpus=8, at=0, priority="low"))
    d.cycle(now=0.0)
    assert d.state_of("low") == "running"
    d.given(a_job("hi", team="a", gpus=8, at=500, priority="high"))
    d.cycle(now=500.0)
    assert d.state_of("low") == "suspended"
    assert d.state.jobs["low"].queued_since == 500.0


# -- non-preemptible work --------------------------------------------------------------------------
def test_a_team_without_quota_runs_non_preemptible_work_only_on_what_is_lent_to_it() -> None:
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_quota("vision", 16, np_lend=0),  # vision lends nothing to non-preemptible work
        a_job("np", team="nobody", gpus=8, preemptible=False),
    )
    d.cycle()
    assert d.state_of("np") == "pending"
    assert "non-preemptible jobs borrow only unguaranteed GPUs, idle guarantees lent" in d.waiting["np"]
    d.given(a_quota("vision", 16, np_lend=8))  # now 8 of its idle guarantee are lent to such work
    d.cycle(now=20.0)
    assert d.state_of("np") == "running"
    assert "lent to non-preemptible work" in d.state.jobs["np"].reason


def test_non_preemptible_work_may_use_capacity_nobody_is_guaranteed() -> None:
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_quota("vision", 8, np_lend=0),
        a_job("own", team="vision", gpus=8, preemptible=False, at=1),
        a_job("beyond", team="vision", gpus=8, preemptible=False, at=2),
        a_job("more", team="vision", gpus=1, preemptible=False, at=3),
    )
    d.cycle()
    assert d.state_of("own") == "running" and d.state_of("beyond") == "running"  # 8 GPUs nobody is promised
    d.given(a_node("n3", gpus=1), a_quota("nlp", 1, np_lend=0))  # promised to nlp, which lends none of it
    d.cycle()
    assert d.state_of("more") == "pending"


def test_non_preemptible_work_borrows_an_idle_guarantee_and_gives_it_back_by_draining() -> None:
    """Issue 19, item 2: an idle guarantee lent to other teams' non-preemptible work; once the
    lender has work waiting for it, nobody borrows more of it, nothing is preempted, and the
    lender's job waits for the drain (and says so)."""
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_quota("vision", 8),
        a_quota("nlp", 8, np_lend=8),
        a_job("v-big", team="vision", gpus=8, replicas=2, priority="high", preemptible=False, at=1),
    )
    d.cycle(now=10.0)
    assert d.state_of("v-big") == "running"  # 8 of its own + 8 of nlp's idle guarantee
    assert "8 on idle guarantees lent to non-preemptible work" in d.state.jobs["v-big"].reason
    said = explain(d.state, "v-big", d.waiting, now=10.0)
    assert said is not None and "runs on lent capacity, given back when it ends, never preempted" in said["text"]
    d.given(
        a_job("n-own", team="nlp", gpus=8, priority="normal", at=20),
        a_job("v-more", team="vision", gpus=8, priority="high", preemptible=False, at=21),
    )
    cycle = d.cycle(now=30.0)
    assert not [x for x in cycle.decisions if isinstance(x, Preempt)]  # lent capacity is never preempted
    assert d.state_of("n-own") == "pending" and d.state_of("v-more") == "pending"
    assert "waits for a drain" in d.waiting["n-own"]
    # nlp wants its guarantee back: vision may not borrow it again, even when GPUs free
    d.given(done("v-big", at=40.0))
    d.cycle(now=50.0)
    assert d.state_of("n-own") == "running"
    assert d.state_of("v-more") == "running"  # within vision's own guarantee


def test_a_lenders_own_non_preemptible_job_waits_for_the_drain_and_says_so() -> None:
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_quota("vision", 8),
        a_quota("nlp", 8),
        a_job("v-big", team="vision", gpus=4, replicas=3, priority="high", preemptible=False, at=1),
    )
    d.cycle(now=10.0)
    assert d.state_of("v-big") == "running"  # 4 of nlp's idle guarantee lent (half of 8, the default)
    d.given(a_job("n-np", team="nlp", gpus=8, priority="high", preemptible=False, at=20))
    d.cycle(now=30.0)
    assert d.state_of("n-np") == "pending"
    assert "waits for a drain" in d.waiting["n-np"] and "vision" in d.waiting["n-np"]
    said = explain(d.state, "n-np", d.waiting, now=30.0)
    assert said is not None and "waits for a drain" in said["text"]
    d.given(done("v-big", at=40.0))
    d.cycle(now=50.0)
    assert d.state_of("n-np") == "running"


def test_urgent_non_preemptible_work_preempts_a_lower_class_borrower_of_another_team() -> None:
    d = Driver().given(
        *(a_node(f"n{i}") for i in range(4)),  # 32 GPUs: 8 + 8 guaranteed, 16 nobody's
        a_quota("vision", 8),
        a_quota("nlp", 8),
        a_job("v-hp", team="vision", gpus=8, priority="high", at=1),
        a_job("v-hp2", team="vision", gpus=8, priority="high", at=2),  # vision borrows (preemptible)
        a_job("n-low", team="nlp", gpus=8, priority="low", at=3),
        a_job("n-low2", team="nlp", gpus=8, priority="low", at=4),  # nlp borrows
    )
    d.cycle(now=10.0)
    assert all(d.state_of(j) == "running" for j in ("v-hp", "v-hp2", "n-low", "n-low2"))
    # vision is beyond its guarantee (so no reclaim), but none of its GPUs are non-preemptible:
    # its urgent job may take a lower class's borrowed GPUs, and its own high work stays borrowed.
    d.given(a_job("v-train", team="vision", gpus=8, priority="high", preemptible=False, at=20))
    cycle = d.cycle(now=30.0)
    preempted = {x.job_id: x.reason for x in cycle.decisions if isinstance(x, Preempt)}
    assert d.state_of("v-train") == "running"
    assert len(preempted) == 1 and set(preempted) <= {"n-low", "n-low2"}
    assert set(preempted.values()) == {PreemptionReason.RECLAIM}


def test_urgent_work_leaves_borrowers_of_its_own_class_alone() -> None:
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_node("n3"),
        a_quota("vision", 8),
        a_quota("nlp", 8),
        a_job("v-own", team="vision", gpus=8, priority="low", at=1),
        a_job("n-own", team="nlp", gpus=8, priority="high", at=2),
        a_job("n-borrow", team="nlp", gpus=8, priority="high", at=3),  # nlp borrows, at high
    )
    d.cycle(now=10.0)
    d.given(a_job("np", team="vision", gpus=8, priority="high", preemptible=False, at=20))
    cycle = d.cycle(now=30.0)
    preempted = [x.job_id for x in cycle.decisions if isinstance(x, Preempt)]
    assert preempted == ["v-own"]  # its own team's low job (priority); nlp's high borrower stays
    assert any(isinstance(x, Admit) and x.job_id == "np" for x in cycle.decisions)


scenario = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from([1, 2, 4, 8]),
        st.sampled_from(list(PriorityClass)),
        st.booleans(),  # preemptible
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=80, deadline=None)
@given(
    scenario,
    st.sampled_from([(8, 8, 8), (4, 8, 0), (8, 0, 0), (2, 2, 2)]),
    st.tuples(*(st.sampled_from([None, 0, 1, 4]) for _ in range(3))),
    st.lists(st.integers(0, 13), max_size=6),
    st.booleans(),  # the default policy (fair-share borrowing on) or the lending rule alone
)
def test_every_guarantee_stays_reclaimable_whatever_runs(jobs, guarantees, np_lend, ends, fair) -> None:  # type: ignore[no-untyped-def]
    """After any sequence of cycles (jobs arriving and ending), in the pool, with the lending rule
    alone (np_fair_share off)

        sum over teams of max(guarantee - np_lend_limit, non-preemptible GPUs held) <= capacity:

    what a team holds beyond its guarantee is preemptible (reclaimed by preemption), except GPUs
    of idle guarantees their owners lend to non-preemptible work (at most `np_lend_limit` each,
    given back by draining). With np_lend_limit 0 everywhere this is the strict rule.

    With fair-share borrowing (the default) a team may also run non-preemptible work up to its
    fair share of the pool: every cycle that starts such work beyond the lending rule leaves the
    team within the fair share it had when the cycle began (what it holds of other teams'
    guarantees then drains back as it ends). (The share does not hold critical work or the
    starvation guard's first protected jobs; they drain back too. None runs here: no team may use
    critical, and no job waits long enough to be protected.) The share that bounds it is the aggregate one (every
    class's demand), whatever the per-class shares that order the classes allow: the aggregate
    shares fit the pool, so every lender can still reclaim its guarantee."""
    policy = CHAMBER if fair else replace(CHAMBER, np_fair_share=False)
    d = Driver().given(a_node("n1"), a_node("n2"), a_node("n3"))
    for team, g, lend in zip("abc", guarantees, np_lend, strict=True):
        if g:
            d.given(a_quota(team, g, np_lend=lend))
    for i, (team, gpus, prio, pre) in enumerate(jobs):
        d.given(a_job(f"j{i}", team=team, gpus=gpus, priority=prio.value, preemptible=pre, at=float(i)))
        for k in ends:
            if k < i and d.state_of(f"j{k}") == "running" and (k * 7 + i) % 3 == 0:
                d.given(done(f"j{k}", at=float(i) + 0.2))
        before = Work(d.state, 0.0, policy)
        shares = {t: before.fair_share("default", t) for t in "abc"}
        held_before = {t: nonpreemptible(before, "default", t) for t in "abc"}
        cycle = d.cycle(now=float(i) + 0.5, policy=policy)
        work = Work(d.state, 0.0, policy)
        kept = 0
        for t in "abc":
            q = d.state.quotas.get(("default", t))
            kept += max((q.guaranteed - q.np_lendable) if q else 0, nonpreemptible(work, "default", t))
        if not fair:
            assert kept <= 24
            continue
        if kept > 24:  # beyond the lending rule: only teams that grew within their fair share
            for t in {x.team for x in cycle.decisions if isinstance(x, Admit)}:
                held = nonpreemptible(work, "default", t)
                g = d.state.quotas[("default", t)].guaranteed if ("default", t) in d.state.quotas else 0
                assert held <= held_before[t] or held <= max(g, shares[t]) + 1e-9, (t, held, shares[t])


def _a_full_at_its_share_b_and_c_wanting_more(a_may_use_critical: bool = False) -> Driver:
    """Three 8-GPU nodes, three teams guaranteed 8 (lending nothing to non-preemptible work): a runs
    8 GPUs of high work, b and c run low work and want more than their shares; one GPU is free."""
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_node("n3"),
        a_quota("a", 8, np_lend=0, critical=a_may_use_critical),
        *(a_quota(t, 8, np_lend=0) for t in ("b", "c")),
        a_job("a-high", team="a", gpus=8, priority="high", preemptible=False, at=1),
        a_job("b-low", team="b", gpus=7, priority="low", at=2),
        a_job("c-low", team="c", gpus=8, priority="low", at=3),
    )
    d.cycle(now=5.0)
    d.given(
        a_job("b-more", team="b", gpus=8, priority="low", at=6),
        a_job("c-more", team="c", gpus=8, priority="low", at=7),
    )
    return d


def test_a_teams_classes_together_hold_at_most_its_aggregate_share_of_others_guarantees() -> None:
    """One share per class orders the classes, but the team's non-preemptible work of every class
    together stays within its guarantee or its aggregate fair share: else its high work (within its
    guarantee) plus a normal job (within normal's share, high not counted) held a lender's GPU."""
    d = _a_full_at_its_share_b_and_c_wanting_more()
    d.given(a_job("a-normal", team="a", gpus=1, priority="normal", preemptible=False, at=8))
    cycle = d.cycle(now=10.0)
    assert Work(d.state, 10.0, CHAMBER).fair_share("default", "a") == 8.0
    assert d.state_of("a-normal") == "pending"  # the one free GPU is b's guarantee
    assert "all classes 8" in d.waiting["a-normal"]
    d.given(done("a-high", at=11))
    d.cycle(now=12.0)
    assert d.state_of("a-normal") == "running" and not [x for x in cycle.decisions if isinstance(x, Preempt)]


# -- who may use critical --------------------------------------------------------------------------
def test_critical_work_needs_the_teams_permission_in_its_pool() -> None:
    d = Driver().given(
        a_node("n1"),
        a_quota("vision", 8),
        a_quota("nlp", 0),
        a_job("v-low", team="vision", gpus=8, priority="low"),
    )
    d.cycle(now=1.0)
    d.given(a_job("n-crit", team="nlp", gpus=8, priority="critical", at=2))
    d.cycle(now=3.0)
    assert d.state_of("n-crit") == "pending" and d.state_of("v-low") == "running"
    assert "team nlp may not run critical work in pool default" in d.waiting["n-crit"]
    assert "--critical" in d.waiting["n-crit"]
    d.given(a_quota("nlp", 0, critical=True))  # the operator allows it
    d.cycle(now=4.0)
    assert d.state_of("n-crit") == "running" and d.state_of("v-low") == "suspended"


def test_a_pool_where_nobody_has_a_quota_keeps_no_critical_rule() -> None:
    d = Driver().given(a_node("n1"), a_job("crit", gpus=8, priority="critical"))
    d.cycle()
    assert d.state_of("crit") == "running"


def test_the_quota_command_records_the_critical_permission() -> None:
    from services.quota.core import QuotaState, set_quota
    from services.quota.core import evolve as quota_evolve

    state = QuotaState(half_life_s=3600)
    quota_evolve(state, a_node("n1"))
    event = set_quota(
        state, team="nlp", pool="default", gpus=4, borrow_limit=None, lend_limit=None, weight=1.0, at=1.0, critical=True
    )
    assert event.critical is True
    assert (
        set_quota(
            state, team="cv", pool="default", gpus=4, borrow_limit=None, lend_limit=None, weight=1.0, at=1.0
        ).critical
        is False
    )


def test_the_np_lend_limit_flows_from_the_command_and_the_sim_quotas_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import msgspec

    from events.commands import SetTeamQuota
    from services.quota.core import QuotaRefused, QuotaState, set_quota
    from services.quota.core import evolve as quota_evolve
    from services.tracesim.quotas import load_quotas

    cmd = msgspec.json.decode(b'{"team": "nlp", "gpus": 4, "np_lend_limit": 2}', type=SetTeamQuota)
    state = QuotaState(half_life_s=3600)
    quota_evolve(state, a_node("n1"))
    kw = {"team": "nlp", "pool": "default", "borrow_limit": None, "lend_limit": None, "weight": 1.0, "at": 1.0}
    event = set_quota(state, gpus=cmd.gpus or 0, np_lend_limit=cmd.np_lend_limit, **kw)  # type: ignore[arg-type]
    assert event.np_lend_limit == 2
    d = Driver().given(a_node("n1"), event)
    assert d.state.quotas[("default", "nlp")].np_lendable == 2
    d.given(a_quota("nlp", 5))  # by default half of what it lends (rounded down)
    assert d.state.quotas[("default", "nlp")].np_lendable == 2
    with pytest.raises(QuotaRefused, match="np_lend_limit 5 is above the guarantee 4"):
        set_quota(state, gpus=4, np_lend_limit=5, **kw)  # type: ignore[arg-type]
    with pytest.raises(QuotaRefused, match="np_lend_limit must be 0 or more"):
        set_quota(state, gpus=4, np_lend_limit=-1, **kw)  # type: ignore[arg-type]
    # a lend limit caps it: what is never lent is not lent to non-preemptible work either
    d.given(a_quota("nlp", 4, lend=1, np_lend=3))
    assert d.state.quotas[("default", "nlp")].np_lendable == 1
    toml = tmp_path / "q.toml"
    toml.write_text("[teams.nlp]\nguaranteed = 4\nnp_lend_limit = 0\n")
    assert load_quotas(toml, ["nlp"], 8)["nlp"].np_lend_limit == 0


def test_critical_work_is_not_held_back_by_a_protected_jobs_reservation() -> None:
    policy = replace(CHAMBER, starvation_bound_s=100.0, age_weight=0.0)
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_job("h0", gpus=8, at=0, priority="high", estimate=60, preemptible=False),
        a_job("gang", gpus=8, replicas=2, at=0, estimate=10),
    )
    schedule_and_fold(d, 0.0, policy)
    d.given(a_job("crit", gpus=8, at=110, priority="critical", estimate=60))
    schedule_and_fold(d, 110.0, policy)  # the gang is protected and holds the reservation
    assert "protected by the starvation guard" in d.waiting["gang"]
    assert d.state_of("crit") == "running"  # critical work queues ahead of every protected job


def test_explain_gives_the_position_the_next_cycle_uses() -> None:
    d = Driver().given(
        a_node("n1", gpus=1), a_job("fill", gpus=1, at=0), a_job("old-low", gpus=8, at=1, priority="low")
    )
    d.cycle(now=1.0)
    d.given(a_job("new-normal", gpus=8, at=3))  # not yet protected at 1 + bound + 1
    bound = CHAMBER.starvation_bound_s
    assert bound is not None
    fresh = explain(d.state, "old-low", d.waiting, now=3.0, policy=CHAMBER)
    assert fresh is not None and "position 2 of 2" in fresh["text"]  # class first
    starving = explain(d.state, "old-low", d.waiting, now=1 + bound + 1, policy=CHAMBER)
    assert starving is not None and "position 2 of 2" in starving["text"]  # protected: first of its class
    lifting = replace(CHAMBER, guard_lifts_classes=2)
    lifted = explain(d.state, "old-low", d.waiting, now=1 + bound + 1, policy=lifting)
    assert lifted is not None and "position 1 of 2" in lifted["text"]  # lifted past normal work


# -- fair-share borrowing (issue 29) ---------------------------------------------------------------
def _four_teams_and_a_quiet_one(policy: Policy) -> Driver:
    """32 GPUs, four teams guaranteed 8 each; a, c and d hold their 8 in non-preemptible work, b
    holds 2 and has one more 1-GPU job queued (so b lends nothing under the lending rule alone).
    Then a wants 3 more non-preemptible GPUs: b's demand is 3, so a's fair share is 11."""
    d = Driver().given(*(a_node(f"n{i}") for i in range(4)), *(a_quota(t, 8) for t in "abcd"))
    for t, gpus in (("a", 8), ("c", 8), ("d", 8), ("b", 2)):
        d.given(a_job(f"{t}-np", team=t, gpus=gpus, priority="high", preemptible=False, at=1))
    d.cycle(now=10.0, policy=policy)
    d.given(
        a_job("a-more", team="a", gpus=3, priority="high", preemptible=False, at=20),
        a_job("b-wait", team="b", gpus=1, priority="high", preemptible=False, at=21),
    )
    d.cycle(now=30.0, policy=policy)
    return d


def test_non_preemptible_work_grows_to_its_fair_share_while_a_quiet_team_has_work_queued() -> None:
    d = _four_teams_and_a_quiet_one(CHAMBER)
    assert d.state_of("a-more") == "running" and d.state_of("b-wait") == "running"
    work = Work(d.state, 30.0)
    assert nonpreemptible(work, "default", "a") == 11
    lone = _four_teams_and_a_quiet_one(replace(CHAMBER, np_fair_share=False))  # the lending rule alone
    assert lone.state_of("a-more") == "pending" and lone.state_of("b-wait") == "running"
    assert "non-preemptible jobs borrow only" in lone.waiting["a-more"]


def test_beyond_its_fair_share_non_preemptible_work_waits_and_says_what_its_share_is() -> None:
    d = Driver().given(*(a_node(f"n{i}") for i in range(4)), *(a_quota(t, 8) for t in "abcd"))
    for t in "abcd":
        d.given(a_job(f"{t}-np", team=t, gpus=8, priority="high", preemptible=False, at=1))
    d.given(a_job("d-more", team="d", gpus=1, priority="high", preemptible=False, at=2))
    d.cycle(now=10.0)
    d.given(done("b-np", at=11.0), a_job("a-more", team="a", gpus=8, priority="high", preemptible=False, at=12))
    d.cycle(now=20.0)
    # b wants nothing now (so counts for nothing), c wants its 8, d 9, a 16: the pool's 32
    # water-filled gives c 8, d 9 and a the 15 left
    share = Work(d.state, 20.0).fair_share("default", "a")
    assert share == 15.0
    assert d.state_of("d-more") == "running"  # 9 is within d's share
    assert d.state_of("a-more") == "pending" and "fair share 15" in d.waiting["a-more"]


def test_the_fair_share_is_per_class_and_counts_only_demand_as_urgent() -> None:
    """A team's high work at its share does not keep its normal work out, but all its classes
    together stay within its aggregate share; and queued low work does not count against high
    work's share."""
    high, low = PriorityClass.HIGH.rank, PriorityClass.LOW.rank
    for lend in (None, 0):  # the default np_lend_limit (half), and none lent
        d = Driver().given(*(a_node(f"n{i}") for i in range(4)), *(a_quota(t, 8, np_lend=lend) for t in "abcd"))
        for t in "abc":
            d.given(*(a_job(f"{t}-np{i}", team=t, gpus=8, priority="high", preemptible=False, at=1) for i in range(2)))
        d.given(*(a_job(f"d-low{i}", team="d", gpus=8, priority="low", at=1 + i) for i in range(2)))
        d.cycle(now=10.0)
        work = Work(d.state, 10.0)
        assert work.fair_share("default", "a", low) == 8.0  # d's low work wants its 8 (and more)
        # d wants no high work: it counts for nothing (or, lending none, for its whole guarantee)
        assert work.fair_share("default", "a", high) == (32 / 3 if lend is None else 8.0)
        d.given(a_job("a-normal", team="a", gpus=1, priority="normal", preemptible=False, at=11))
        d.cycle(now=20.0)
        if lend is None:  # d lends half its guarantee to normal work (its queued work is low)
            assert d.state_of("a-normal") == "running"  # a's 8 high GPUs are not normal's share
            assert d.state_of("d-low0") in ("suspended", "pending")  # preempted: low work was promised nothing
        else:  # nobody lends: a 9th non-preemptible GPU would pass a's aggregate share (8) and hold d's guarantee
            assert d.state_of("a-normal") == "pending" and "all classes 8" in d.waiting["a-normal"]


def test_the_fair_share_water_fills_the_pool_over_demand_by_weight() -> None:
    d = Driver().given(*(a_node(f"n{i}") for i in range(4)), a_quota("a", 8), a_quota("b", 8), a_quota("c", 16))
    d.given(a_job("a1", team="a", gpus=2, at=1), *(a_job(f"c{i}", team="c", gpus=8, at=2 + i) for i in range(4)))
    d.cycle(now=10.0)
    work = Work(d.state, 10.0)
    share = {t: work.fair_share("default", t) for t in "abc"}
    # a wants 2 but, wanting something, counts for what it does not lend (8 - 4); b wants nothing:
    # nothing; c takes the rest: 32 - 4 = 28
    assert share == {"a": 4.0, "b": 0.0, "c": 28.0}
    d.given(a_quota("b", 8, np_lend=2))  # a limit an operator set always holds: b keeps 8 - 2
    assert Work(d.state, 10.0).fair_share("default", "b") == 6.0
    assert work.fair_share("default", "nobody") == 0.0  # no quota in the pool: no share


def test_a_protected_non_preemptible_job_keeps_room_in_its_teams_share() -> None:
    """Without it, a team's own small jobs refill its fair share and its large job never fits."""
    policy = replace(CHAMBER, starvation_bound_s=100.0)
    d = Driver().given(a_node("n1", gpus=16), a_quota("a", 4), a_quota("b", 4), a_quota("c", 8, np_lend=0))
    d.given(
        a_job("a-run", team="a", gpus=4, priority="high", preemptible=False, at=0),
        a_job("b-run", team="b", gpus=4, priority="high", preemptible=False, at=0),
    )
    d.cycle(now=1.0, policy=policy)
    d.given(a_job("a-big", team="a", gpus=10, priority="normal", preemptible=False, at=2))
    d.cycle(now=3.0, policy=policy)
    assert d.state_of("a-big") == "pending"  # 14 GPUs would be beyond a's share
    # the share is per class: a-small is of a-big's class (the team's high work has a share of its own)
    d.given(a_job("a-small", team="a", gpus=1, priority="normal", preemptible=False, at=150))
    d.cycle(now=200.0, policy=policy)  # a-big is protected; a's share: 16 water-filled, b 4, a and c 6
    assert d.state_of("a-small") == "pending"
    assert "keeps room for a-big (10 GPUs), protected by the starvation guard" in d.waiting["a-small"]
    d.given(done("a-run", at=210.0))
    d.cycle(now=220.0, policy=policy)
    assert d.state_of("a-big") == "running"  # the guard's oldest job: not held to the share


def test_a_protected_job_keeps_room_against_its_teams_less_urgent_work_too() -> None:
    """A team's normal work does not start into the room its protected high job waits for (it did:
    seven such starts on itp-cluster02 at 64 GPUs); other teams' work, and the team's work once
    the job's room is kept, do."""
    policy = replace(CHAMBER, starvation_bound_s=100.0)
    for keep in (True, False):
        on = replace(policy, room_against_less_urgent=keep)
        d = Driver().given(a_node("n1", gpus=16), a_quota("a", 4), a_quota("b", 4), a_quota("c", 8, np_lend=0))
        d.given(
            a_job("a-run", team="a", gpus=4, priority="high", preemptible=False, at=0),
            a_job("b-run", team="b", gpus=4, priority="high", preemptible=False, at=0),
            a_job("c-run", team="c", gpus=5, priority="high", preemptible=False, at=0),
        )
        d.cycle(now=1.0, policy=on)
        d.given(a_job("a-big", team="a", gpus=6, priority="high", preemptible=False, at=2))
        d.cycle(now=3.0, policy=on)
        assert d.state_of("a-big") == "pending"  # 3 GPUs free
        d.given(
            a_job("a-normal", team="a", gpus=1, priority="normal", preemptible=False, at=150),
            a_job("b-normal", team="b", gpus=1, priority="normal", preemptible=False, at=150),
        )
        d.cycle(now=200.0, policy=on)  # a-big is protected, and waits for room in the pool
        assert d.state_of("a-big") == "pending"
        assert d.state_of("b-normal") == "running"  # another team's work is not held for it
        if keep:
            assert d.state_of("a-normal") == "pending"
            assert "keeps room for a-big (6 GPUs, high), protected by the starvation guard" in d.waiting["a-normal"]
        else:
            assert d.state_of("a-normal") == "running"  # its class's share is normal's own


# -- a node drains for a protected whole-node job ---------------------------------------------------
def test_a_protected_whole_node_job_holds_the_node_that_drains_first_from_lower_class_work() -> None:
    policy = replace(CHAMBER, starvation_bound_s=100.0)
    fixed = {"priority": "low", "preemptible": False}
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_job("ends-soon", gpus=5, at=0, estimate=200, **fixed),  # type: ignore[arg-type]
        a_job("ends-late", gpus=5, at=0, estimate=1000, **fixed),  # type: ignore[arg-type]
    )
    schedule_and_fold(d, 0.0, policy)
    d.given(a_job("whole", gpus=8, at=1, estimate=50, preemptible=False))
    schedule_and_fold(d, 1.0, policy)
    assert d.state_of("whole") == "pending"  # 3 GPUs free on each node
    d.given(
        a_job("quick", gpus=3, at=150, estimate=20, **fixed),  # type: ignore[arg-type]
        a_job("long-a", gpus=3, at=150, estimate=500, **fixed),  # type: ignore[arg-type]
        a_job("long-b", gpus=3, at=150, estimate=500, **fixed),  # type: ignore[arg-type]
    )
    cycle = schedule(d.state, 150.0, None, policy=policy)  # "whole" is protected from t=101
    started = {a.job_id: a.placements[0].node for a in cycle.decisions if isinstance(a, Admit)}
    soon = d.state.jobs["ends-soon"].placements[0].node
    late = d.state.jobs["ends-late"].placements[0].node
    assert started == {"quick": soon, "long-a": late}  # on the node that frees first, only what ends by then
    assert [(p, dr.job_id, dr.ready_at) for p, dr in cycle.mark.draining] == [("default", "whole", 200.0)]
    for event, _ in events_for(cycle.decisions, 150.0):
        d.given(event)
    d.given(done("quick", at=170), done("ends-soon", at=200))
    schedule_and_fold(d, 200.0, policy)
    assert d.state_of("whole") == "running" and d.state_of("long-b") == "pending"
    without = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_job("ends-soon", gpus=5, at=0, estimate=200, **fixed),  # type: ignore[arg-type]
        a_job("ends-late", gpus=5, at=0, estimate=1000, **fixed),  # type: ignore[arg-type]
    )
    schedule_and_fold(without, 0.0, policy)
    without.given(
        a_job("long-a", gpus=3, at=150, estimate=500, **fixed), a_job("long-b", gpus=3, at=150, estimate=500, **fixed)
    )  # type: ignore[arg-type]
    schedule_and_fold(without, 150.0, policy)
    assert without.state_of("long-b") == "running"  # no protected job: both nodes fill


# -- what the fair share does not hold ---------------------------------------------------------------
def test_critical_work_is_not_held_to_its_teams_fair_share() -> None:
    """Critical work may preempt across teams; held to the share it waited behind its own team's
    less urgent work for as long as that ran (a critical 8-GPU job 22 h on an ITP cluster)."""
    d = _a_full_at_its_share_b_and_c_wanting_more(a_may_use_critical=True)
    d.given(
        a_job("a-normal", team="a", gpus=1, priority="normal", preemptible=False, at=8),
        a_job("a-critical", team="a", gpus=1, priority="critical", preemptible=False, at=8),
    )
    d.cycle(now=10.0)
    assert d.state_of("a-normal") == "pending" and "all classes 8" in d.waiting["a-normal"]
    assert d.state_of("a-critical") == "running"  # the one free GPU, beyond a's share of 8


def test_each_teams_first_protected_job_on_one_node_is_not_held_to_the_share() -> None:
    """Where a team's share is about a node (8 GPUs of 32, four teams), its 8-GPU job fits the share
    only while the team runs nothing else non-preemptible. The pool's oldest protected job passes
    the share; so does each team's first protected job that fits on one node (a node per team at
    most), not the team's next one."""
    policy = replace(CHAMBER, starvation_bound_s=100.0)
    d = Driver().given(
        *(a_node(f"n{i}") for i in range(1, 5)),
        *(a_quota(t, 8, np_lend=0) for t in "abcd"),
        a_job("a-run", team="a", gpus=1, priority="high", preemptible=False, at=0),
        a_job("b-run", team="b", gpus=1, priority="high", preemptible=False, at=0),
    )
    d.cycle(now=0.5, policy=policy)
    d.given(
        a_job("a-big", team="a", gpus=8, priority="normal", preemptible=False, at=1),
        a_job("b-big", team="b", gpus=8, priority="normal", preemptible=False, at=1.5),
        a_job("a-next", team="a", gpus=8, priority="normal", preemptible=False, at=2),
    )
    work = Work(d.state, 200.0, policy)  # all three protected since 101 to 102
    block = {j: quota.nonpreemptible_block(work, d.state.jobs[j]) for j in ("a-big", "b-big", "a-next")}
    assert work.fair_share("default", "b") == 8.0
    assert block["a-big"] is None  # the pool's oldest protected job
    assert block["b-big"] is None  # b's first protected job, one node
    assert block["a-next"] is not None and "fair share" in block["a-next"].text


def test_a_protected_whole_node_job_keeps_its_node_held_while_it_waits_for_a_drain() -> None:
    """A wait for lent GPUs to drain back (or for room in the pool) ends as work ends, like a wait
    for capacity: the node that frees first stays held for the job through it."""
    policy = replace(CHAMBER, starvation_bound_s=100.0)
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_quota("a", 8),  # lends half its idle guarantee to others' non-preemptible work
        a_quota("b", 8, np_lend=0),
        a_job("b-own", team="b", gpus=8, priority="high", preemptible=False, at=0, estimate=1000),
        a_job("b-lent", team="b", gpus=4, priority="high", preemptible=False, at=0, estimate=300),
    )
    schedule_and_fold(d, 0.0, policy)
    assert d.state_of("b-lent") == "running"  # on 4 GPUs of a's idle guarantee
    d.given(a_job("a-whole", team="a", gpus=8, priority="normal", preemptible=False, at=1, estimate=50))
    schedule_and_fold(d, 2.0, policy)
    assert d.waiting["a-whole"].startswith("quota: waits for a drain")
    cycle = schedule(d.state, 150.0, None, policy=policy)  # protected since 101, still waiting for the drain
    assert d.state_of("a-whole") == "pending"
    assert [(p, dr.job_id, dr.ready_at) for p, dr in cycle.mark.draining] == [("default", "a-whole", 300.0)]
