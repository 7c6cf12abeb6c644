"""The gateway's read model, as scenarios: given events -> then what the fleet, queue, teams, costs show."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from events import (
    BudgetExceeded,
    BudgetSet,
    Event,
    GpuIsolated,
    GpuRestored,
    JobCompleted,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobSuspended,
    NodeLost,
    NodeRestored,
    Placement,
)
from events.fleet import IsolationDismissed, IsolationHeld
from events.jobs import PreemptionReason, PriorityClass
from events.streams import stream_for
from events.subjects import subject_for
from services.gateway import core, views
from services.gateway.core import GatewayState, JobState, evolve
from services.gateway.metrics import fleet_values
from tests.gateway_builders import (
    CLUSTER,
    T0,
    a_cost,
    a_demo_fleet,
    a_node_discovered,
    a_quota,
    a_sample,
    a_scheduled,
    a_scripted_fleet,
    a_started,
    a_submitted,
)


def fold(events: list[Event], state: GatewayState | None = None) -> GatewayState:
    state = state or GatewayState()
    for event in events:
        evolve(state, event)
    return state


def test_a_scripted_fleet_shows_its_gpus_allocations_and_efficiency() -> None:
    state = fold(a_scripted_fleet())
    eff = core.efficiency(state)
    assert (eff.total, eff.isolated, eff.capacity, eff.allocated, eff.idle) == (24, 8, 16, 14, 2)
    assert round(eff.busy, 6) == 11.2
    assert round(eff.score, 4) == round(11.2 / 16, 4)
    assert round(eff.usage_ratio, 4) == round(11.2 / 14, 4)
    assert eff.allocated_idle == 0


def test_the_queue_shows_waiting_jobs_with_a_reason_the_fleet_explains() -> None:
    state = fold(a_scripted_fleet())
    q = views.queue(state)
    assert q.depth == 1 and q.jobs[0].job_id == "big-sweep"
    assert q.jobs[0].reason == "waiting for 8 free GPUs; 2 free now"
    assert q.by_team == {"speech": 1}


def test_the_queue_is_ordered_by_priority_then_submit_time_then_id() -> None:
    state = fold(
        [
            a_submitted("c", priority=PriorityClass.LOW, at=T0),
            a_submitted("b", priority=PriorityClass.HIGH, at=T0 + 5),
            a_submitted("a", priority=PriorityClass.HIGH, at=T0 + 5),
            a_submitted("d", priority=PriorityClass.CRITICAL, at=T0 + 9),
        ]
    )
    assert [j.job_id for j in core.queue(state)] == ["d", "a", "b", "c"]


def test_a_job_that_only_needs_a_single_node_block_says_so() -> None:
    state = fold(
        [
            a_node_discovered("n1", gpus=4),
            a_node_discovered("n2", gpus=4),
            a_submitted("x", gpus=2),
            a_scheduled("x", "n1", [0, 1]),
            a_submitted("y", gpus=2),
            a_scheduled("y", "n2", [0, 1]),
            a_submitted("wide", gpus=4),
        ]
    )
    assert views.queue(state).jobs[0].reason == "waiting for 1 x 4 GPUs on single nodes; largest free block is 2"


def test_teams_show_usage_against_guarantee_borrowed_share_and_cost() -> None:
    state = fold(a_scripted_fleet())
    by_name = {t.team: t for t in views.teams(state).teams}
    vision, nlp, speech = by_name["vision"], by_name["nlp"], by_name["speech"]
    assert (vision.guaranteed_gpus, vision.used_gpus, vision.borrowed_gpus) == (8, 12, 4)
    assert (nlp.used_gpus, nlp.unused_guarantee_gpus, nlp.usage_of_guarantee) == (2, 2, 0.5)
    assert (speech.used_gpus, speech.pending_jobs) == (0, 1)
    assert vision.cost == 30.0 and vision.gpu_hours == 12.0
    assert vision.cost_rate_per_hour == 12 * 2.5  # 12 held H100s at 2.50/h


def test_cost_totals_team_and_idle_cost() -> None:
    cost = views.cost(fold(a_scripted_fleet()))
    assert (cost.total, cost.idle_cost) == (39.0, 4.0)
    assert [t.team for t in cost.by_team][:2] == ["vision", "nlp"]
    assert cost.rate_per_hour == 14 * 2.5


def test_an_isolated_node_leaves_capacity_and_appears_on_the_timeline() -> None:
    state = fold(a_scripted_fleet())
    f = views.faults(state)
    assert [(i.node, i.gpu_index) for i in f.isolations] == [("n3", None)]
    assert [(e.kind, e.detail) for e in f.timeline] == [  # newest first
        ("node_isolated", "xid 79"),
        ("fault", "xid 79: GPU has fallen off the bus"),
    ]
    assert f.faults_total == 1
    evolve(state, NodeRestored(cluster=CLUSTER, node="n3", at=T0 + 20, reason="probation passed"))
    assert core.efficiency(state).capacity == 24
    assert views.faults(state).isolations == []


def test_a_single_isolated_gpu_leaves_only_that_gpu_out_of_service() -> None:
    state = fold([a_node_discovered("n1")])
    evolve(state, GpuIsolated(cluster=CLUSTER, node="n1", gpu_index=2, at=T0 + 1, reason="ecc dbe"))
    eff = core.efficiency(state)
    assert (eff.total, eff.capacity, eff.isolated) == (8, 7, 1)
    gpu = next(g for g in views.gpus(state) if g.index == 2)
    assert gpu.health == "isolated" and gpu.isolation is not None and gpu.isolation.reason == "ecc dbe"
    evolve(state, GpuRestored(cluster=CLUSTER, node="n1", gpu_index=2, at=T0 + 2, reason="replaced", by="operator"))
    assert core.efficiency(state).capacity == 8
    assert views.faults(state).timeline[0].detail == "replaced (by operator)"


def test_a_lost_node_is_not_capacity() -> None:
    state = fold([a_node_discovered("n1"), a_node_discovered("n2")])
    evolve(state, NodeLost(cluster=CLUSTER, node="n2", at=T0 + 5, last_seen_at=T0 + 1, reason="silent 30 s"))
    assert core.efficiency(state).capacity == 8
    assert views.fleet(state).nodes_by_status == {"healthy": 1, "lost": 1}


def test_preemption_frees_gpus_and_queues_the_job_until_it_resumes() -> None:
    state = fold(
        [a_node_discovered("n1"), a_submitted("j", gpus=4), a_scheduled("j", "n1", [0, 1, 2, 3]), a_started("j")]
    )
    assert core.efficiency(state).allocated == 4
    evolve(
        state,
        JobPreempted(job_id="j", at=T0 + 10, team="vision", reason=PreemptionReason.RECLAIM, preemptor_job_id="k"),
    )
    assert state.jobs["j"].state is JobState.PREEMPTED and core.efficiency(state).allocated == 0
    evolve(state, JobSuspended(job_id="j", at=T0 + 11))
    q = views.queue(state)
    assert q.depth == 1 and q.jobs[0].reason == "preempted (reclaim) by k"
    placement = Placement(cluster=CLUSTER, node="n1", gpu_indices=[4, 5, 6, 7])
    evolve(state, JobResumed(job_id="j", at=T0 + 20, placements=[placement], pool="default"))
    evolve(state, a_started("j", at=T0 + 21))
    assert state.jobs["j"].state is JobState.RUNNING and state.jobs["j"].preemptions == 1
    assert sorted(k[2] for k in state.allocations) == [4, 5, 6, 7]


def test_a_requeued_job_waits_with_the_reason_and_a_finished_job_holds_nothing() -> None:
    state = fold([a_node_discovered("n1"), a_submitted("j"), a_scheduled("j", "n1", [0, 1, 2, 3])])
    evolve(state, JobRequeued(job_id="j", at=T0 + 9, reason="node isolated", node="n1"))
    assert views.queue(state).jobs[0].reason == "requeued on n1: node isolated"
    evolve(state, a_scheduled("j", "n1", [4, 5, 6, 7], at=T0 + 12))
    evolve(state, JobCompleted(job_id="j", at=T0 + 30))
    assert state.allocations == {} and state.jobs["j"].state is JobState.COMPLETED
    evolve(state, a_started("j", at=T0 + 31))  # a late event about a finished job changes nothing
    assert state.jobs["j"].state is JobState.COMPLETED


def test_job_events_that_arrive_before_the_fleet_still_count_once_the_nodes_appear() -> None:
    state = fold([a_submitted("j"), a_scheduled("j", "n1", [0, 1, 2, 3]), a_started("j")])
    assert core.efficiency(state).allocated == 0  # no node known yet: no capacity, nothing to count
    fold([a_node_discovered("n1"), a_sample("n1", [100.0] * 8)], state)
    eff = core.efficiency(state)
    assert (eff.capacity, eff.allocated, eff.busy) == (8, 4, 4.0)


def test_the_efficiency_series_records_points_at_the_times_given() -> None:
    state = fold(a_scripted_fleet())
    core.record_point(state, T0 + 100)
    evolve(state, a_cost("nlp", 1.0))
    core.record_point(state, T0 + 105)
    points = views.efficiency(state).history
    assert [p.at for p in points] == [T0 + 100, T0 + 105]
    assert points[0].efficiency_score == 0.7 and points[0].idle_ratio == 0.125
    assert (points[0].cost_total, points[1].cost_total) == (39.0, 40.0)


def test_finished_jobs_are_bounded() -> None:
    state = GatewayState()
    for i in range(core.MAX_FINISHED_JOBS + 10):
        fold([a_submitted(f"j{i}"), JobCompleted(job_id=f"j{i}", at=T0 + 3)], state)
    assert len(state.jobs) == core.MAX_FINISHED_JOBS
    assert "j0" not in state.jobs


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_gpus_are_never_counted_twice_nor_held_by_a_job_that_is_not_holding(seed: int) -> None:
    """Random job lifecycles on a fixed fleet: the allocation map always matches the jobs' placements."""
    rng = random.Random(seed)
    state = fold([a_node_discovered("n1"), a_node_discovered("n2"), a_quota("vision", 4)])
    t = T0 + 10
    for step in range(60):
        t += 1
        job_id = f"j{rng.randrange(6)}"
        job = state.jobs.get(job_id)
        choice = rng.randrange(6)
        if job is None or job.state.finished:
            evolve(state, a_submitted(job_id if job is None else f"{job_id}-{step}", at=t))
        elif choice == 0 and job.state.queued:
            node = rng.choice(["n1", "n2"])
            evolve(state, a_scheduled(job_id, node, rng.sample(range(8), rng.randint(1, 4)), at=t))
        elif choice == 1:
            evolve(state, a_started(job_id, at=t))
        elif choice == 2:
            evolve(state, JobPreempted(job_id=job_id, at=t, team="vision", reason=PreemptionReason.PRIORITY))
        elif choice == 3:
            evolve(state, JobRequeued(job_id=job_id, at=t, reason="node lost"))
        elif choice == 4:
            evolve(state, JobCompleted(job_id=job_id, at=t))
    held = {
        (p.cluster, p.node, i): j.job_id
        for j in state.jobs.values()
        if j.state.holds_gpus
        for p in j.placements
        for i in p.gpu_indices
    }
    assert all(state.jobs[job_id].state.holds_gpus for job_id in state.allocations.values())
    assert set(state.allocations).issubset(held)
    eff = core.efficiency(state)
    assert 0 <= eff.allocated <= eff.capacity == 16
    assert 0.0 <= eff.score <= 1.0


