"""AMD GPUs in the scheduler: a pod's amd.com/gpu places only on AMD nodes, nvidia.com/gpu only on NVIDIA
ones; an MI300X node in CPX mode offers its partitions as the node's GPUs; pools select AMD models."""

from __future__ import annotations

from msgspec.structs import replace

from node_agent.amd_models import PARTITIONS, node_layouts, partition_layout
from services.kube.kinds import BatchJob
from services.kube.resources import WorkloadError, pod_vendor
from services.pools import PoolDef, model_vendor, node_pool
from services.scheduler.kubernetes import spec_of
from tests.scheduler_builders import Driver, a_job, a_node


def vendor_job(job_id: str, vendor: str | None, gpus: int = 8):  # type: ignore[no-untyped-def]
    job = a_job(job_id, gpus=gpus)
    return replace(job, spec=replace(job.spec, gpu_vendor=vendor))


def test_a_vendor_keeps_a_job_on_its_gpus() -> None:
    d = Driver().given(a_node("h1", model="H100-80GB"), a_node("m1", model="MI300X-192GB"))
    d.given(vendor_job("rocm", "amd"), vendor_job("cuda", "nvidia"))
    d.cycle()
    assert list(d.where("rocm")) == ["m1"] and list(d.where("cuda")) == ["h1"]
    d.given(vendor_job("more-rocm", "amd"))
    d.cycle()
    assert d.state_of("more-rocm") == "pending"  # the H100 node is free, but it is not AMD


def test_a_pod_asking_amd_gpus_becomes_an_amd_job() -> None:
    pod = {"containers": [{"name": "train", "resources": {"limits": {"amd.com/gpu": "8"}}}]}
    job = {
        "metadata": {"name": "llama", "namespace": "ml", "labels": {"chamber.io/team": "vision"}},
        "spec": {"parallelism": 2, "template": {"spec": pod}},
    }
    spec = spec_of(BatchJob(), job, "c1")
    assert not isinstance(spec, str) and spec is not None
    assert (spec.gpus_per_replica, spec.replicas, spec.gpu_vendor) == (8, 2, "amd")
    assert pod_vendor(pod) == "amd"


def test_a_pod_may_not_ask_both_vendors() -> None:
    both = {"containers": [{"name": "x", "resources": {"limits": {"amd.com/gpu": 1, "nvidia.com/gpu": 1}}}]}
    try:
        pod_vendor(both)
    except WorkloadError as exc:
        assert "one vendor" in str(exc)
    else:
        raise AssertionError("a pod asking both vendors was accepted")


def test_amd_models_are_told_by_name_and_pools_select_them() -> None:
    assert [model_vendor(m) for m in ("MI300X-192GB", "mi325x-256gb", "H100-80GB", "B200-180GB")] == [
        "amd", "amd", "nvidia", "nvidia"
    ]  # fmt: skip
    pools = {"mi300": PoolDef("mi300", gpu_model="MI300X-192GB")}
    assert node_pool(pools, "MI300X-192GB", {}) == "mi300" and node_pool(pools, "H100-80GB", {}) == "default"


def test_mi300_partition_layouts_are_a_fixed_table() -> None:
    assert partition_layout("CPX", "NPS4").gpus_per_device == 8 and partition_layout(None, None).label == "SPX/NPS1"
    assert ("SPX", "NPS4") not in PARTITIONS  # NPS4 needs at least four compute partitions
    layouts = {label: (gpus, round(gib)) for label, gpus, gib in node_layouts("MI300X-192GB", 8)}
    assert layouts == {
        "SPX/NPS1": (8, 192), "DPX/NPS1": (16, 96), "QPX/NPS1": (32, 48), "CPX/NPS1": (64, 24),
        "QPX/NPS4": (32, 48), "CPX/NPS4": (64, 24),
    }  # fmt: skip


def test_a_cpx_node_offers_its_partitions_as_gpus() -> None:
    d = Driver().given(a_node("m1", 64, model="MI300X-192GB"), vendor_job("small", "amd", gpus=1))
    d.cycle()
    assert d.where("small") == {"m1": [0]}
