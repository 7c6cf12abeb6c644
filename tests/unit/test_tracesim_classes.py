"""Issue 19 in the simulator: seeded classes for a trace, the per-class report against fifo, the
baselines through the scheduler core, and the targets on a small slice of the ITP trace."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import PriorityClass
from services.scheduler.core import CHAMBER, POLICIES, SchedulerState, events_for, evolve, schedule
from services.scheduler.core.policy import STRICT_CLASSES
from services.tracesim.chamber_policy import CorePolicy
from services.tracesim.classes import DEFAULT_MIX, assign, parse_mix
from services.tracesim.engine import FleetSpec, Simulation
from services.tracesim.metrics import ratios_to, summarize
from services.tracesim.quotas import TeamQuota
from services.tracesim.run import compare, make_policy
from services.tracesim.trace import TraceError, TraceJob, load

ITP = Path(__file__).resolve().parents[2] / "data" / "traces" / "itp" / "jobs.csv"


# -- classes for a trace ---------------------------------------------------------------------------
def test_the_default_mix_gives_the_itp_jobs_the_proportions_of_the_issue() -> None:
    jobs = assign(load(ITP).jobs, parse_mix(DEFAULT_MIX))
    counts = Counter(j.priority for j in jobs)
    expected = {PriorityClass.CRITICAL: 0.1, PriorityClass.HIGH: 58, PriorityClass.NORMAL: 1.5, PriorityClass.LOW: 40.5}
    for cls, pct in expected.items():
        assert 100 * counts[cls] / len(jobs) == pytest.approx(pct, abs=0.5)
    assert all(j.preemptible == (j.priority == PriorityClass.LOW) for j in jobs)


def test_the_class_draw_is_seeded_and_a_job_keeps_its_class_in_any_subset() -> None:
    jobs = load(ITP, limit=2000).jobs
    one = assign(jobs, parse_mix(DEFAULT_MIX, seed=1))
    assert one == assign(jobs, parse_mix(DEFAULT_MIX, seed=1))
    assert one != assign(jobs, parse_mix(DEFAULT_MIX, seed=2))
    subset = assign(jobs[500:700], parse_mix(DEFAULT_MIX, seed=1))
    assert subset == one[500:700]


def test_any_mix_may_be_given_and_mistakes_are_named() -> None:
    mix = parse_mix("high=1,low=3", "high,low")
    assert [(c.value, w) for c, w in mix.weights] == [("high", 0.25), ("low", 0.75)]
    assert mix.preemptible == {PriorityClass.HIGH, PriorityClass.LOW}
    assert parse_mix("normal=1", "none").preemptible == frozenset()
    for bad, message in [
        ("urgent=1", "'urgent' is not a priority class"),
        ("high", "needs a weight"),
        ("high=x", "not a number"),
        ("high=0", "at least one class"),
        ("high=1,high=2", "appears twice"),
        ("high=-1", "0 or more"),
    ]:
        with pytest.raises(TraceError, match=message):
            parse_mix(bad)


# -- the baselines are the core ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fifo", "static-quota", "chamber"])
def test_every_simulated_policy_is_the_scheduler_core_with_its_registered_policy(name: str) -> None:
    policy = make_policy(name)
    assert isinstance(policy, CorePolicy) and policy.policy == POLICIES[name]


rows = st.lists(
    st.tuples(
        st.integers(0, 400),
        st.integers(1, 200),
        st.sampled_from([1, 2, 4, 8, 16]),
        st.sampled_from(["a", "b"]),
        st.sampled_from(list(PriorityClass)),
        st.booleans(),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=15, deadline=None)
@given(rows, st.sampled_from(["fifo", "static-quota", "chamber"]), st.booleans())
def test_a_replay_of_any_policys_log_decides_the_same(data, name, fair_share) -> None:  # type: ignore[no-untyped-def]
    jobs = [
        TraceJob(id=f"j{i}", submit_s=s, duration_s=d, gpus=g, team=t, priority=p, preemptible=pre)
        for i, (s, d, g, t, p, pre) in enumerate(data)
    ]
    sim_policy = CorePolicy(POLICIES[name], fair_share=fair_share)  # the factors it publishes are in its log
    quotas = {"a": TeamQuota("a", "default", 12), "b": TeamQuota("b", "default", 12)}
    Simulation(jobs, FleetSpec(gpus=24), quotas, sim_policy).run()  # type: ignore[arg-type]
    state, mark, done = SchedulerState(), None, 0
    for position, now in sim_policy.cycles:
        for event in sim_policy.folded[done:position]:
            evolve(state, event)
        done = position
        cycle = schedule(state, now, mark, policy=POLICIES[name])
        mark = cycle.mark
        expected = [e for e, _ in events_for(cycle.decisions, now)]
        assert sim_policy.folded[done : done + len(expected)] == expected, f"{name} replayed differently at t={now}"


# -- bounded waiting in a simulation ----------------------------------------------------------------
def test_a_normal_gang_behind_a_steady_stream_of_high_work_starts_within_the_bound() -> None:
    """Protected after the bound, the gang queues with high work one guard_lift_every_s later."""
    bound, lift_every = CHAMBER.starvation_bound_s, CHAMBER.guard_lift_every_s
    assert bound is not None and lift_every is not None
    every, runs = 50.0, 100.0  # two high jobs always hold one node each: never two nodes free at once
    stream = [
        TraceJob(id=f"h{i:04d}", submit_s=i * every, duration_s=runs, gpus=8, team="a", priority=PriorityClass.HIGH)
        for i in range(int((bound + lift_every + bound / 2) / every))
    ]
    gang = TraceJob(id="gang", submit_s=1.0, duration_s=runs, gpus=16, team="a", priority=PriorityClass.NORMAL)
    quotas = {"a": TeamQuota("a", "default", 16)}
    fleet = FleetSpec(gpus=16)
    strict = Simulation([*stream, gang], fleet, quotas, CorePolicy(STRICT_CLASSES)).run()
    guarded = Simulation([*stream, gang], fleet, quotas, CorePolicy(CHAMBER)).run()
    assert strict.jobs["gang"].first_start is not None and strict.jobs["gang"].first_start >= stream[-1].submit_s
    started = guarded.jobs["gang"].first_start
    assert started is not None and started <= 1.0 + bound + lift_every + runs + every


def _slice_with_classes(start: int, n: int, gpus: int, share: float) -> tuple[list[TraceJob], dict[str, TeamQuota]]:
    """ITP jobs start..start+n with the default classes; guarantees proportional to each team's
    demand in the slice, `share` of the fleet in all (the rest is nobody's)."""
    jobs = assign(load(ITP, limit=start + n).jobs[start:], parse_mix(DEFAULT_MIX))
    demand: Counter[str] = Counter()
    for j in jobs:
        demand[j.team] += j.gpus * j.duration_s
    total = sum(demand.values())
    return jobs, {t: TeamQuota(t, "default", int(share * gpus * d / total)) for t, d in demand.items()}


def test_on_a_slice_of_the_itp_trace_with_classes_the_issue_targets_hold() -> None:
    jobs, quotas = _slice_with_classes(20_000, 1_500, 256, 0.85)
    result, _ = compare(jobs, FleetSpec(gpus=256), quotas, ["fifo", "chamber"])
    fifo, chamber = result["policies"]["fifo"], result["policies"]["chamber"]
    for cls, row in chamber["by_priority"].items():
        assert row["wait_p99_s"] <= fifo["by_priority"][cls]["wait_p99_s"], cls
        assert "ratio_to_fifo" in row
    assert chamber["by_priority"]["high"]["wait_mean_s"] <= chamber["by_priority"]["low"]["wait_mean_s"]
    assert chamber["utilization"] >= fifo["utilization"] - 0.01
    assert chamber["wait_mean_s"] < fifo["wait_mean_s"]


def test_ratios_to_fifo_are_per_class_and_none_where_fifo_waited_nothing() -> None:
    base = {"by_priority": {"high": {"wait_mean_s": 10.0, "wait_p50_s": 0.0, "wait_p99_s": 20.0}}}
    other = {
        "by_priority": {
            "high": {"wait_mean_s": 5.0, "wait_p50_s": 0.0, "wait_p99_s": 30.0},
            "low": {"wait_mean_s": 1.0, "wait_p50_s": 0.0, "wait_p99_s": 1.0},
        }
    }
    ratios_to(base, other)
    assert other["by_priority"]["high"]["ratio_to_fifo"] == {"mean": 0.5, "p50": None, "p99": 1.5}
    assert "ratio_to_fifo" not in other["by_priority"]["low"]


def test_summaries_report_wait_percentiles_per_class() -> None:
    jobs = [
        TraceJob(id="a", submit_s=0, duration_s=100, gpus=8, team="t", priority=PriorityClass.HIGH),
        TraceJob(id="b", submit_s=0, duration_s=100, gpus=8, team="t", priority=PriorityClass.LOW),
    ]
    out = summarize(Simulation(jobs, FleetSpec(gpus=8), {"t": TeamQuota("t", "default", 8)}, make_policy("fifo")).run())
    assert out["by_priority"]["high"]["wait_p50_s"] == 0 and out["by_priority"]["low"]["wait_p50_s"] == 100