def test_a_job_larger_than_any_node_only_needs_enough_free_gpus_in_total() -> None:
    state = fold([a_node_discovered("n1"), a_node_discovered("n2"), a_submitted("x", gpus=2)])
    fold([a_scheduled("x", "n1", [0, 1]), a_submitted("big", gpus=12, at=T0 + 9)], state)
    assert views.queue(state).jobs[0].reason == "the scheduler has not said why yet (`chamber explain` asks it)"


def test_a_waiting_job_shows_the_schedulers_own_reason_not_a_guess_from_free_capacity() -> None:
    # issue 16, finding 9: capacity is free, but the scheduler holds the job back for its team's quota
    state = fold([a_node_discovered("n1"), a_submitted("x", gpus=2)])
    core.scheduler_said(
        state,
        [
            {"id": "x", "state": "pending", "reason": "team vision is at its borrow limit (0 GPUs)"},
            {"id": "other", "state": "running", "reason": "placed"},
        ],
    )
    assert views.queue(state).jobs[0].reason == "team vision is at its borrow limit (0 GPUs)"
    assert "other" not in state.waiting_reasons
    core.scheduler_said(state, [])  # the scheduler no longer names it: the read model's view again
    assert views.queue(state).jobs[0].reason != "team vision is at its borrow limit (0 GPUs)"


