"""DRA ResourceClaims for the NVIDIA DRA driver (the shapes of NVIDIA/k8s-dra-driver-gpu's specs): GPU
counts, MPS shares and MIG profiles become the request Chamber places; what it cannot place is refused
with the field named."""

from __future__ import annotations

from typing import Any

import pytest

from services.kube.dra import DraRequest, claim_request, pod_request
from services.kube.resources import ShareRequest, WorkloadError


def gpu(name: str = "gpu", count: int | None = None, cls: str = "gpu.nvidia.com", **more: Any) -> dict[str, Any]:
    return {"name": name, "deviceClassName": cls, **({"count": count} if count is not None else {}), **more}


def profile(p: str) -> dict[str, Any]:
    return {"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{p}'"}}


def sharing(strategy: str, requests: list[str] | None = None, **mps: Any) -> dict[str, Any]:
    shared: dict[str, Any] = {"strategy": strategy}
    if mps:
        shared["mpsConfig"] = mps
    parameters = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": shared}
    return {"requests": requests or [], "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}


def claim(*requests: dict[str, Any], config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"devices": {"requests": list(requests), "config": config or []}}


def test_gpu_counts_are_whole_gpus_and_time_slicing_changes_nothing() -> None:
    assert claim_request(claim(gpu(count=2))) == DraRequest(gpus=2)
    assert claim_request(claim(gpu())) == DraRequest(gpus=1)
    assert claim_request(claim(gpu(), config=[sharing("TimeSlicing", ["gpu"])])) == DraRequest(gpus=1)
    # resource.k8s.io/v1 puts the request's fields under `exactly`
    v1 = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 4}}
    assert claim_request(claim(v1)) == DraRequest(gpus=4)
    assert claim_request(claim(gpu(cls="example.com/nic"))) == DraRequest()  # not an NVIDIA GPU


def test_an_mps_thread_percentage_is_a_fraction_with_its_memory_limit() -> None:
    mps = sharing("MPS", ["gpu"], defaultActiveThreadPercentage=25, defaultPinnedDeviceMemoryLimit="10Gi")
    assert claim_request(claim(gpu(), config=[mps])) == DraRequest(
        share=ShareRequest(gpu_milli=250, gpu_memory_mib=10240, mode="mps")
    )
    assert claim_request(claim(gpu(), config=[sharing("MPS", ["gpu"])])) == DraRequest(gpus=1)  # no share given


def test_a_mig_device_is_one_instance_of_the_profile_its_selector_names() -> None:
    found = claim_request(claim(gpu(cls="mig.nvidia.com", selectors=[profile("1g.10gb")])))
    assert found == DraRequest(share=ShareRequest(mig_profile="1g.10gb", mig_count=1))


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (claim(gpu(cls="mig.nvidia.com")), "name the MIG profile"),
        (claim(gpu(allocationMode="All")), "allocationMode All"),
        (claim(gpu(count=0)), "count"),
        (claim(gpu("a"), gpu("b", cls="mig.nvidia.com", selectors=[profile("1g.10gb")])), "one share"),
        (
            claim(gpu(count=2), config=[sharing("MPS", ["gpu"], defaultActiveThreadPercentage=50)]),
            "count 1 per pod",
        ),
    ],
)
def test_what_chamber_cannot_place_is_refused(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(WorkloadError, match=words):
        claim_request(spec)


def test_a_pod_reads_its_templates_and_refuses_a_claim_shared_by_name() -> None:
    templates = {"two": {"spec": {"spec": claim(gpu(count=2))}}}
    pod = {"containers": [{"name": "c"}], "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "two"}]}
    assert pod_request(pod, templates) == DraRequest(gpus=2)
    assert pod_request({"containers": []}, templates) is None
    shared = {"containers": [], "resourceClaims": [{"name": "g", "resourceClaimName": "one"}]}
    with pytest.raises(WorkloadError, match="resourceClaimTemplateName"):
        pod_request(shared, {}, {"one": {"spec": claim(gpu())}})
    with pytest.raises(WorkloadError, match="no ResourceClaimTemplate 'gone'"):
        pod_request({"resourceClaims": [{"name": "g", "resourceClaimTemplateName": "gone"}]}, templates)


def test_a_batch_job_asking_through_claim_templates_becomes_a_job() -> None:
    from events import GpuShare, JobSpec, ShareMode
    from services.kube.kinds import BatchJob
    from services.scheduler.kubernetes import spec_of

    mps = sharing("MPS", ["gpu"], defaultActiveThreadPercentage=50)
    templates = {
        "ml": {"two": {"spec": {"spec": claim(gpu(count=2))}}, "half": {"spec": {"spec": claim(gpu(), config=[mps])}}}
    }

    def job(template: str) -> dict[str, Any]:
        pod = {"containers": [{"name": "c"}], "resourceClaims": [{"name": "g", "resourceClaimTemplateName": template}]}
        meta = {"name": "j", "namespace": "ml", "labels": {"chamber.io/team": "vision"}}
        return {"metadata": meta, "spec": {"parallelism": 3, "template": {"spec": pod}}}

    whole = spec_of(BatchJob(), job("two"), "c1", templates=templates)
    assert isinstance(whole, JobSpec) and (whole.gpus_per_replica, whole.replicas, whole.share) == (2, 3, None)
    half = spec_of(BatchJob(), job("half"), "c1", templates=templates)
    assert isinstance(half, JobSpec) and half.share == GpuShare(gpu_milli=500, mode=ShareMode.MPS)
    assert spec_of(BatchJob(), job("two"), "c1") is None  # without the templates nothing is known to ask
