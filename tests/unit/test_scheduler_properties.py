"""Invariants of the scheduler core over random fleets, quotas and event sequences (hypothesis)."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events import GpuIsolated, GpuRestored, JobCancelled, NodeIsolated, NodeRestored, PreemptionReason
from services.scheduler.core import Admit, JobState, Preempt, Requeue, SchedulerState, evolve, schedule
from tests.scheduler_builders import Driver, a_job, a_node, a_quota, done

TEAMS = ["a", "b", "c"]
PRIORITIES = ["critical", "high", "normal", "low"]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[object], list[tuple[str, ...]]]:
    nodes = [
        a_node(f"n{i}", gpus=draw(st.sampled_from([2, 4, 8])), rack=draw(st.sampled_from(["r1", "r2"])))
        for i in range(draw(st.integers(1, 5)))
    ]
    total = sum(len(n.gpus) for n in nodes)
    quotas = []
    left = total
    for team in TEAMS[: draw(st.integers(1, 3))]:
        g = draw(st.integers(0, left))
        left -= g
        quotas.append(
            a_quota(
                team,
                g,
                borrow=draw(st.one_of(st.none(), st.integers(0, total))),
                lend=draw(st.one_of(st.none(), st.integers(0, g))),
            )
        )
    submit = st.tuples(
        st.just("submit"),
        st.sampled_from(TEAMS),
        st.sampled_from([1, 2, 4, 8]),
        st.sampled_from([1, 1, 1, 2, 3]),
        st.sampled_from(PRIORITIES),
        st.sampled_from([True, True, True, False]),
    )
    cycle = st.tuples(st.just("cycle"))
    actions = draw(
        st.lists(
            st.one_of(
                submit,
                submit,
                submit,
                cycle,
                cycle,
                st.tuples(st.just("complete"), st.integers(0, 50)),
                st.tuples(st.just("cancel"), st.integers(0, 50)),
                st.tuples(st.just("isolate"), st.integers(0, 4)),
                st.tuples(st.just("restore"), st.integers(0, 4)),
                st.tuples(st.just("bad_gpu"), st.integers(0, 4), st.integers(0, 7)),
            ),
            max_size=60,
        )
    )
    return [*nodes, *quotas], actions


def _check(d: Driver, before: SchedulerState, decisions: list[object]) -> None:
    s = d.state
    # no GPU is given to two jobs, nothing runs on an isolated GPU or node, no gang is partly placed
    held: Counter[tuple[str, str, int]] = Counter()
    for job in s.jobs.values():
        if job.state != JobState.RUNNING:
            continue
        assert sum(len(p.gpu_indices) for p in job.placements) == job.gpus
        for p in job.placements:
            node = s.nodes[(p.cluster, p.node)]
            assert node.in_service, f"{job.id} runs on isolated node {p.node}"
            for i in p.gpu_indices:
                assert i not in node.bad_gpus, f"{job.id} runs on isolated GPU {p.node}:{i}"
                held[(p.cluster, p.node, i)] += 1
    assert all(c == 1 for c in held.values())
    # no team exceeds guarantee + borrow limit
    for (pool, team), q in s.quotas.items():
        if q.borrow_limit is not None:
            assert s.usage.get((pool, team), 0) <= q.guaranteed + q.borrow_limit
    # reclaim never preempts a job of a team at or below its guarantee (judged as decisions apply)
    usage = dict(before.usage)
    for dec in decisions:
        if isinstance(dec, Requeue | Preempt):
            job = before.jobs[dec.job_id]
            key = (job.pool, job.spec.team)
            if isinstance(dec, Preempt) and dec.reason == PreemptionReason.RECLAIM:
                q = before.quotas.get(key)
                assert usage.get(key, 0) > (q.guaranteed if q else 0)
            usage[key] = usage.get(key, 0) - job.gpus
        elif isinstance(dec, Admit):
            job = before.jobs[dec.job_id]
            key = (job.pool, job.spec.team)
            usage[key] = usage.get(key, 0) + job.gpus


def _replay(log: list[object]) -> SchedulerState:
    state = SchedulerState()
    for e in log:
        evolve(state, e)  # type: ignore[arg-type]
    return state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold_through_any_sequence(scenario: tuple[list[object], list[tuple[str, ...]]]) -> None:
    setup, actions = scenario
    d = Driver().given(*setup)  # type: ignore[arg-type]
    names = [n.node for n in setup if hasattr(n, "node")]  # type: ignore[attr-defined]
    now = 10.0
    submitted = 0
    for action in [*actions, ("cycle",)]:
        now += 7.0
        kind = action[0]
        if kind == "submit":
            _, team, gpus, replicas, prio, preemptible = action
            d.given(
                a_job(
                    f"j{submitted}",
                    team=team,
                    gpus=gpus,
                    replicas=replicas,
                    priority=prio,
                    at=now,
                    preemptible=preemptible,
                    checkpoint=30,
                )  # type: ignore[arg-type]
            )
            submitted += 1
        elif kind in ("complete", "cancel") and submitted:
            job = f"j{int(action[1]) % submitted}"
            d.given(done(job, at=now) if kind == "complete" else JobCancelled(job_id=job, at=now))
        elif kind == "isolate":
            d.given(NodeIsolated(cluster="c1", node=names[int(action[1]) % len(names)], at=now, reason="test"))
        elif kind == "restore":
            d.given(NodeRestored(cluster="c1", node=names[int(action[1]) % len(names)], at=now, reason="test"))
        elif kind == "bad_gpu":
            d.given(
                GpuIsolated(
                    cluster="c1", node=names[int(action[1]) % len(names)], gpu_index=int(action[2]), at=now, reason="t"
                )
            )
        else:
            before, twin = _replay(d.log), _replay(d.log)
            cycle = d.cycle(now)
            _check(d, before, cycle.decisions)  # type: ignore[arg-type]
            # the same event log gives the same decisions (a full cycle is exactly a fresh replay's)
            fresh = schedule(before, now)
            assert fresh.decisions == schedule(twin, now).decisions
            if cycle.full:
                assert fresh.decisions == cycle.decisions

    # a preempted job is eventually resumed once capacity allows: restore everything, finish work
    for name in names:
        d.given(NodeRestored(cluster="c1", node=name, at=now, reason="test"))
        for i in range(8):
            d.given(GpuRestored(cluster="c1", node=name, gpu_index=i, at=now, reason="test"))
    for _ in range(submitted + 2):
        now += 7.0
        d.cycle(now)
        for job in list(d.state.jobs.values()):
            if job.state == JobState.RUNNING:
                d.given(done(job.id, at=now))
    assert not [j.id for j in d.state.jobs.values() if j.state == JobState.SUSPENDED]
