"""Nodes' CPU and memory: every placement, whole GPUs and shares, respects what running work leaves."""

from __future__ import annotations

from events import GpuShare, NodeUpdated
from events.fleet import NodeStatus
from tests.scheduler_builders import Driver, a_job, a_node, a_quota, done

TS = GpuShare(gpu_milli=250)


def test_a_whole_gpu_job_goes_where_the_cpu_left_holds_it() -> None:
    # n1 has the fewer free GPUs (best fit would pick it) but not the CPU for the second job
    d = Driver().given(a_quota("vision", 16), a_node("n1", 4, host_cpu=16_000), a_node("n2", 8, host_cpu=64_000))
    d.given(a_job("a", gpus=2, cpu=12_000))
    d.cycle()
    assert list(d.where("a")) == ["n1"]
    d.given(a_job("b", gpus=2, cpu=8_000, at=2.0))
    d.cycle(20.0)
    assert list(d.where("b")) == ["n2"]  # n1 has 2 GPUs free but 4 CPUs left


def test_memory_limits_a_gang_per_node_and_a_full_fleet_waits() -> None:
    d = Driver().given(
        a_quota("vision", 16), a_node("n1", 8, host_memory=100_000), a_node("n2", 8, host_memory=100_000)
    )
    d.given(a_job("g", gpus=1, replicas=4, memory=40_000))  # 2 replicas per node by memory
    d.cycle()
    assert sorted(len(g) for g in d.where("g").values()) == [2, 2]
    d.given(a_job("w", gpus=1, memory=30_000, at=2.0))
    d.cycle(20.0)
    assert d.state_of("w") == "pending"  # GPUs are free, memory is not
    d.given(done("g", 30.0))
    d.cycle(40.0)
    assert d.state_of("w") == "running"


def test_unknown_capacity_or_no_request_means_no_limit() -> None:
    d = Driver().given(a_quota("vision", 16), a_node("n1", 8), a_node("n2", 8, host_cpu=1_000))
    d.given(a_job("a", gpus=8, cpu=500_000), a_job("b", gpus=8, at=2.0))
    d.cycle()
    assert d.where("a") == {"n1": list(range(8))} and d.state_of("b") == "running"


def test_shares_count_one_replica_per_gpu_against_the_cpu() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 1, host_cpu=10_000), a_node("n2", 1, host_cpu=10_000))
    d.given(a_job("s", gpus=1, replicas=4, share=TS, cpu=4_000))  # 2 per node by CPU, 4 per GPU by share
    d.cycle()
    assert sorted(len(ps) for ps in _per_node(d, "s").values()) == [2, 2]
    d.given(a_job("t", gpus=1, share=TS, cpu=4_000, at=2.0))
    d.cycle(20.0)
    assert d.state_of("t") == "pending"


def test_a_node_update_changes_its_capacity() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", 8, host_cpu=1_000))
    d.given(a_job("a", gpus=1, cpu=2_000))
    d.cycle()
    assert d.state_of("a") == "pending"
    gpus = a_node("n1", 8).gpus
    d.given(NodeUpdated(cluster="c1", node="n1", at=5.0, status=NodeStatus.HEALTHY, gpus=gpus, cpu_milli=8_000))
    d.cycle(20.0)
    assert d.state_of("a") == "running"


def _per_node(d: Driver, job_id: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for p in d.state.jobs[job_id].placements:
        out.setdefault(p.node, []).extend(p.gpu_indices)
    return out
