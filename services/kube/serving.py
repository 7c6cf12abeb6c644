"""Serving workloads: Deployments, StatefulSets and LeaderWorkerSets that name a team are scaled, not
suspended. Each replica is admitted on its own (a Chamber job of class `serving`); its pods are held by
the scheduling gate `chamber.io/admission` (the webhook gates every team's Pod on create) and
released, pinned to the replica's nodes, once the replica is admitted.

Kinds (schemas as published by each project):
- `apps/v1` Deployment and StatefulSet: `spec.replicas` (default 1) replicas of one pod of
  `spec.template.spec`.
- `leaderworkerset.x-k8s.io/v1` LeaderWorkerSet: `spec.replicas` groups of
  `spec.leaderWorkerTemplate.size` pods (default 1): the leader (`leaderTemplate`, else the worker
  template) and `size - 1` workers (`workerTemplate`); a group is one gang, placed together.

`chamber.io/min-replicas` (an annotation, default 1) is how many replicas are guaranteed: those are
never preempted; the replicas above it borrow like any other work.

Which replica a pod belongs to: a StatefulSet pod's ordinal (`<name>-<ordinal>`); a LeaderWorkerSet
pod's `leaderworkerset.sigs.k8s.io/group-index` label; a Deployment pod's `chamber.io/replica`
annotation, which Chamber sets when it releases the pod, along with `controller.kubernetes.io/pod-deletion-cost`
so that a scale-down deletes the highest replica's pod first (a StatefulSet and a LeaderWorkerSet
always remove the highest ordinal first).
"""

from __future__ import annotations

from typing import Any, ClassVar

from services.kube.kinds import PodGroup, WorkloadKind, _template
from services.kube.patches import Op, annotation_ops, resolve
from services.kube.resources import WorkloadError, count

MIN_REPLICAS_ANNOTATION = "chamber.io/min-replicas"
REPLICA_ANNOTATION = "chamber.io/replica"  # a Deployment pod's replica, set as Chamber releases it
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
TEMPLATE_HASH_LABEL = "pod-template-hash"
DEFAULT_MIN_REPLICAS = 1


class ServingKind(WorkloadKind):
    """A workload that is scaled: `groups` are one replica's pods; it is never held or suspended itself."""

    suspend_pointer = None
    preemptible = False  # per replica instead: see min_replicas
    done_conditions: ClassVar[dict[str, str]] = {}
    replicas_pointer: ClassVar[str] = "/spec/replicas"

    def held(self, obj: dict[str, Any]) -> bool:
        return False

    def finished(self, obj: dict[str, Any]) -> str | None:
        return None

    def hold_ops(self, obj: dict[str, Any]) -> list[Op]:
        return []

    def suspend_ops(self, obj: dict[str, Any]) -> list[Op] | None:
        return None

    def replicas(self, obj: dict[str, Any]) -> int:
        """The replicas asked for now (what an HPA or KEDA sets); Kubernetes' default is 1."""
        return count(resolve(obj, self.replicas_pointer), "spec.replicas")

    def min_replicas(self, obj: dict[str, Any]) -> int:
        """Replicas guaranteed (never preempted), from `chamber.io/min-replicas`; default 1."""
        raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(MIN_REPLICAS_ANNOTATION)
        if raw is None:
            return DEFAULT_MIN_REPLICAS
        if not str(raw).strip().isdigit():
            raise WorkloadError(f"annotation {MIN_REPLICAS_ANNOTATION}: {raw!r} is not a whole number of replicas")
        return int(str(raw).strip())

    def owned(self, obj: dict[str, Any]) -> bool:
        """Part of another workload (a LeaderWorkerSet's StatefulSets): not a serving workload of its own."""
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return LWS_NAME_LABEL in labels or any(r.get("kind") == "LeaderWorkerSet" for r in _owners(obj))

    def owns(self, pod: dict[str, Any]) -> str | None:
        """The name of the workload of this kind that owns the pod, if one does."""
        raise NotImplementedError

    def replica_of(self, pod: dict[str, Any], workload: str) -> int | None:
        """The replica the pod belongs to; None: not known yet (a Deployment pod Chamber has not released)."""
        raise NotImplementedError


