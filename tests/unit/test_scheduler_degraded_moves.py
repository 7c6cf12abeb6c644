"""A job on degraded hardware (a straggler verdict, a flapping NIC) moves only where it can land now;
otherwise it keeps running, flagged and explained, and moves when a place frees. Failing hardware
still requeues at once."""

from __future__ import annotations

from events import GpuIsolated, NodeIsolated
from events.faults import FaultKind, GpuFaultDetected, Severity
from services.scheduler.core import Admit, Requeue, explain
from tests.scheduler_builders import Driver, a_job, a_node, done


def straggler(node: str, gpu: int, fault_id: str, at: float = 20.0) -> GpuFaultDetected:
    return GpuFaultDetected(
        fault_id=fault_id,
        cluster="c1",
        node=node,
        kind=FaultKind.STRAGGLER,
        severity=Severity.WARNING,
        observed_at=at,
        gpu_index=gpu,
        detail="gang-a nic: NIC 0 slow",
    )


def two_gangs() -> Driver:
    """8 nodes, two 4-node gangs: gang-a on n0-n3, gang-b on n4-n7 (the fleet is full)."""
    d = Driver().given(*(a_node(f"n{i}") for i in range(8)))
    d.given(a_job("gang-a", gpus=8, replicas=4, at=1), a_job("gang-b", gpus=8, replicas=4, at=2))
    d.cycle(now=5)
    assert set(d.where("gang-a")) == {"n0", "n1", "n2", "n3"} and set(d.where("gang-b")) == {"n4", "n5", "n6", "n7"}
    return d


def test_a_gang_on_a_degraded_nic_stays_while_no_healthy_place_exists_then_moves_when_one_frees() -> None:
    d = two_gangs()
    d.given(
        straggler("n3", 0, "perf/gang-a/1/1"),
        straggler("n3", 0, "perf/gang-a/1/2", at=21),
        GpuIsolated(
            cluster="c1", node="n3", gpu_index=0, at=22, reason="straggler escalated", fault_ids=["perf/gang-a/1/2"]
        ),
    )
    cycle = d.cycle(now=23)
    assert cycle.decisions == []  # no move: it needs 4 whole nodes and only 3 healthy ones are free of it
    assert d.state_of("gang-a") == "running"
    assert cycle.staying["gang-a"] == (
        "running on degraded hardware (n3 GPU 0: straggler escalated): no healthy place for 4x8 GPUs; "
        "moves when one frees"
    )
    found = explain(d.state, "gang-a", d.waiting, now=24)
    assert found is not None and "running on degraded hardware (n3 GPU 0: straggler escalated)" in found["text"]
    assert not d.cycle(now=25).full  # staying put does not make every cycle a full one

    d.given(done("gang-b", at=30))
    cycle = d.cycle(now=31)
    requeue, admit = cycle.decisions
    assert isinstance(requeue, Requeue) and requeue.fault_ids == ("perf/gang-a/1/2",)
    assert requeue.reason == "moved off degraded hardware (n3 GPU 0: straggler escalated)"
    assert isinstance(admit, Admit) and admit.resume
    assert "n3" not in d.where("gang-a") and len(d.where("gang-a")) == 4
    found = explain(d.state, "gang-a", d.waiting, now=32)
    assert found is not None
    assert (
        "moved from n0[0,1,2,3,4,5,6,7], n1[0,1,2,3,4,5,6,7], n2[0,1,2,3,4,5,6,7], n3[0,1,2,3,4,5,6,7]"
        in (found["text"])
    )
    assert "(degraded: n3 GPU 0: straggler escalated)" in found["text"]
    assert "running on degraded hardware" not in found["text"]


def test_a_degraded_job_moves_at_once_when_a_healthy_place_exists() -> None:
    d = Driver().given(a_node("n0"), a_node("n1"), a_job("solo", gpus=8, at=1))
    d.cycle(now=5)
    [node] = d.where("solo")
    d.given(
        straggler(node, 2, "perf/solo/1/1"),
        GpuIsolated(cluster="c1", node=node, gpu_index=2, at=22, reason="straggler", fault_ids=["perf/solo/1/1"]),
    )
    requeue, admit = d.cycle(now=23).decisions
    assert isinstance(requeue, Requeue) and isinstance(admit, Admit)
    assert set(d.where("solo")) == {"n0", "n1"} - {node}


def test_failing_hardware_requeues_even_with_nowhere_to_go() -> None:
    d = two_gangs()
    d.given(NodeIsolated(cluster="c1", node="n3", at=22, reason="xid 79", fault_ids=["xid-79-n3"]))
    [requeue] = d.cycle(now=23).decisions
    assert isinstance(requeue, Requeue) and d.state_of("gang-a") == "pending"


def test_an_isolation_whose_fault_is_unknown_counts_as_failing() -> None:
    d = two_gangs()  # the isolation names a fault this scheduler never saw: the rule before, requeue
    d.given(GpuIsolated(cluster="c1", node="n3", gpu_index=0, at=22, reason="straggler", fault_ids=["perf/x/1/1"]))
    [requeue] = d.cycle(now=23).decisions
    assert isinstance(requeue, Requeue)


def test_a_staying_job_whose_hardware_then_fails_is_requeued() -> None:
    d = two_gangs()
    d.given(
        straggler("n3", 0, "perf/gang-a/1/1"),
        GpuIsolated(cluster="c1", node="n3", gpu_index=0, at=22, reason="straggler", fault_ids=["perf/gang-a/1/1"]),
    )
    assert d.cycle(now=23).decisions == []
    d.given(GpuIsolated(cluster="c1", node="n2", gpu_index=5, at=24, reason="ecc", fault_ids=["ecc-n2-5"]))
    cycle = d.cycle(now=25)
    assert cycle.full and [type(x) for x in cycle.decisions] == [Requeue]
