"""The indexes the fold keeps for the cycle's hot paths (state.Derived) follow the facts, and are never
saved: a state loaded from a snapshot builds them again and decides the same."""

from __future__ import annotations

from events import GpuIsolated, JobCancelled
from services.scheduler.core import schedule
from services.scheduler.core.state import Derived, derived
from services.scheduler.service import snapshot_codec
from tests.scheduler_builders import Driver, a_job, a_node, done


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
