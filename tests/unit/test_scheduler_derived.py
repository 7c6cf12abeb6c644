"""The indexes the fold keeps for the cycle's hot paths (state.Derived) follow the facts, and are never
saved: a state loaded from a snapshot builds them again and decides the same."""

from __future__ import annotations

import pickle
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events import Event, GpuIsolated, GpuShare, JobCancelled, JobStarted, JobSubmitted, PriorityClass
from services.scheduler.core import JobState, SchedulerState, preemption, schedule
from services.scheduler.core.state import Derived, derived
from services.scheduler.core.work import Work
from services.scheduler.service import snapshot_codec
from tests.scheduler_builders import Driver, a_job, a_node, a_quota, done

TEAMS = ["a", "b", "c"]
PRIORITIES = ["critical", "high", "normal", "low"]


def a_busy_fleet() -> Driver:
    """Two teams, low and normal work running and waiting: urgent work arriving preempts."""
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        *[a_job(f"low{i}", gpus=2, priority="low", at=i) for i in range(4)],
        *[a_job(f"nlp{i}", team="nlp", gpus=4, at=i, checkpoint=30) for i in range(3)],
        a_job("np", gpus=2, preemptible=False, at=5),
    )
    d.cycle(now=10)
    return d


def test_the_victim_groups_follow_the_fold() -> None:
    d = a_busy_fleet()
    d.given(a_job("urgent", gpus=2, priority="high", at=20))
    d.cycle(now=30)  # preempts: jobs leave the groups
    d.given(done("nlp0", at=40), JobCancelled(job_id="low3", at=41))
    d.cycle(now=50)  # capacity freed: suspended work resumes
    kept = derived(d.state).victim_groups(d.state.jobs)
    built = Derived().victim_groups(d.state.jobs)
    assert {k: sorted(v) for k, v in kept.items() if v} == {k: sorted(v) for k, v in built.items()}
    assert built  # the scenario leaves preemptible work running


def test_a_loaded_snapshot_rebuilds_them_and_decides_the_same() -> None:
    d = a_busy_fleet()
    d.given(a_job("urgent", gpus=2, priority="high", at=20))
    decided = schedule(d.state, 30)
    assert derived(d.state).victims is not None and any(type(x).__name__ == "Preempt" for x in decided.decisions)
    codec = snapshot_codec()
    loaded = codec.decode(codec.encode(d.state))
    assert derived(loaded).victims is None  # not in the snapshot
    assert schedule(loaded, 30).decisions == decided.decisions


def test_the_capacity_index_after_admissions_is_what_recomputing_each_node_gives() -> None:
    d = a_busy_fleet()  # admissions folded take their GPUs off the index without recomputing the node
    d.given(GpuIsolated(cluster="c1", node="n2", gpu_index=7, at=11, reason="xid"))
    d.given(a_job("urgent", gpus=2, priority="high", at=20))
    d.cycle(now=30)
    kept = d.state.capacity.digest()
    for node in d.state.node_by_id:
        d.state.refresh_node(node)
    assert d.state.capacity.digest() == kept


def _node_index(index: Derived) -> tuple[dict[Any, dict[Any, int]], dict[Any, dict[Any, list[str]]]]:
    gpus = {g: {k: n for k, n in on.items() if n} for g, on in index.node_gpus.items()}
    jobs = {g: {k: sorted(js) for k, js in on.items() if js} for g, on in index.node_jobs.items()}
    return {g: on for g, on in gpus.items() if on}, {g: on for g, on in jobs.items() if on}


def test_the_victims_by_node_follow_the_fold() -> None:
    d = a_busy_fleet()
    d.given(a_job("urgent", gpus=2, priority="high", at=20), a_job("gang", gpus=4, replicas=2, priority="high", at=21))
    d.cycle(now=30)
    d.given(done("nlp1", at=40), JobCancelled(job_id="low2", at=41))
    d.cycle(now=50)
    kept = derived(d.state)
    built = Derived()
    built.victim_groups(d.state.jobs)
    assert _node_index(kept) == _node_index(built)
    assert _node_index(built)[0]  # preemptible work runs on some node


def _node_columns(index: Derived) -> dict[Any, tuple[list[int], list[int]]]:
    """Each group's columns by node id (GPUs listed, jobs placed), without the rows of zeros."""
    out = {}
    for g, (gpus, jobs) in index.on_nodes.items():
        rows = [nid for nid in range(max(len(gpus), len(jobs))) if gpus[nid] or jobs[nid]]
        if rows:
            out[g] = ([gpus[nid] for nid in rows], [jobs[nid] for nid in rows])
    return out