def _owners(pod: dict[str, Any]) -> list[dict[str, Any]]:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return [r for r in refs if isinstance(r, dict)]


def _ordinal(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


class Deployment(ServingKind):
    kind, group, version, plural = "Deployment", "apps", "v1", "deployments"

    def groups(self, obj: dict[str, Any]) -> list[PodGroup]:
        return [_template(obj, "/spec/template/spec", 1)]

    def owns(self, pod: dict[str, Any]) -> str | None:
        """A Deployment's pods belong to its ReplicaSet `<deployment>-<pod-template-hash>`."""
        digest = ((pod.get("metadata") or {}).get("labels") or {}).get(TEMPLATE_HASH_LABEL)
        for ref in _owners(pod):
            name = str(ref.get("name") or "")
            if ref.get("kind") == "ReplicaSet" and digest and name.endswith(f"-{digest}"):
                return name[: -len(digest) - 1]
        return None

    def replica_of(self, pod: dict[str, Any], workload: str) -> int | None:
        return _ordinal(((pod.get("metadata") or {}).get("annotations") or {}).get(REPLICA_ANNOTATION))


class StatefulSet(ServingKind):
    kind, group, version, plural = "StatefulSet", "apps", "v1", "statefulsets"

    def groups(self, obj: dict[str, Any]) -> list[PodGroup]:
        return [_template(obj, "/spec/template/spec", 1)]

    def owns(self, pod: dict[str, Any]) -> str | None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if LWS_NAME_LABEL in labels:
            return None  # a LeaderWorkerSet's StatefulSets are its own
        return next((str(r.get("name")) for r in _owners(pod) if r.get("kind") == "StatefulSet"), None)

    def replica_of(self, pod: dict[str, Any], workload: str) -> int | None:
        name = str((pod.get("metadata") or {}).get("name") or "")
        return _ordinal(name.removeprefix(f"{workload}-")) if name.startswith(f"{workload}-") else None


class LeaderWorkerSet(ServingKind):
    kind, group, version, plural = "LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"

    def groups(self, obj: dict[str, Any]) -> list[PodGroup]:
        template = resolve(obj, "/spec/leaderWorkerTemplate") or {}
        size = count(template.get("size"), "spec.leaderWorkerTemplate.size")
        if size < 1:
            raise WorkloadError("spec.leaderWorkerTemplate.size must be 1 or more")
        workers = "/spec/leaderWorkerTemplate/workerTemplate/spec"
        if template.get("leaderTemplate") is None:
            return [_template(obj, workers, size)]
        return [_template(obj, "/spec/leaderWorkerTemplate/leaderTemplate/spec", 1), _template(obj, workers, size - 1)]

    def owns(self, pod: dict[str, Any]) -> str | None:
        name = ((pod.get("metadata") or {}).get("labels") or {}).get(LWS_NAME_LABEL)
        return str(name) if name else None

    def replica_of(self, pod: dict[str, Any], workload: str) -> int | None:
        return _ordinal(((pod.get("metadata") or {}).get("labels") or {}).get(LWS_GROUP_LABEL))


SERVING_KINDS: tuple[ServingKind, ...] = (Deployment(), StatefulSet(), LeaderWorkerSet())


def release_ops(kind: ServingKind, pod: dict[str, Any], replica: int) -> list[Op]:
    """The annotations a Deployment pod gets as Chamber releases it: its replica, and a deletion cost
    that makes a scale-down take the highest replica's pod first. Other kinds know their ordinals."""
    if not isinstance(kind, Deployment):
        return []
    ops = annotation_ops(pod, REPLICA_ANNOTATION, str(replica))
    with_first = {**pod, "metadata": {**(pod.get("metadata") or {}), "annotations": {REPLICA_ANNOTATION: ""}}}
    return ops + annotation_ops(with_first, DELETION_COST_ANNOTATION, str(-replica))
