"""Workload kinds as Chamber reads them: GPUs of every container (init and sidecar included), gangs
of equal pods, refusals that name the field, and the Kueue / team vocabulary."""

from __future__ import annotations

import pytest

from events import PriorityClass
from services.kube.bindings import Bindings, Claim, NamespaceBinding, claim
from services.kube.kinds import BatchJob, Demand, Pod, RayJob, owned_by_workload
from services.kube.resources import WorkloadError, pod_gpus
from tests.kube_workloads import a_batch_job, a_pod, a_rayjob, container


def test_app_containers_and_sidecars_add_up_while_init_containers_take_the_peak() -> None:
    spec = {
        "initContainers": [
            container("fetch", gpus=1),  # runs alone: 1
            container("proxy", gpus=1, restartPolicy="Always"),  # a sidecar: keeps running
            container("warmup", gpus=6),  # runs beside the sidecar: 7
        ],
        "containers": [container("train", gpus=4), container("eval", gpus=2)],
    }
    assert pod_gpus(spec) == 7  # max(4 + 2 + 1 sidecar, 6 + 1 sidecar)
    spec["initContainers"][2] = container("warmup", gpus=2)
    assert pod_gpus(spec) == 7  # now the running set dominates: 4 + 2 + 1


def test_requests_count_when_limits_are_absent_and_must_agree_with_limits() -> None:
    c = {"name": "a", "resources": {"requests": {"nvidia.com/gpu": "2"}}}
    assert pod_gpus({"containers": [c]}) == 2
    c["resources"]["limits"] = {"nvidia.com/gpu": "4"}
    with pytest.raises(WorkloadError, match="request 2 differs from limit 4"):
        pod_gpus({"containers": [c]})


@pytest.mark.parametrize(
    "gpus,message",
    [("1.5", "whole number"), ("lots", "whole number"), ("800", "outside 0..64"), ("-1", "outside 0..64")],
)
def test_gpu_counts_that_are_not_whole_or_absurd_are_refused_naming_the_container(gpus: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=message) as err:
        BatchJob().demand(a_batch_job(gpus=gpus))  # type: ignore[arg-type]
    assert "containers[train]" in str(err.value)


def test_a_job_without_gpus_asks_for_nothing_and_a_ray_head_without_gpus_is_left_out() -> None:
    assert BatchJob().demand(a_batch_job(gpus=0)) is None
    assert RayJob().demand(a_rayjob(gpus=8, workers=3)) == Demand(8, 3, "nvidia")


def test_a_gang_of_unequal_pods_is_refused_with_the_sizes() -> None:
    ray = a_rayjob(gpus=8)
    ray["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "1"}
    }
    with pytest.raises(WorkloadError, match=r"1 pods x 1 GPUs, 2 pods x 8 GPUs"):
        RayJob().demand(ray)


def test_absurd_replica_counts_are_refused() -> None:
    with pytest.raises(WorkloadError, match=r"spec\.parallelism: 1000000 is outside"):
        BatchJob().demand(a_batch_job(parallelism=1_000_000))


def test_hold_suspends_a_job_and_gates_a_pod_keeping_other_gates() -> None:
    job = a_batch_job(suspend=None)
    assert BatchJob().hold_ops(job) == [{"op": "add", "path": "/spec/suspend", "value": True}]
    assert BatchJob().hold_ops(a_batch_job(suspend=True)) == []
    pod = a_pod(gated=False)
    assert Pod().hold_ops(pod) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "chamber.io/admission"}]}
    ]
    pod["spec"]["schedulingGates"] = [{"name": "other"}]
    assert Pod().hold_ops(pod) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "chamber.io/admission"}}
    ]


def test_children_of_managed_workloads_are_not_workloads_of_their_own() -> None:
    pod = a_pod()
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "train", "apiVersion": "batch/v1", "uid": "u"}]
    assert owned_by_workload(pod)
    pod["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "web", "apiVersion": "apps/v1", "uid": "u"}]
    assert not owned_by_workload(pod)  # a Deployment's pods are gated and admitted one by one


BOUND = Bindings(
    namespaces={"ml": NamespaceBinding(teams=["vision", "nlp"], queues={"main": "vision", "big": "nlp"})},
    priorities={"prod": PriorityClass.HIGH, "batch": PriorityClass.LOW},
)


@pytest.mark.parametrize(
    "labels,expected",
    [
        ({"chamber.io/team": "Vision"}, Claim("vision", PriorityClass.NORMAL, True)),  # folded to lower case
        ({"kueue.x-k8s.io/queue-name": "big"}, Claim("nlp", PriorityClass.NORMAL, True)),
        ({"kueue.x-k8s.io/queue-name": "vision"}, Claim("vision", PriorityClass.NORMAL, True)),  # queue named as team
        ({"chamber.io/team": "nlp", "kueue.x-k8s.io/priority-class": "batch"}, Claim("nlp", PriorityClass.LOW, True)),
        ({"chamber.io/team": "nlp", "chamber.io/priority": "critical", "chamber.io/preemptible": "false"},
         Claim("nlp", PriorityClass.CRITICAL, False)),
        ({}, None),
    ],
)  # fmt: skip
def test_team_and_class_come_from_chamber_or_kueue_labels(labels: dict[str, str], expected: Claim | None) -> None:
    assert claim(labels, "ml", BOUND) == expected


@pytest.mark.parametrize(
    "labels,namespace,message",
    [
        ({"chamber.io/team": "research"}, "ml", "may not charge team 'research'; it may charge vision, nlp"),
        ({"chamber.io/team": "vision"}, "web", "namespace 'web' may charge no team: an administrator binds it"),
        ({"chamber.io/team": "vision_team"}, "ml", "is not a team name"),
        ({"kueue.x-k8s.io/queue-name": "nope"}, "ml", "Kueue queue 'nope' maps to no team in namespace 'ml'"),
        ({"chamber.io/team": "nlp", "kueue.x-k8s.io/queue-name": "main"}, "ml", "contradicts queue 'main'"),
        ({"chamber.io/team": "nlp", "chamber.io/priority": "urgent"}, "ml",
         "unknown priority chamber.io/priority='urgent': use one of critical, high, normal, low, batch, prod"),
    ],
)  # fmt: skip
def test_refusals_name_the_fix(labels: dict[str, str], namespace: str, message: str) -> None:
    refused = claim(labels, namespace, BOUND)
    assert isinstance(refused, str) and message in refused


def test_without_a_bindings_file_any_namespace_charges_any_team() -> None:
    assert claim({"chamber.io/team": "research"}, "anywhere", Bindings.load(None)) == Claim(
        "research", PriorityClass.NORMAL, True
    )
