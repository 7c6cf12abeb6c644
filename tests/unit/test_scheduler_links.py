"""Gangs keep off degraded links and congested leaves while anything else fits (core/links.py)."""

from __future__ import annotations

import pytest

from events import FaultKind, GpuFaultDetected, Severity
from events.fabric import CulpritKind, JobSlowdownCleared, JobSlowdownDetected
from services.scheduler.core import Policy, explain
from tests.scheduler_builders import Driver, a_job, a_node


def a_verdict(culprit: CulpritKind, *, node: str | None = None, leaf: str | None = None, episode: int = 1,
              at: float = 5.0) -> JobSlowdownDetected:  # fmt: skip
    return JobSlowdownDetected(
        job_id="victim", episode=episode, at=at, since=at - 5, culprit=culprit, score=0.6, confidence=0.9,
        cluster="c1" if node else None, node=node, nic="mlx5_3/1" if culprit == CulpritKind.NIC else None,
        gpu_index=3 if culprit != CulpritKind.FABRIC else None, leaf=leaf,
    )  # fmt: skip


def a_nic_fault(node: str, kind: FaultKind = FaultKind.NIC_ERRORS, at: float = 5.0) -> GpuFaultDetected:
    return GpuFaultDetected(
        fault_id=f"{node}/{kind}/{at}", cluster="c1", node=node, kind=kind, severity=Severity.WARNING,
        observed_at=at, gpu_index=2, detail="150 symbol errors in 60 s",
    )  # fmt: skip


def four_nodes(**leaves: str) -> Driver:
    return Driver().given(*(a_node(f"n{i}", **({"leaf": leaves[f"n{i}"]} if leaves else {})) for i in range(1, 5)))


def test_a_gang_keeps_off_the_node_of_a_nic_culprit_and_explain_says_so() -> None:
    d = four_nodes().given(a_verdict(CulpritKind.NIC, node="n1"), a_job("gang", gpus=8, replicas=2))
    d.cycle()
    assert set(d.where("gang")) == {"n2", "n3"}  # n1 first by node order, but its NIC slowed a job
    text = explain(d.state, "gang", d.waiting)["text"]  # type: ignore[index]
    assert "kept off degraded links (n1: NIC mlx5_3/1 slowed job victim" in text


def test_a_gang_keeps_off_a_congested_leaf() -> None:
    d = four_nodes(n1="leaf-a", n2="leaf-a", n3="leaf-b", n4="leaf-b")
    d.given(a_verdict(CulpritKind.FABRIC, leaf="leaf-a"), a_job("gang", gpus=8, replicas=2))
    d.cycle()
    assert set(d.where("gang")) == {"n3", "n4"}
    assert "leaf leaf-a congested" in d.state.jobs["gang"].reason


def test_a_gang_takes_a_degraded_node_when_nothing_else_fits_and_says_so() -> None:
    d = four_nodes().given(a_verdict(CulpritKind.NIC, node="n1"), a_job("gang", gpus=8, replicas=4))
    d.cycle()
    assert set(d.where("gang")) == {"n1", "n2", "n3", "n4"}
    assert "on degraded links because nothing else fits (n1: NIC mlx5_3/1" in d.state.jobs["gang"].reason


def test_the_verdict_cleared_lifts_the_flag() -> None:
    d = four_nodes().given(
        a_verdict(CulpritKind.NIC, node="n1"),
        JobSlowdownCleared(job_id="victim", episode=1, at=8.0, since=0.0, reason="recovered"),
        a_job("gang", gpus=8, replicas=2),
    )
    d.cycle()
    assert set(d.where("gang")) == {"n1", "n2"}
    assert d.state.links.empty and "degraded" not in d.state.jobs["gang"].reason


def test_a_nic_fault_flags_its_node_for_the_configured_time_only() -> None:
    d = four_nodes().given(a_nic_fault("n1", at=100.0), a_job("early", gpus=8, replicas=2))
    d.cycle(now=100.0 + 60)
    assert set(d.where("early")) == {"n2", "n3"}
    assert "nic_errors (rail of GPU 2): 150 symbol errors" in d.state.jobs["early"].reason
    d.given(a_job("late", gpus=8, replicas=2, at=200.0))
    d.cycle(now=100.0 + 1801, policy=Policy(link_fault_memory_s=1800.0))  # the fault is 30 min old: forgotten
    assert set(d.where("late")) == {"n1", "n4"}


def test_avoidance_can_be_turned_off() -> None:
    d = four_nodes().given(a_verdict(CulpritKind.NIC, node="n1"), a_job("gang", gpus=8, replicas=2))
    d.cycle(policy=Policy(avoid_degraded_links=False))
    assert set(d.where("gang")) == {"n1", "n2"}


def test_single_node_jobs_and_gpu_culprits_are_not_link_matters() -> None:
    d = four_nodes().given(
        a_verdict(CulpritKind.NIC, node="n1"),
        a_verdict(CulpritKind.GPU, node="n2", episode=2),
        a_nic_fault("n3", kind=FaultKind.XID),
        a_job("one-node", gpus=8),
        a_job("gang", gpus=8, replicas=2, at=2.0),
    )
    d.cycle()
    assert d.where("one-node") == {"n1": list(range(8))}  # no collective crosses a NIC: best fit as ever
    assert set(d.where("gang")) == {"n2", "n3"}  # a GPU straggler and an XID are not degraded links


def test_placement_leaves_the_index_as_it_found_it_when_it_rolls_back() -> None:
    from services.scheduler.core.placement import fits
    from services.scheduler.core.work import Work

    d = four_nodes().given(a_verdict(CulpritKind.NIC, node="n1"), a_job("gang", gpus=8, replicas=2))
    work = Work(d.state, 10.0)
    before = d.state.capacity.digest()
    d.state.capacity.begin()
    assert fits(work, d.state.jobs["gang"], work.usage)
    d.state.capacity.end()
    assert d.state.capacity.digest() == before


def test_the_fault_memory_is_checked() -> None:
    with pytest.raises(ValueError, match="link_fault_memory_s"):
        Policy(link_fault_memory_s=0)