def test_the_victims_by_node_id_follow_the_fold_and_the_capacity_columns_follow_the_index() -> None:
    d = a_busy_fleet()
    d.given(a_job("urgent", gpus=2, priority="high", at=20), a_job("gang", gpus=4, replicas=2, priority="high", at=21))
    d.cycle(now=30)
    d.given(
        done("nlp1", at=40),
        JobCancelled(job_id="low2", at=41),
        GpuIsolated(cluster="c1", node="n1", gpu_index=3, at=42, reason="xid"),
    )
    d.cycle(now=50)
    kept = derived(d.state)
    built = Derived()
    built.nodes = d.state.nodes
    built.victim_groups(d.state.jobs)
    assert _node_columns(kept) == _node_columns(built)
    assert _node_columns(built) and not kept.partial  # preemptible work runs on some (known) node
    cap = d.state.capacity
    for nid, slot in enumerate(cap.slots):
        assert (cap.free_col[nid], cap.cls_col[nid]) == (len(slot.free) if slot.usable else -1, slot.cls)
    loaded = pickle.loads(pickle.dumps(cap))
    assert (loaded.free_col, loaded.cls_col) == (cap.free_col, cap.cls_col)
    assert "free_col" not in cap.__getstate__()  # rebuilt on load, not in a snapshot
    # a node's free GPUs are a tuple in memory, a list in a snapshot (as the release before wrote them)
    assert all(type(s.free) is tuple and type(s.__getstate__()["free"]) is list for s in loaded.slots)


def test_victim_costs_from_the_folds_columns_are_those_computed_job_by_job() -> None:
    d = Driver().given(
        a_node("n1"),
        a_node("n2"),
        a_job("low0", gpus=8, priority="low", at=0, checkpoint=30),
        *[a_job(f"low{i}", gpus=2, priority="low", at=i, checkpoint=[None, 45.0][i % 2]) for i in range(1, 5)],
    )
    d.cycle(now=10)
    d.given(a_job("urgent", gpus=8, priority="high", at=20))
    d.cycle(now=30)  # preempts low1 to low4 (what frees a node losing least)
    d.given(done("urgent", at=40), done("low3", at=41))
    d.cycle(now=50)  # they resume: preempted once before, each costs twice its lost work; low3's row is free
    d.given(*(JobStarted(job_id=jid, at=51.5 + i) for i, jid in enumerate(["low0", "low2", "low4"])))
    d.given(a_job("low5", gpus=2, priority="low", at=52, checkpoint=45.0))
    d.cycle(now=60)  # low5 takes low3's row
    index = derived(d.state)
    members = (index.victims or {})[("default", "vision", PriorityClass.LOW.rank)]
    assert members["low1"].preemptions == 1 and "low5" in members and "low3" not in members
    for now in (60.0, 977.25, 4000.0):
        from_columns = index.costs[("default", "vision", PriorityClass.LOW.rank)].costs(now)
        assert sorted(from_columns) == sorted(preemption._costs(members, now))


SHARE = GpuShare(gpu_milli=500)


@st.composite
def fleets_and_probes(draw: st.DrawFn) -> tuple[list[Event], list[tuple[str, ...]], list[JobSubmitted]]:
    """A fleet, quotas, a history of submissions, completions and cycles, then jobs to search victims for."""
    sizes = draw(st.lists(st.sampled_from([4, 8, 8]), min_size=2, max_size=6))
    nodes: list[Event] = [a_node(f"n{i}", gpus=g) for i, g in enumerate(sizes)]
    quotas: list[Event] = [a_quota(t, draw(st.integers(0, 12)), borrow=draw(st.sampled_from([None, 8]))) for t in TEAMS]
    job = st.tuples(
        st.just("submit"),
        st.sampled_from(TEAMS),
        st.sampled_from([1, 2, 2, 4, 4, 8]),
        st.sampled_from([1, 1, 1, 2]),
        st.sampled_from(PRIORITIES),
        st.sampled_from(["yes", "yes", "yes", "no", "share"]),
        st.sampled_from(["", "60"]),
    )
    cycle, finish = st.tuples(st.just("cycle")), st.tuples(st.just("done"))
    first = draw(st.lists(st.one_of(job, job, job, cycle), min_size=10, max_size=36))  # fill the fleet
    history = [*first, ("cycle",), *draw(st.lists(st.one_of(job, cycle, finish), max_size=12))]
    probes = [
        a_job(f"probe{i}", team=t, gpus=g, replicas=r, priority=p, preemptible=pre, at=1000)
        for i, (t, g, r, p, pre) in enumerate(
            draw(
                st.lists(
                    st.tuples(
                        st.sampled_from(TEAMS),
                        st.sampled_from([1, 2, 4, 8]),
                        st.sampled_from([1, 1, 2, 3]),
                        st.sampled_from(PRIORITIES),
                        st.booleans(),
                    ),
                    min_size=1,
                    max_size=8,
                )
            )
        )
    ]
    return [*nodes, *quotas], history, probes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets_and_probes())
