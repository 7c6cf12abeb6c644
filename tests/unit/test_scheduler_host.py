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


def test_the_live_share_scorer_keeps_cpu_rich_gpus_for_cpu_heavy_shares() -> None:
    """n1 and n2 each have a GPU half shared; n2's CPU is nearly spent. A CPU-light share goes to n2, so
    the CPU-heavy one queued with it finds n1 (ignoring CPU, the tie would go to n1, the lower id)."""
    d = Driver().given(
        a_quota("vision", 8),
        a_node("n1", 1, model="H100", host_cpu=64_000),
        a_node("n2", 1, model="A100", host_cpu=1_000),
        a_job("x1", gpus=1, share=GpuShare(gpu_milli=500), model="H100"),
        a_job("x2", gpus=1, share=GpuShare(gpu_milli=500), model="A100"),
    )
    d.cycle()
    assert list(d.where("x1")) == ["n1"] and list(d.where("x2")) == ["n2"]
    d.given(a_job("light", gpus=1, share=TS, at=2.0), a_job("heavy", gpus=1, share=TS, cpu=4_000, at=3.0))
    d.cycle(20.0)
    assert list(d.where("light")) == ["n2"] and list(d.where("heavy")) == ["n1"]


def test_the_live_scorer_counts_cpu_stranding_where_fragmentation_ties() -> None:
    from services.scheduler.core.shares import _score
    from services.scheduler.core.sharing import STRANDING_WEIGHT, Mix, PodRequest

    mix = Mix.of([PodRequest(cpu_milli=1_000, num_gpu=1, gpu_milli=250)])  # 4 milli-CPU per milli-GPU
    scarce = _score(mix, ("H100", 2_000, 0, False, (1000,), ()), ("H100", 2_000, 0, False, (750,), ()))
    rich = _score(mix, ("H100", 64_000, 0, False, (1000,), ()), ("H100", 64_000, 0, False, (750,), ()))
    # the scarce node strands 500 milli-GPU before and 250 after; the rich one none
    assert rich - scarce == STRANDING_WEIGHT * 250


def test_the_door_says_when_no_node_could_ever_hold_a_replica() -> None:
    from services.scheduler.core.door import cannot_run

    d = Driver().given(a_quota("vision", 16), a_node("n1", 8, host_cpu=64_000, host_memory=500_000))
    assert cannot_run(d.state, a_job("a", gpus=1, cpu=64_000).spec) == []
    [why] = cannot_run(d.state, a_job("b", gpus=1, cpu=96_000, memory=100).spec)
    assert "asks for 96 CPUs" in why and "has 64" in why
    d.given(a_node("n2", 8))  # capacity unknown: it may hold it
    assert cannot_run(d.state, a_job("b", gpus=1, cpu=96_000).spec) == []


def test_preempting_a_victim_frees_its_cpu_for_the_job_that_waits_for_cpu() -> None:
    from services.scheduler.core import Preempt

    d = Driver().given(a_quota("vision", 8), a_node("n1", 8, host_cpu=16_000))
    d.given(a_job("low", gpus=4, cpu=12_000, priority="low", at=1))
    d.cycle()
    d.given(a_job("high", gpus=4, cpu=8_000, priority="high", at=2))  # 4 GPUs free, 4 CPUs left
    cycle = d.cycle(now=20)
    assert [x.job_id for x in cycle.decisions if isinstance(x, Preempt)] == ["low"]
    assert d.state_of("high") == "running"


def test_a_job_asking_less_cpu_is_tried_after_one_of_the_same_gpu_shape_did_not_fit() -> None:
    # the cycle answers jobs of an already failed shape in bulk: the CPU asked is part of that shape
    d = Driver().given(a_quota("vision", 16), a_node("n1", 8, host_cpu=16_000))
    d.given(a_job("big", gpus=2, cpu=32_000), a_job("small", gpus=2, cpu=4_000, at=2.0))
    d.cycle(20.0)
    assert d.state_of("big") == "pending" and d.state_of("small") == "running"


def test_a_job_waiting_for_cpu_says_so() -> None:
    d = Driver().given(a_quota("vision", 16), a_node("n1", 8, host_cpu=16_000, host_memory=64 * 1024))
    d.given(a_job("a", gpus=2, cpu=12_000))
    d.cycle()
    d.given(a_job("b", gpus=2, cpu=8_000, memory=2048, at=2.0))
    cycle = d.cycle(20.0)
    why = cycle.waiting["b"]
    assert "1 node with the GPUs free lacks" in why and "(CPU 8 cores, memory 2 GiB)" in why, why
    assert "at most 4 cores" in why, why
