"""The trace simulator: exact small scenarios, conservation of work, bad rows, determinism."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import PriorityClass
from services.scheduler.core import SchedulerState, events_for, evolve, schedule
from services.tracesim.chamber_policy import ChamberPolicy
from services.tracesim.engine import FleetSpec, Simulation
from services.tracesim.metrics import jain, percentile, summarize
from services.tracesim.quotas import TeamQuota, equal_shares, load_quotas
from services.tracesim.run import POLICIES, make_policy
from services.tracesim.trace import TraceError, TraceJob, load, parse

ITP = Path(__file__).resolve().parents[2] / "data" / "traces" / "itp" / "jobs.csv"


def a_job(job_id: str, *, at: float = 0, runs: float = 100, gpus: int = 1, team: str = "a", **kw: object) -> TraceJob:
    return TraceJob(id=job_id, submit_s=at, duration_s=runs, gpus=gpus, team=team, **kw)  # type: ignore[arg-type]


def run(policy: str, jobs: list[TraceJob], gpus: int, quotas: dict[str, TeamQuota] | None = None, **kw: object):  # type: ignore[no-untyped-def]
    fleet = FleetSpec(gpus=gpus, gpus_per_node=kw.pop("gpus_per_node", 8))  # type: ignore[arg-type]
    teams = sorted({j.team for j in jobs})
    return Simulation(jobs, fleet, quotas or equal_shares(teams, gpus), make_policy(policy), **kw).run()  # type: ignore[arg-type]


# -- exact scenarios, computed by hand -----------------------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES)
def test_two_jobs_that_fit_side_by_side_run_at_once(policy: str) -> None:
    out = run(policy, [a_job("x", runs=100, gpus=4), a_job("y", runs=50, gpus=4, team="b")], gpus=8)
    m = summarize(out)
    assert m["wait_mean_s"] == 0 and m["makespan_s"] == 100
    assert m["jct_mean_s"] == 75  # (100 + 50) / 2
    assert m["utilization"] == pytest.approx((4 * 100 + 4 * 50) / (8 * 100))


def test_fifo_blocks_behind_a_big_head_while_chamber_backfills() -> None:
    jobs = [
        a_job("long", at=0, runs=100, gpus=6),
        a_job("big", at=1, runs=10, gpus=8),  # must wait for `long`
        a_job("small", at=2, runs=50, gpus=2),  # fits now and ends before `long` does: backfill
    ]
    fifo = summarize(run("fifo", jobs, gpus=8))
    chamber_out = run("chamber", jobs, gpus=8, quotas={"a": TeamQuota("a", "default", 8)})
    assert fifo["wait_mean_s"] == pytest.approx((0 + 99 + 108) / 3)  # small waits for big: 2 -> 110
    assert fifo["utilization_while_submitting"] == 0.75  # 6 of 8 GPUs busy from 0 to the last submit at 2
    assert chamber_out.jobs["small"].first_start == 2
    assert chamber_out.jobs["big"].first_start == 100  # backfill did not delay the reserved job


def test_static_quota_keeps_a_team_inside_its_partition_and_chamber_lends_idle_capacity() -> None:
    jobs = [a_job(f"a{i}", runs=100, gpus=4, team="a") for i in range(2)] + [a_job("b0", at=500, runs=10, team="b")]
    quotas = {"a": TeamQuota("a", "default", 4), "b": TeamQuota("b", "default", 4)}
    static = run("static-quota", jobs, gpus=8, quotas=quotas)
    assert static.jobs["a1"].first_start == 100  # a's second job waits although b's GPUs are idle
    chamber_out = run("chamber", jobs, gpus=8, quotas=quotas)
    assert chamber_out.jobs["a1"].first_start == 0  # borrowed b's idle guarantee


def test_reclaim_preempts_the_borrower_and_its_work_since_the_checkpoint_is_lost() -> None:
    quotas = {"a": TeamQuota("a", "default", 4), "b": TeamQuota("b", "default", 4)}
    jobs = [
        a_job("a-big", at=0, runs=1000, gpus=8, team="a", checkpoint_interval_s=30),  # borrows all of b's
        a_job("b-1", at=100, runs=50, gpus=4, team="b"),  # b wants its guarantee back
    ]
    out = run("chamber", jobs, gpus=8, quotas=quotas)
    big = out.jobs["a-big"]
    assert out.jobs["b-1"].first_start == 100
    assert big.preemptions == 1
    assert big.lost_gpu_s == pytest.approx(10 * 8)  # ran 100 s, kept 90 s (3 checkpoints)
    assert big.end is not None
    # queued 0 s before its first start, then from the preemption at 100 s until b-1 ends at 150 s
    assert big.first_start == 0 and big.queued_s == pytest.approx(50)
    low = summarize(out)["by_priority"][big.t.priority.value]
    assert low["wait_p99_s"] == 0 and low["queued_p99_s"] == pytest.approx(50)


# -- properties ----------------------------------------------------------------------------------
trace_jobs = st.lists(
    st.tuples(
        st.integers(0, 500),  # submit
        st.integers(1, 300),  # duration
        st.sampled_from([1, 2, 4, 8, 16]),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(list(PriorityClass)),
        st.one_of(st.none(), st.integers(10, 100)),
    ),
    min_size=1,
    max_size=25,
)


def _jobs(rows: list[tuple[int, int, int, str, PriorityClass, int | None]]) -> list[TraceJob]:
    return [
        TraceJob(id=f"j{i}", submit_s=s, duration_s=d, gpus=g, team=t, priority=p, checkpoint_interval_s=c)
        for i, (s, d, g, t, p, c) in enumerate(rows)
    ]


@settings(max_examples=40, deadline=None)
@given(trace_jobs, st.sampled_from(POLICIES), st.sampled_from([0.0, 3.0]))
def test_work_is_conserved_every_job_runs_its_duration_plus_what_was_lost(rows, policy, fault_rate) -> None:  # type: ignore[no-untyped-def]
    jobs = _jobs(rows)
    out = run(policy, jobs, gpus=32, fault_rate_per_node_day=fault_rate, repair_s=50.0, seed=7)
    for job in out.jobs.values():
        if job.end is None:
            continue
        assert job.run_gpu_s == pytest.approx(job.t.duration_s * job.t.gpus + job.lost_gpu_s)
        assert 0.0 <= job.lost_to_faults_gpu_s <= job.lost_gpu_s + 1e-6
        if fault_rate == 0.0:
            assert job.lost_to_faults_gpu_s == 0.0  # without faults, only preemption loses work
        # in the queue before the first start, and again after every stop until the job ran again:
        # the end minus the submit is the time queued plus the time run (what was lost included)
        assert job.first_start is not None and job.queued_s >= job.first_start - job.t.submit_s - 1e-6
        ran = (job.run_gpu_s - job.hang_gpu_s) / job.t.gpus
        assert job.end - job.t.submit_s == pytest.approx(job.queued_s + ran)
    if policy != "static-quota":  # a job larger than its team's partition never runs there
        assert out.unfinished == 0


@settings(max_examples=15, deadline=None)
@given(trace_jobs)
def test_the_chamber_policy_decides_exactly_as_the_live_scheduler_core_would_on_its_log(rows) -> None:  # type: ignore[no-untyped-def]
    """Replay the event log the simulation produced into a fresh scheduler state, cycle by cycle,
    and the same decisions come out (the simulator drives the live core, not a copy)."""
    jobs = _jobs(rows)
    policy = ChamberPolicy()
    fleet = FleetSpec(gpus=32)
    Simulation(jobs, fleet, equal_shares(["a", "b", "c"], 32), policy).run()  # type: ignore[arg-type]
    log = policy.folded
    state, mark, done = SchedulerState(), None, 0
    for position, now in policy.cycles:  # the log positions each live cycle used
        for event in log[done:position]:
            evolve(state, event)
        done = position
        cycle = schedule(state, now, mark)
        mark = cycle.mark
        expected = [e for e, _ in events_for(cycle.decisions, now)]
        assert log[done : done + len(expected)] == expected, f"the replay decided differently at t={now}"
    assert policy.decision_log, "the scenario decided nothing"


def test_the_same_trace_gives_the_same_results_twice() -> None:
    jobs = load(ITP, limit=400).jobs
    first = summarize(run("chamber", jobs, gpus=64))
    second = summarize(run("chamber", jobs, gpus=64))
    assert first == second


# -- traces and quotas ---------------------------------------------------------------------------------
def test_bad_rows_are_reported_with_their_line_numbers_and_skipped() -> None:
    text = (
        "job_id,submit_time_s,duration_s,num_gpus,team,priority\n"
        "ok,0,10,1,a,high\n"
        "neg,0,-5,1,a,normal\n"
        "zero,0,10,0,a,normal\n"
        "nan,x,10,1,a,normal\n"
        "prio,0,10,1,a,urgent\n"
        "ok,1,10,1,a,normal\n"
    )
    trace = parse(text.splitlines(keepends=True))
    assert [j.id for j in trace.jobs] == ["ok"]
    assert [(b.line, b.problem.split(" ")[0]) for b in trace.bad_rows] == [
        (3, "duration_s"),
        (4, "num_gpus"),
        (5, "submit_time_s"),
        (6, "priority"),
        (7, "job_id"),
    ]
    with pytest.raises(TraceError, match=r"trace:3: duration_s is -5"):
        parse(text.splitlines(keepends=True), strict=True)


def test_a_trace_without_the_required_columns_is_refused() -> None:
    with pytest.raises(TraceError, match="missing column"):
        parse(["id,when\n", "1,2\n"])


def test_the_bundled_itp_trace_loads_cleanly() -> None:
    trace = load(ITP)
    assert len(trace.jobs) == 49_999 and not trace.bad_rows
    assert len(trace.teams) == 10


def test_quota_files_are_validated(tmp_path: Path) -> None:
    good = tmp_path / "q.toml"
    good.write_text(
        "[pools.default]\ngpus = 16\n[teams.a]\nguaranteed = 8\nborrow_limit = 4\n[teams.b]\nguaranteed = 8\n"
    )
    quotas = load_quotas(good, ["a", "b", "c"], 16)
    assert quotas["a"].borrow_limit == 4 and quotas["c"].guaranteed == 0
    over = tmp_path / "over.toml"
    over.write_text("[teams.a]\nguaranteed = 20\n")
    with pytest.raises(TraceError, match="more than the fleet"):
        load_quotas(over, ["a"], 16)
    bad_pool = tmp_path / "pool.toml"
    bad_pool.write_text('[teams.a]\npool = "nope"\nguaranteed = 1\n')
    with pytest.raises(TraceError, match=r"\[teams.a\]: pool 'nope'"):
        load_quotas(bad_pool, ["a"], 16)


def test_metric_helpers() -> None:
    assert percentile([5, 1, 4, 2, 3], 50) == 3 and percentile([], 99) == 0
    assert jain([1, 1, 1]) == 1.0 and jain([1, 0]) == 0.5


def test_lower_priority_work_does_not_reclaim_from_a_critical_borrower_so_they_never_ping_pong() -> None:
    # Were low work allowed to reclaim from the critical job, the critical job would preempt it
    # back at once (critical beats lower classes), and the two would trade the GPUs forever.
    quotas = {"a": TeamQuota("a", "default", 8), "b": TeamQuota("b", "default", 8)}
    jobs = [
        a_job("urgent", at=0, runs=100, gpus=16, team="a", priority=PriorityClass.CRITICAL),
        a_job("sweep", at=10, runs=50, gpus=8, team="b", priority=PriorityClass.LOW),
    ]
    out = run("chamber", jobs, gpus=16, quotas=quotas)
    assert out.jobs["urgent"].preemptions == 0 and out.jobs["urgent"].end == 100
    assert out.jobs["sweep"].first_start == 100