def test_a_job_that_holds_gpus_without_using_them_is_counted_as_held_idle() -> None:
    state = fold([a_node_discovered("n1"), a_submitted("lazy"), a_scheduled("lazy", "n1", [0, 1, 2, 3])])
    assert core.efficiency(state).allocated_idle == 0  # no sample yet: unknown, not idle
    evolve(state, a_sample("n1", [1.0, 2.0, 50.0, 4.9] + [0.0] * 4))
    eff = core.efficiency(state)
    assert (eff.allocated, eff.allocated_idle, round(eff.busy, 3)) == (4, 3, 0.579)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_view_does_not_depend_on_how_the_streams_interleave(seed: int) -> None:
    """Each stream is consumed on its own, so any interleaving that keeps each stream's order must give
    the same fleet, queue, teams, cost and faults."""
    events, waves = a_demo_fleet(nodes=6)
    events = [*events, *(e for w in waves for e in w)]
    by_stream: dict[str, list[Event]] = {}
    for event in events:
        stream = stream_for(subject_for(event))
        assert stream is not None
        by_stream.setdefault(stream.name, []).append(event)
    rng = random.Random(seed)
    queues = [list(q) for q in by_stream.values()]
    shuffled: list[Event] = []
    while any(queues):
        shuffled.append(rng.choice([q for q in queues if q]).pop(0))

    def seen(state: GatewayState) -> list[object]:
        return [views.fleet(state), views.queue(state), views.teams(state), views.cost(state), views.faults(state)]

    assert seen(fold(shuffled)) == seen(fold(events))