def test_the_indexed_victim_search_picks_what_walking_every_victim_picks(
    scenario: tuple[list[Event], list[tuple[str, ...]], list[JobSubmitted]],
) -> None:
    setup, history, probes = scenario
    d = Driver().given(*setup)
    now = 0.0
    for i, step in enumerate([*history, ("cycle",)]):
        now += 7.0
        if step[0] == "submit":
            _, team, gpus, replicas, priority, kind, checkpoint = step
            share = SHARE if kind == "share" else None
            d.given(
                a_job(
                    f"j{i}",
                    team=team,
                    gpus=1 if share else int(gpus),
                    replicas=int(replicas),
                    priority=priority,
                    preemptible=kind != "no",
                    checkpoint=float(checkpoint) if checkpoint else None,
                    share=share,
                    at=now,
                )
            )
        elif step[0] == "done":
            running = sorted(j.id for j in d.state.jobs.values() if j.state == JobState.RUNNING)
            if running:
                d.given(done(running[i % len(running)], at=now))
        else:
            d.cycle(now=now)
    d.given(*probes)
    state, now = d.state, now + 5
    for probe in probes:
        job = state.jobs[probe.job_id]
        found = []
        # walking every victim; the index where it saves time; the index wherever it can be read; each
        # of those reading the nodes by columns (as on a large fleet) instead of one by one
        # (and computing victim costs from the fold's columns)
        kept = preemption._FEW_BEFORE, preemption._FEW_NODES, preemption._FEW_FOR_COLUMNS
        few, cols, costs = kept
        ways = ((False, few, cols, costs), (True, few, cols, costs), (True, 0, cols, costs))
        ways += ((True, few, 0, 0), (True, 0, 0, 0))
        for indexed, *limits in ways:
            work = Work(state, now)
            state.capacity.begin()
            preemption._FEW_BEFORE, preemption._FEW_NODES, preemption._FEW_FOR_COLUMNS = limits
            try:
                picked = preemption.select(work, job, indexed=indexed)
            finally:
                preemption._FEW_BEFORE, preemption._FEW_NODES, preemption._FEW_FOR_COLUMNS = kept
                state.capacity.end()
            found.append(None if picked is None else [(v.id, r) for v, r in picked])
        assert all(f == found[0] for f in found[1:]), probe.job_id


def _both_ways(state: SchedulerState, job_id: str, now: float) -> list[list[tuple[str, str]] | None]:
    found: list[list[tuple[str, str]] | None] = []
    for indexed in (True, False):
        work = Work(state, now)
        state.capacity.begin()
        try:
            picked = preemption.select(work, state.jobs[job_id], indexed=indexed)
        finally:
            state.capacity.end()
        found.append(None if picked is None else sorted((v.id, r.value) for v, r in picked))
    return found


def test_a_gang_reclaims_from_a_borrower_only_until_it_is_back_within_its_guarantee() -> None:
    d = Driver().given(
        *[a_node(f"n{i}") for i in range(4)],
        a_quota("a", 24),
        a_quota("b", 4),
        a_quota("c", 8),
        *[a_job(f"b{i}", team="b", gpus=2, at=i) for i in range(1, 5)],
        a_job("a-low", team="a", priority="low", at=5),
        a_job("c-np", team="c", preemptible=False, at=6),
    )
    d.cycle(now=10)
    d.given(*[a_job(f"b{i}", team="b", gpus=2, at=20 + i) for i in range(5, 9)])
    d.cycle(now=50)  # b's later jobs lose least: reclaim takes them first, then two more, then b is within 4
    d.given(a_job("gang", team="a", gpus=8, replicas=2, at=60))
    indexed, walked = _both_ways(d.state, "gang", 70)
    assert indexed == walked
    assert indexed == [("a-low", "priority"), *[(f"b{i}", "reclaim") for i in range(5, 9)]]
