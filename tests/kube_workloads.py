"""Builders for Kubernetes workloads of every kind Chamber manages, as users write them (the kinds'
published schemas), for the scheduler's actuator and the admission webhook tests."""

from __future__ import annotations

from typing import Any

GPU = "nvidia.com/gpu"


def container(name: str = "train", gpus: int | str | None = 4, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "trainer:1", **extra}
    if gpus is not None:
        c["resources"] = {"limits": {GPU: str(gpus)}}
    return c


def pod_spec(gpus: int | str | None = 4, *, affinity: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container(gpus=gpus)], **extra}
    if affinity is not None:
        spec["affinity"] = affinity
    return spec


def meta(name: str, labels: dict[str, str] | None, namespace: str = "ml") -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": {"chamber.io/team": "vision"} if labels is None else labels}


def a_batch_job(
    name: str = "train",
    *,
    gpus: int = 4,
    parallelism: int = 2,
    labels: dict[str, str] | None = None,
    suspend: bool | None = True,
    affinity: dict[str, Any] | None = None,
    namespace: str = "ml",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"parallelism": parallelism, "template": {"spec": pod_spec(gpus, affinity=affinity)}}
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta(name, labels, namespace), "spec": spec}


def a_jobset(name: str = "js", *, gpus: int = 8, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": meta(name, labels),
        "spec": {
            "suspend": True,
            "replicatedJobs": [
                {  # a driver without GPUs: left to Kubernetes
                    "name": "driver",
                    "replicas": 1,
                    "template": {"spec": {"template": {"spec": pod_spec(None)}}},
                },
                {
                    "name": "workers",
                    "replicas": 2,
                    "template": {"spec": {"parallelism": 1, "template": {"spec": pod_spec(gpus)}}},
                },
            ],
        },
    }


def a_trainjob(
    name: str = "tj", *, gpus: int = 8, nodes: int = 2, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": meta(name, labels),
        "spec": {
            "suspend": True,
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": nodes, "resourcesPerNode": {"limits": {GPU: str(gpus)}}},
            "podTemplateOverrides": [
                {
                    "targetJobs": [{"name": "node"}],
                    "spec": {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
                }
            ],
        },
    }


def a_pytorchjob(
    name: str = "pt", *, gpus: int = 4, workers: int = 3, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": meta(name, labels),
        "spec": {
            "runPolicy": {"suspend": True, "cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": pod_spec(gpus)}},
                "Worker": {"replicas": workers, "restartPolicy": "OnFailure", "template": {"spec": pod_spec(gpus)}},
            },
        },
    }


def an_mpijob(
    name: str = "mpi", *, gpus: int = 8, workers: int = 2, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": meta(name, labels),
        "spec": {
            "slotsPerWorker": gpus,
            "runPolicy": {"suspend": True, "cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": pod_spec(None)}},  # no GPU: left to Kubernetes
                "Worker": {"replicas": workers, "template": {"spec": pod_spec(gpus)}},
            },
        },
    }


def a_rayjob(
    name: str = "ray", *, gpus: int = 8, workers: int = 2, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": meta(name, labels),
        "spec": {
            "suspend": True,
            "entrypoint": "python train.py",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": pod_spec(None)}},
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": workers,
                        "minReplicas": workers,
                        "maxReplicas": workers,
                        "rayStartParams": {},
                        "template": {"spec": pod_spec(gpus)},
                    }
                ],
            },
        },
    }


def a_pod(
    name: str = "pod", *, gpus: int = 2, labels: dict[str, str] | None = None, gated: bool = True
) -> dict[str, Any]:
    spec = pod_spec(gpus)
    if gated:
        spec["schedulingGates"] = [{"name": "chamber.io/admission"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta(name, labels), "spec": spec}


USER_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]}
            ]
        }
    }
}


# -- serving workloads: scaled, not suspended; their pods are gated --------------------------------------


def serving_pod_spec(gpus: int = 2) -> dict[str, Any]:
    return {"containers": [container("server", gpus=gpus)]}


def a_deployment(
    name: str = "llm", *, replicas: int | None = 1, gpus: int = 2, min_replicas: int | None = None
) -> dict[str, Any]:
    labels = {"chamber.io/team": "vision", "app": name}
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": labels}, "spec": serving_pod_spec(gpus)},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    m = meta(name, None)
    if min_replicas is not None:
        m["annotations"] = {"chamber.io/min-replicas": str(min_replicas)}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": m, "spec": spec}


def a_statefulset(name: str = "kv", *, replicas: int = 1, gpus: int = 2) -> dict[str, Any]:
    obj = a_deployment(name, replicas=replicas, gpus=gpus)
    return {**obj, "kind": "StatefulSet"}


def a_leaderworkerset(name: str = "big", *, replicas: int = 1, size: int = 2, gpus: int = 8) -> dict[str, Any]:
    template = {"spec": serving_pod_spec(gpus)}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": meta(name, None),
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {"size": size, "leaderTemplate": template, "workerTemplate": template},
        },
    }


def a_replica_pod(
    owner: dict[str, Any], name: str, *, gpus: int = 2, gated: bool = True, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod the workload's controller made (gated by the webhook): a Deployment's through its
    ReplicaSet `<name>-abc12`, a StatefulSet's directly, a LeaderWorkerSet's through its StatefulSets
    with its name and group labels."""
    kind, workload = owner["kind"], owner["metadata"]["name"]
    spec = serving_pod_spec(gpus)
    if gated:
        spec["schedulingGates"] = [{"name": "chamber.io/admission"}]
    m = meta(name, {"chamber.io/team": "vision", **(labels or {})})
    if kind == "Deployment":
        m["labels"]["pod-template-hash"] = "abc12"
        ref = {"kind": "ReplicaSet", "name": f"{workload}-abc12"}
    else:
        ref = {"kind": "StatefulSet", "name": workload}
    if kind == "LeaderWorkerSet":
        m["labels"]["leaderworkerset.sigs.k8s.io/name"] = workload
    m["ownerReferences"] = [{"apiVersion": "apps/v1", "controller": True, "uid": "owner", **ref}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": m, "spec": spec}
