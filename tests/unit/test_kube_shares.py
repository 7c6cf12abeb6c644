"""Kubernetes requests for part of a GPU: `nvidia.com/mig-<profile>` resources and KAI's `gpu-fraction`
/ `gpu-memory` annotations, into the packer's request model; mistakes refused with the field named."""

from __future__ import annotations

from typing import Any

import pytest

from services.kube.resources import ShareRequest, WorkloadError, pod_share
from services.scheduler.core.mig import MIG_MODELS
from services.scheduler.kubernetes import share_request


def pod(**limits: Any) -> dict[str, Any]:
    return {"containers": [{"name": "app", "resources": {"limits": dict(limits)}}]}


def test_a_mig_resource_is_one_instance_of_its_profile() -> None:
    spec = pod(**{"nvidia.com/mig-1g.10gb": "1", "cpu": "2"})
    share = pod_share(spec)
    assert share == ShareRequest(mig_profile="1g.10gb", mig_count=1)
    request = share_request(share, models=frozenset({"H100-80GB", "L40S"}), cpu_milli=2000)
    assert request.mig_profile == "1g.10gb" and request.models == frozenset({"H100-80GB"})
    assert request.gpu_milli == MIG_MODELS["H100-80GB"].share_milli("1g.10gb")


def test_kai_fraction_annotations() -> None:
    assert pod_share(pod(cpu="1"), {"gpu-fraction": "0.5"}) == ShareRequest(gpu_milli=500)
    assert share_request(ShareRequest(gpu_milli=500)).gpu_milli == 500
    by_memory = pod_share(pod(cpu="1"), {"gpu-memory": "20000"})
    assert by_memory == ShareRequest(gpu_memory_mib=20000)
    assert share_request(by_memory, gpu_memory_mib=81_559).gpu_milli == 246  # 20000 / 81559, rounded up
    assert pod_share(pod(**{"nvidia.com/gpu": "1"})) is None


@pytest.mark.parametrize(
    ("spec", "annotations", "message"),
    [
        (pod(**{"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1"}), {}, "one profile"),
        (pod(**{"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"}), {}, "choose one"),
        (pod(**{"nvidia.com/mig-1g.10gb": "half"}), {}, "whole number"),
        (pod(**{"nvidia.com/gpu": "1"}), {"gpu-fraction": "0.5"}, "part of one GPU"),
        (pod(), {"gpu-fraction": "1.5"}, r"outside \(0, 1\]"),
        (pod(), {"gpu-fraction": "half"}, "must be a number"),
        (pod(), {"gpu-memory": "-4"}, "positive"),
        (pod(), {"gpu-fraction": "0.5", "gpu-memory": "1000"}, "use one"),
    ],
)
def test_bad_requests_are_refused_at_the_door(spec: dict[str, Any], annotations: dict[str, str], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        pod_share(spec, annotations)


def test_requests_the_packer_cannot_serve_are_refused() -> None:
    with pytest.raises(WorkloadError, match="a pod takes one"):
        share_request(ShareRequest(mig_profile="1g.10gb", mig_count=2))
    with pytest.raises(WorkloadError, match="no GPU model has MIG profile"):
        share_request(ShareRequest(mig_profile="9g.90gb", mig_count=1))
    with pytest.raises(WorkloadError, match="memory is unknown"):
        share_request(ShareRequest(gpu_memory_mib=1000))


def test_a_pod_is_told_the_gpu_and_the_mig_instance_or_fraction_chosen_for_it() -> None:
    from events import Placement
    from services.scheduler.kubernetes import GPUS_ANNOTATION, MIG_ANNOTATION, MILLI_ANNOTATION, device_ops

    mig = [Placement(cluster="c1", node="n1", gpu_indices=[3], share_milli=134, mig_profile="1g.10gb", mig_start=5)]
    obj: dict[str, Any] = {"metadata": {"name": "p", "annotations": {"team": "x"}}}
    assert device_ops(obj, mig, {3: "GPU-3"}) == [
        {"op": "add", "path": "/metadata/annotations/chamber.io~1gpus", "value": "3"},
        {"op": "add", "path": "/metadata/annotations/chamber.io~1gpu-uuids", "value": "GPU-3"},
        {"op": "add", "path": "/metadata/annotations/chamber.io~1mig-instance", "value": "1g.10gb@5"},
    ]
    fraction = [Placement(cluster="c1", node="n1", gpu_indices=[0], share_milli=250)]
    fresh: dict[str, Any] = {"metadata": {"name": "p"}}
    assert device_ops(fresh, fraction) == [
        {"op": "add", "path": "/metadata/annotations", "value": {GPUS_ANNOTATION: "0"}},
        {"op": "add", "path": f"/metadata/annotations/{MILLI_ANNOTATION.replace('/', '~1')}", "value": "250"},
    ]
    # admitted again elsewhere as whole GPUs: the stale instance goes, the same value is not written twice
    moved: dict[str, Any] = {"metadata": {"annotations": {GPUS_ANNOTATION: "1", MIG_ANNOTATION: "1g.10gb@5"}}}
    whole = [Placement(cluster="c1", node="n2", gpu_indices=[1])]
    assert device_ops(moved, whole) == [{"op": "remove", "path": "/metadata/annotations/chamber.io~1mig-instance"}]
