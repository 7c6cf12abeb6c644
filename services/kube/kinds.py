"""One adapter per workload kind behind one interface: how a workload is held (suspended or gated),
placed on Chamber's nodes, suspended again with the user's own affinity restored, how many GPUs it
asks for (every container, init and sidecar), and whether it finished.

Kinds (schemas as published by each project):
- `batch/v1` Job: `spec.suspend`, `spec.parallelism` pods of `spec.template`.
- `jobset.x-k8s.io/v1alpha2` JobSet: `spec.suspend`; `replicatedJobs[i].replicas` x the Job's
  parallelism pods of `replicatedJobs[i].template.spec.template`; conditions Completed / Failed.
- `trainer.kubeflow.org/v1alpha1` TrainJob (Kubeflow Trainer v2): `spec.suspend`; `trainer.numNodes`
  pods of `trainer.resourcesPerNode`; placed through a `podTemplateOverrides` entry for the `node`
  job; conditions Complete / Failed.
- `kubeflow.org/v1` PyTorchJob and `kubeflow.org/v2beta1` MPIJob: `spec.runPolicy.suspend`;
  `<kind>ReplicaSpecs.<role>.replicas` pods of its template; conditions Succeeded / Failed.
- `ray.io/v1` RayJob: `spec.suspend`; the head and `workerGroupSpecs[i].replicas x numOfHosts`
  pods; `status.jobDeploymentStatus` Complete / Failed (and `jobStatus`).
- `v1` Pod: held by the scheduling gate `chamber.io/admission` (a running Pod cannot be suspended,
  so Chamber runs plain Pods as non-preemptible).

A gang is pods of equal GPU count: pods without GPUs (a Ray head, an MPI launcher) are left to
Kubernetes, and a workload mixing GPU counts is refused, since Chamber could not place it as one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from services.kube.dra import DraRequest, pod_request
from services.kube.patches import (
    USER_AFFINITY_ANNOTATION,
    Op,
    annotation_ops,
    escape,
    pinned,
    resolve,
    saved_affinities,
    set_value,
)
from services.kube.resources import (
    MAX_PODS,
    ShareRequest,
    WorkloadError,
    count,
    pod_gpus,
    pod_host,
    pod_share,
    pod_vendor,
)

SCHEDULING_GATE = "chamber.io/admission"
PLACEMENT_ANNOTATION = "chamber.io/placement-override"  # TrainJob: index of the override Chamber added


@dataclass(frozen=True)
class PodGroup:
    """`pods` pods of one pod spec; `pointer` is where that spec sits in the object (None: not editable)."""

    pointer: str | None
    spec: dict[str, Any]
    pods: int


@dataclass(frozen=True)
class Demand:
    gpus_per_pod: int
    pods: int
    vendor: str | None = None  # "nvidia" (nvidia.com/gpu) | "amd" (amd.com/gpu)


class WorkloadKind:
    """The interface; subclasses say where the pod templates and the suspend flag live."""

    kind: ClassVar[str]
    group: ClassVar[str]  # "" for the core API
    version: ClassVar[str]
    plural: ClassVar[str]
    suspend_pointer: ClassVar[str | None] = "/spec/suspend"
    preemptible: ClassVar[bool] = True
    done_conditions: ClassVar[dict[str, str]] = {"Complete": "Complete", "Failed": "Failed"}

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def short(self) -> str:
        return self.kind.lower()

    # -- reading -------------------------------------------------------------------------------

    def groups(self, obj: dict[str, Any]) -> list[PodGroup]:
        raise NotImplementedError

    def demand(self, obj: dict[str, Any]) -> Demand | None:
        """GPUs per pod and pods that hold them; None when the workload asks for no GPU."""
        per_pod: dict[int, int] = {}
        vendors: set[str] = set()
        for group in self.groups(obj):
            gpus = pod_gpus(group.spec, group.pointer or "spec")
            if gpus and group.pods:
                per_pod[gpus] = per_pod.get(gpus, 0) + group.pods
                vendor = pod_vendor(group.spec, group.pointer or "spec")
                if vendor is not None:
                    vendors.add(vendor)
        if not per_pod:
            return None
        if len(per_pod) > 1:
            sizes = ", ".join(f"{n} pods x {g} GPUs" for g, n in sorted(per_pod.items()))
            raise WorkloadError(
                f"{self.kind} mixes pods of different GPU counts ({sizes}); Chamber places a gang of equal "
                "pods: give every GPU pod the same nvidia.com/gpu"
            )
        [(gpus, pods)] = per_pod.items()
        if pods > MAX_PODS:
            raise WorkloadError(f"{self.kind} has {pods} GPU pods, more than {MAX_PODS}; check the replica counts")
        if len(vendors) > 1:
            raise WorkloadError(f"{self.kind} mixes nvidia.com/gpu and amd.com/gpu pods; a gang runs on one vendor")
        return Demand(gpus, pods, next(iter(vendors), None))

    def share(self, obj: dict[str, Any]) -> tuple[ShareRequest, int] | None:
        """The part of one GPU each GPU pod asks for (`nvidia.com/mig-<profile>`, KAI's `gpu-fraction` /
        `gpu-memory` annotations on the pod template), and how many such pods; None when none asks.
        Pods asking for different shares are refused, as pods of different GPU counts are."""
        found: dict[ShareRequest, int] = {}
        for group in self.groups(obj):
            if not group.pods:
                continue
            share = pod_share(group.spec, _annotations(obj, group.pointer), group.pointer or "spec")
            if share is not None:
                found[share] = found.get(share, 0) + group.pods
        if not found:
            return None
        if len(found) > 1:
            raise WorkloadError(
                f"{self.kind} mixes pods asking for different GPU shares; Chamber places a gang of equal pods"
            )
        [(share, pods)] = found.items()
        if pods > MAX_PODS:
            raise WorkloadError(f"{self.kind} has {pods} GPU pods, more than {MAX_PODS}; check the replica counts")
        return share, pods

    def host(self, obj: dict[str, Any]) -> tuple[int | None, int | None]:
        """(milli-CPUs, MiB) each GPU pod requests of its node: the largest over the pod templates that ask
        for a whole GPU or a share of one; None where none of them requests that resource."""
        cpu: int | None = None
        memory: int | None = None
        for group in self.groups(obj):
            where = group.pointer or "spec"
            if not group.pods or not (
                pod_gpus(group.spec, where) or pod_share(group.spec, _annotations(obj, group.pointer), where)
            ):
                continue
            c, m = pod_host(group.spec, where)
            cpu = c if cpu is None else max(cpu, c or 0)
            memory = m if memory is None else max(memory, m or 0)
        return cpu, memory

    def dra(
        self, obj: dict[str, Any], templates: Mapping[str, dict[str, Any]]
    ) -> tuple[Demand | None, tuple[ShareRequest, int] | None]:
        """Whole GPUs or a share per pod asked through DRA claims of the NVIDIA driver (`templates`: the
        namespace's ResourceClaimTemplates by name); pods asking differently are refused."""
        found: dict[DraRequest, int] = {}
        for group in self.groups(obj):
            if group.pods and (asked := pod_request(group.spec, templates, None, group.pointer or "spec")):
                found[asked] = found.get(asked, 0) + group.pods
        if not found:
            return None, None
        if len(found) > 1:
            raise WorkloadError(f"{self.kind} mixes pods asking for different DRA devices; a gang is of equal pods")
        [(asked, pods)] = found.items()
        if asked.share is not None:
            return None, (asked.share, pods)
        return Demand(asked.gpus, pods, "nvidia"), None

    def held(self, obj: dict[str, Any]) -> bool:
        return bool(resolve(obj, self.suspend_pointer or ""))

    def check(self, obj: dict[str, Any]) -> str | None:
        """Why the kind's own controller would refuse it suspended, if it would (and the fix)."""
        return None

    def finished(self, obj: dict[str, Any]) -> str | None:
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("status") == "True" and cond.get("type") in self.done_conditions:
                return self.done_conditions[str(cond["type"])]
        return None

    # -- changing (JSON Patch ops) -------------------------------------------------------------

    def hold_ops(self, obj: dict[str, Any]) -> list[Op]:
        """On create (the webhook): held until Chamber admits it."""
        assert self.suspend_pointer is not None
        return [] if self.held(obj) else set_value(obj, self.suspend_pointer, True)

    def _gpu_groups(self, obj: dict[str, Any]) -> list[PodGroup]:
        return [
            g
            for g in self.groups(obj)
            if g.pointer is not None
            and g.pods
            and (
                pod_gpus(g.spec, g.pointer)
                or pod_share(g.spec, _annotations(obj, g.pointer), g.pointer)
                or g.spec.get("resourceClaims")  # DRA devices (services/kube/dra.py)
            )
        ]

    def admit_ops(self, obj: dict[str, Any], nodes: tuple[str, ...]) -> list[Op]:
        """Pin the GPU pods to `nodes` (keeping the user's own affinity), then let it run."""
        groups = self._gpu_groups(obj)
        saved = saved_affinities(obj)
        originals = saved if saved is not None else {g.pointer: g.spec.get("affinity") for g in groups}
        ops: list[Op] = []
        for g in groups:
            assert g.pointer is not None
            ops.append({"op": "add", "path": f"{g.pointer}/affinity", "value": pinned(originals.get(g.pointer), nodes)})
        if saved is None:
            ops += annotation_ops(obj, USER_AFFINITY_ANNOTATION, json.dumps(originals, sort_keys=True))
        assert self.suspend_pointer is not None
        return ops + set_value(obj, self.suspend_pointer, False)

    def suspend_ops(self, obj: dict[str, Any]) -> list[Op] | None:
        """Suspend, and give the pod templates back the affinity the user wrote; None: cannot suspend."""
        assert self.suspend_pointer is not None
        ops = set_value(obj, self.suspend_pointer, True)
        saved = saved_affinities(obj)
        if saved is None:
            return ops
        try:
            templates = {g.pointer for g in self.groups(obj)}
        except WorkloadError:
            templates = set()
        for pointer, affinity in sorted(saved.items()):
            if pointer not in templates or resolve(obj, pointer) is None:
                continue  # not a pod template of this object (any more): nothing to restore there
            if affinity is None:
                if resolve(obj, f"{pointer}/affinity") is not None:
                    ops.append({"op": "remove", "path": f"{pointer}/affinity"})
            else:
                ops.append({"op": "add", "path": f"{pointer}/affinity", "value": affinity})
        return ops + annotation_ops(obj, USER_AFFINITY_ANNOTATION, None)


def _annotations(obj: dict[str, Any], pointer: str | None) -> dict[str, str]:
    """The annotations of the pod template whose spec sits at `pointer` (a Pod's own for `/spec`)."""
    if pointer is None or not pointer.endswith("/spec"):
        return {}
    found = resolve(obj, pointer[: -len("/spec")] + "/metadata/annotations")
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def _template(obj: dict[str, Any], pointer: str, pods: int) -> PodGroup:
    spec = resolve(obj, pointer)
    return PodGroup(pointer, spec if isinstance(spec, dict) else {}, pods)


class BatchJob(WorkloadKind):
    kind, group, version, plural = "Job", "batch", "v1", "jobs"

    def groups(self, obj: dict[str, Any]) -> list[PodGroup]:
        parallelism = count(resolve(obj, "/spec/parallelism"), "spec.parallelism")
        return [_template(obj, "/spec/template/spec", parallelism)]


class JobSet(WorkloadKind):
    kind, group, version, plural = "JobSet", "jobset.x-k8s.io", "v1alpha2", "jobsets"
    done_conditions = {"Completed": "Complete", "Failed": "Failed"}

    def groups(self, obj: dict[str, Any]) -> list[PodGroup]:
        found = []
        for i, rj in enumerate(resolve(obj, "/spec/replicatedJobs") or []):
            where = f"spec.replicatedJobs[{rj.get('name', i)}]"
            replicas = count(rj.get("replicas"), f"{where}.replicas")
            parallelism = count(resolve(rj, "/template/spec/parallelism"), f"{where}.template.spec.parallelism")
            found.append(
                _template(obj, f"/spec/replicatedJobs/{i}/template/spec/template/spec", replicas * parallelism)
            )
        return found


class ReplicaSpecsJob(WorkloadKind):
    """Kubeflow's training-operator kinds: `<specs_key>.<role>` with replicas and a template."""

    specs_key: ClassVar[str]
    group = "kubeflow.org"
    suspend_pointer = "/spec/runPolicy/suspend"
    done_conditions = {"Succeeded": "Complete", "Failed": "Failed"}

    def groups(self, obj: dict[str, Any]) -> list[PodGroup]:
        specs = resolve(obj, f"/spec/{self.specs_key}") or {}
        return [
            _template(
                obj,
                f"/spec/{self.specs_key}/{escape(role)}/template/spec",
                count(spec.get("replicas"), f"spec.{self.specs_key}.{role}.replicas"),
            )
            for role, spec in sorted(specs.items())
            if isinstance(spec, dict)
        ]


class PyTorchJob(ReplicaSpecsJob):
    kind, version, plural, specs_key = "PyTorchJob", "v1", "pytorchjobs", "pytorchReplicaSpecs"


class MPIJob(ReplicaSpecsJob):
    kind, version, plural, specs_key = "MPIJob", "v2beta1", "mpijobs", "mpiReplicaSpecs"


class RayJob(WorkloadKind):
    kind, group, version, plural = "RayJob", "ray.io", "v1", "rayjobs"

    def check(self, obj: dict[str, Any]) -> str | None:
        if resolve(obj, "/spec/shutdownAfterJobFinishes") is not True:
            return (
                "KubeRay suspends a RayJob only with spec.shutdownAfterJobFinishes: true (its cluster must go "
                "when the job ends); set it"
            )
        return None

    def groups(self, obj: dict[str, Any]) -> list[PodGroup]:
        found = [_template(obj, "/spec/rayClusterSpec/headGroupSpec/template/spec", 1)]
        for i, wg in enumerate(resolve(obj, "/spec/rayClusterSpec/workerGroupSpecs") or []):
            where = f"spec.rayClusterSpec.workerGroupSpecs[{wg.get('groupName', i)}]"
            pods = count(wg.get("replicas"), f"{where}.replicas") * count(wg.get("numOfHosts"), f"{where}.numOfHosts")
            found.append(_template(obj, f"/spec/rayClusterSpec/workerGroupSpecs/{i}/template/spec", pods))
        return found

    def finished(self, obj: dict[str, Any]) -> str | None:
        status = obj.get("status") or {}
        deployment, job = status.get("jobDeploymentStatus"), status.get("jobStatus")
        if deployment == "Failed" or job in ("FAILED", "STOPPED"):
            return "Failed"
        if deployment == "Complete" or job == "SUCCEEDED":
            return "Complete"
        return None


class TrainJob(WorkloadKind):
    """GPUs come from `trainer.resourcesPerNode`; the pod templates live in the TrainingRuntime, so
    placement is an entry Chamber appends to `podTemplateOverrides` (later entries win) and removes
    on suspend, which leaves the user's own overrides, affinity included, as they wrote them."""

    kind, group, version, plural = "TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs"
    target_job = "node"

    def groups(self, obj: dict[str, Any]) -> list[PodGroup]:
        trainer = resolve(obj, "/spec/trainer") or {}
        resources = trainer.get("resourcesPerNode") or {}
        spec = {"containers": [{"name": "node", "resources": resources}]}
        return [PodGroup(None, spec, count(trainer.get("numNodes"), "spec.trainer.numNodes"))]

    def _user_affinity(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        affinity = None
        for override in resolve(obj, "/spec/podTemplateOverrides") or []:
            if any(t.get("name") == self.target_job for t in override.get("targetJobs") or []):
                affinity = resolve(override, "/spec/affinity") or affinity
        return affinity

    def _ours(self, obj: dict[str, Any]) -> int | None:
        raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(PLACEMENT_ANNOTATION)
        return int(raw) if raw is not None and raw.isdigit() else None

    def admit_ops(self, obj: dict[str, Any], nodes: tuple[str, ...]) -> list[Op]:
        overrides = list(resolve(obj, "/spec/podTemplateOverrides") or [])
        ours = self._ours(obj)
        if ours is not None and ours < len(overrides):
            overrides = overrides[:ours] + overrides[ours + 1 :]
        user = self._user_affinity({"spec": {"podTemplateOverrides": overrides}})
        entry = {"targetJobs": [{"name": self.target_job}], "spec": {"affinity": pinned(user, nodes)}}
        index = len(overrides)
        return [
            {"op": "add", "path": "/spec/podTemplateOverrides", "value": [*overrides, entry]},
            *annotation_ops(obj, PLACEMENT_ANNOTATION, str(index)),
            *set_value(obj, "/spec/suspend", False),
        ]

    def suspend_ops(self, obj: dict[str, Any]) -> list[Op] | None:
        ops = set_value(obj, "/spec/suspend", True)
        ours = self._ours(obj)
        overrides = resolve(obj, "/spec/podTemplateOverrides") or []
        if ours is not None and ours < len(overrides):
            ops.append({"op": "remove", "path": f"/spec/podTemplateOverrides/{ours}"})
        return ops + annotation_ops(obj, PLACEMENT_ANNOTATION, None)


class Pod(WorkloadKind):
    kind, group, version, plural = "Pod", "", "v1", "pods"
    suspend_pointer = None
    preemptible = False  # a started Pod can only be deleted, not suspended and resumed

    def groups(self, obj: dict[str, Any]) -> list[PodGroup]:
        return [_template(obj, "/spec", 1)]

    def _gate_index(self, obj: dict[str, Any]) -> int | None:
        for i, gate in enumerate(resolve(obj, "/spec/schedulingGates") or []):
            if gate.get("name") == SCHEDULING_GATE:
                return i
        return None

    def held(self, obj: dict[str, Any]) -> bool:
        return self._gate_index(obj) is not None

    def finished(self, obj: dict[str, Any]) -> str | None:
        phase = (obj.get("status") or {}).get("phase")
        return {"Succeeded": "Complete", "Failed": "Failed"}.get(str(phase))

    def hold_ops(self, obj: dict[str, Any]) -> list[Op]:
        if self.held(obj):
            return []
        gate = {"name": SCHEDULING_GATE}
        if resolve(obj, "/spec/schedulingGates") is None:
            return [{"op": "add", "path": "/spec/schedulingGates", "value": [gate]}]
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": gate}]

    def admit_ops(self, obj: dict[str, Any], nodes: tuple[str, ...]) -> list[Op]:
        """Add the node constraint (the one edit allowed on a gated Pod), then lift Chamber's gate."""
        ops: list[Op] = []
        if pod_gpus(obj.get("spec") or {}):
            ops.append({"op": "add", "path": "/spec/affinity", "value": pinned(resolve(obj, "/spec/affinity"), nodes)})
        index = self._gate_index(obj)
        if index is not None:
            path = f"/spec/schedulingGates/{index}"
            ops += [{"op": "test", "path": path, "value": {"name": SCHEDULING_GATE}}, {"op": "remove", "path": path}]
        return ops

    def suspend_ops(self, obj: dict[str, Any]) -> list[Op] | None:
        return None


class Observed(NamedTuple):
    """One workload as listed from the cluster."""

    kind: WorkloadKind
    obj: dict[str, Any]


KINDS: tuple[WorkloadKind, ...] = (BatchJob(), JobSet(), TrainJob(), PyTorchJob(), MPIJob(), RayJob(), Pod())
_BY_TYPE = {(k.api_version, k.kind): k for k in KINDS}


# Owners whose children are admitted through them: a JobSet's Jobs, a Job's Pods, a RayJob's cluster.
_OWNER_KINDS = frozenset({k.kind for k in KINDS} | {"RayCluster"})


def owned_by_workload(obj: dict[str, Any]) -> bool:
    """True for the children of a managed workload (they are not workloads of their own). Pods of a
    Deployment or StatefulSet are not: each is admitted as a plain Pod."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(o, dict) and o.get("kind") in _OWNER_KINDS for o in owners)


def kind_of(api_version: str, kind: str) -> WorkloadKind | None:
    return _BY_TYPE.get((api_version, kind))


def kind_for(group: str, kind: str) -> WorkloadKind | None:
    """By API group and kind, whatever version (an AdmissionReview names them apart)."""
    return next((k for k in KINDS if k.group == group and k.kind == kind), None)