def test_nodes_are_listed_in_natural_order() -> None:
    state = fold([a_node_discovered(n, gpus=1) for n in ("gpu-10", "gpu-2", "gpu-1", "a")])
    assert [n.node for n in views.fleet(state).nodes] == ["a", "gpu-1", "gpu-2", "gpu-10"]


def test_the_queue_follows_the_schedulers_next_cycle_order_once_it_has_answered() -> None:
    # issue 19: age and the starvation guard can put an old low job ahead of a fresh high one
    state = fold(
        [
            a_submitted("old-low", priority=PriorityClass.LOW, at=T0),
            a_submitted("new-high", priority=PriorityClass.HIGH, at=T0 + 5),
        ]
    )
    assert [j.job_id for j in core.queue(state)] == ["new-high", "old-low"]  # nothing from the scheduler yet
    core.scheduler_said(
        state,
        [
            {"id": "old-low", "state": "pending", "reason": "protected", "position": 1},
            {"id": "new-high", "state": "pending", "reason": "waiting", "position": 2},
            {"id": "other", "state": "running", "reason": "placed", "position": None},
        ],
    )
    fold([a_submitted("newest", priority=PriorityClass.CRITICAL, at=T0 + 9)], state)
    assert [j.job_id for j in views.queue(state).jobs] == ["old-low", "new-high", "newest"]  # unlisted last


def test_held_isolations_are_listed_counted_and_cleared_by_a_confirm_or_a_dismiss() -> None:
    state = fold([a_node_discovered("n1"), a_node_discovered("n2")])
    reason = "nic_down: NIC mlx5_0 down; held: the isolation budget is spent"
    evolve(
        state, IsolationHeld(cluster=CLUSTER, node="n1", at=T0 + 1, action="isolate_gpu", reason=reason, gpu_index=2)
    )
    evolve(state, IsolationHeld(cluster=CLUSTER, node="n2", at=T0 + 2, action="isolate_node", reason="xid 79; held"))
    f = views.faults(state)
    assert [(h.node, h.gpu_index, h.action) for h in f.held] == [("n1", 2, "isolate_gpu"), ("n2", None, "isolate_node")]
    assert f.held[0].reason == reason and f.isolations == []  # held, not isolated: nothing is hidden
    assert f.timeline[0].kind == "isolation_held"
    assert fleet_values(state)["chamber_isolations_held"] == 2
    # the operator confirms one (health then isolates it) and dismisses the other
    evolve(state, GpuIsolated(cluster=CLUSTER, node="n1", gpu_index=2, at=T0 + 3, reason="confirmed"))
    evolve(state, IsolationDismissed(cluster=CLUSTER, node="n2", at=T0 + 4, reason="dismissed by operator"))
    assert views.faults(state).held == [] and fleet_values(state)["chamber_isolations_held"] == 0
    assert views.faults(state).timeline[0].kind == "isolation_dismissed"


def test_over_budget_is_the_same_whichever_stream_is_folded_first() -> None:
    """BudgetSet is on QUOTA and BudgetExceeded on BILLING: the flag follows the events' times."""
    budget = BudgetSet(team="vision", at=1000.0, amount=1.0)
    over = BudgetExceeded(team="vision", at=1090.0, budget=1.0, spent=1.25)
    raised = BudgetSet(team="vision", at=1100.0, amount=5.0)
    for quota, flagged in (((budget,), True), ((budget, raised), False)):
        for i in range(len(quota) + 1):  # the excess folded before, between or after the quota events
            state = GatewayState()
            for event in (*quota[:i], over, *quota[i:]):
                evolve(state, event)
            assert (state.teams["vision"].budget_exceeded_at is not None) == flagged, (quota, i)
