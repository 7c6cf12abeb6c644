"""Kubernetes workloads, the way Kueue does it: a workload that names a team (`chamber.io/team`, or a
Kueue queue through its namespace's binding) and is created held (suspended, or gated for a Pod) is
picked up as a Chamber job; admission pins its GPU pods to the chosen nodes (keeping the user's own
affinity) and releases it; preemption suspends it again and restores the user's affinity; its
completion or failure becomes a job event. Kinds: `services.kube.kinds`. Each cluster's actuator acts
only on its own cluster's workloads.

`reconcile(...)` is pure and level-triggered (desired state from the scheduler's state, observed
state from one list per kind), so a missed or repeated round never leaves a workload wrong for long.
A workload its namespace may not charge to the named team, or that Chamber cannot place as written,
is never submitted: `Refuse` becomes a Kubernetes Event on it saying why.
`KubernetesWorkloads` (services.kube.cluster) is the adapter over the real `kubernetes` client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from events import Event, GpuShare, JobCompleted, JobFailed, JobSpec, JobSubmitted, Placement, ShareMode
from events.codec import stable_id
from events.commands import SubmitJob
from events.names import NAME_MAX, InvalidName, check_event, decode_request
from services.dispatch.core import CLUSTERS_ANNOTATION
from services.kube.bindings import PREEMPTIBLE_LABEL as PREEMPTIBLE_LABEL
from services.kube.bindings import PRIORITY_LABEL as PRIORITY_LABEL
from services.kube.bindings import TEAM_LABEL as TEAM_LABEL
from services.kube.bindings import Bindings, Claim, claim
from services.kube.kinds import BatchJob, Demand, Observed, Pod, WorkloadKind, owned_by_workload
from services.kube.patches import Op, annotation_ops
from services.kube.resources import ShareRequest, WorkloadError
from services.scheduler.core import FINISHED, JobState, SchedulerState
from services.scheduler.core.door import admit

if TYPE_CHECKING:
    from services.scheduler.core.sharing import PodRequest

OPEN = Bindings(open=True)
# Set on a workload as it is suspended: the job should checkpoint now; it resumes from that checkpoint
# wherever it is placed next.
CHECKPOINT_ANNOTATION = "chamber.io/checkpoint-requested"
# What Chamber chose for a pod (device_annotations): GPU indices on its node, a MIG instance, a fraction.
GPUS_ANNOTATION = "chamber.io/gpus"
UUIDS_ANNOTATION = "chamber.io/gpu-uuids"
MIG_ANNOTATION = "chamber.io/mig-instance"
MILLI_ANNOTATION = "chamber.io/gpu-milli"


@dataclass(frozen=True)
class Admit:
    namespace: str
    name: str
    nodes: tuple[str, ...]
    kind: str = "Job"
    ops: tuple[Op, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Suspend:
    namespace: str
    name: str
    kind: str = "Job"
    ops: tuple[Op, ...] = field(default=(), compare=False)
    reason: str = field(default="", compare=False)  # why (preempted, requeued off an isolated GPU or a culprit)


@dataclass(frozen=True)
class Refuse:
    """Never admitted; the Event says why (once per object: the actuator remembers the uid)."""

    namespace: str
    name: str
    kind: str
    uid: str
    reason: str


Action = Admit | Suspend | Refuse


def job_id(cluster: str, namespace: str, name: str, kind: WorkloadKind | None = None) -> str:
    if kind is None or isinstance(kind, BatchJob):
        jid = f"k8s-{cluster}-{namespace}-{name}"  # batch Jobs keep their ids from before other kinds
    else:
        jid = f"k8s-{cluster}-{namespace}-{kind.short}-{name}"
    if len(jid) <= NAME_MAX:
        return jid
    # A 253-character name in a long namespace: cut, and keep it unique with a digest of the whole.
    digest = stable_id("k8s-job-id", jid)[:16]
    return f"{jid[: NAME_MAX - len(digest) - 1]}-{digest}"


def through_the_door(state: SchedulerState, spec: JobSpec, jid: str, at: float) -> JobSubmitted | str:
    """The JobSubmitted a workload becomes, checked by the same door as `chamber submit` and the HTTP API
    (core/door.py `admit`: events.commands.SubmitJob's names and limits, a team without a quota, critical
    work a team's quota does not allow); else why not, naming the fix. A workload that cannot run on the
    fleet as installed is held, not refused (`allow_wait`): suspended is how Kubernetes waits."""
    request = {
        "team": spec.team,
        "gpus": spec.gpus_per_replica,
        "replicas": spec.replicas,
        "priority": str(spec.priority),
        "name": spec.name,
        "cluster": spec.cluster,
        "preemptible": spec.preemptible,
        "allow_wait": True,
    }
    if spec.share is not None:
        share = _share_fields(state, spec.share)
        if isinstance(share, str):
            return f"Chamber refuses this workload: {share}"
        request.update(share)
    try:
        event, _ = admit(state, decode_request(request, SubmitJob), jid, at)
        event = JobSubmitted(job_id=jid, at=at, spec=msgspec.structs.replace(event.spec, namespace=spec.namespace))
        check_event(event)
    except InvalidName as exc:
        return f"Chamber refuses this workload as it would the same `chamber submit`: {exc}"
    return event


def _share_fields(state: SchedulerState, share: GpuShare) -> dict[str, Any] | str:
    """A pod's share as `chamber submit` options. A `gpu-memory` fraction counts as the share of the
    smallest GPU memory in the fleet it asks for, rounded up (so it fits wherever it is placed)."""
    if share.mig_profile:
        return {"mig_profile": share.mig_profile}
    milli = share.gpu_milli
    if not milli:
        memories = [m for n in state.nodes.values() for m in n.gpu_memory.values()]
        if not memories:
            return "gpu-memory: the fleet's GPU memory is not known yet; ask with gpu-fraction instead"
        if share.memory_mib > min(memories):
            return f"gpu-memory: {share.memory_mib} MiB is more than the smallest GPU's {min(memories)} MiB"
        milli = -(-1000 * share.memory_mib // min(memories))
    fields: dict[str, Any] = {"gpu_milli": milli, "share_mode": share.mode.value}
    if share.memory_mib:
        fields["gpu_memory_mib"] = share.memory_mib
    return fields


def _spec_share(share: ShareRequest) -> GpuShare | str:
    """A pod's parsed share (services.kube.resources.pod_share) as the job's per-replica share."""
    if share.mig_profile:
        if share.mig_count != 1:
            return f"nvidia.com/mig-{share.mig_profile}: {share.mig_count} instances in one pod; a pod takes one"
        return GpuShare(mode=ShareMode.MIG, mig_profile=share.mig_profile)
    mode = ShareMode.MPS if share.mode == "mps" else ShareMode.TIME_SLICING
    return GpuShare(gpu_milli=share.gpu_milli, memory_mib=share.gpu_memory_mib, mode=mode)


def spec_of(
    kind: WorkloadKind,
    obj: dict[str, Any],
    cluster: str,
    bindings: Bindings = OPEN,
    templates: Mapping[str, Mapping[str, dict[str, Any]]] | None = None,
) -> JobSpec | str | None:
    """The Chamber job a workload asks for; a refusal (why, and the fix); None if it is not Chamber's or
    asks no GPU. `templates` (namespace -> name -> ResourceClaimTemplate) lets pods ask through DRA
    claims of the NVIDIA driver (services/kube/dra.py)."""
    meta = obj.get("metadata") or {}
    claimed = claim(meta.get("labels") or {}, meta.get("namespace") or "", bindings)
    if not isinstance(claimed, Claim):
        return claimed
    try:
        demand = kind.demand(obj)
        shared = kind.share(obj)
        if demand is None and shared is None and templates is not None:
            demand, shared = kind.dra(obj, templates.get(str(meta.get("namespace") or ""), {}))
        cpu_milli, memory_mib = kind.host(obj)
    except WorkloadError as exc:
        return str(exc)
    if demand is not None and shared is not None:
        return f"{kind.kind} mixes whole-GPU pods and pods asking for part of a GPU; a gang is of equal pods"
    share = None if shared is None else _spec_share(shared[0])
    if isinstance(share, str):
        return share
    if demand is None and shared is not None:
        demand = Demand(1, shared[1], "nvidia")
    if demand is None:
        return None
    if (why := kind.check(obj)) is not None:
        return why
    return JobSpec(
        share=share,
        team=claimed.team,
        gpus_per_replica=demand.gpus_per_pod,
        replicas=demand.pods,
        priority=claimed.priority,
        name=meta["name"],
        namespace=meta["namespace"],
        cluster=cluster,
        preemptible=claimed.preemptible and kind.preemptible,
        gpu_vendor="amd" if demand.vendor == "amd" else "nvidia" if demand.vendor == "nvidia" else None,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
    )


def reconcile(
    state: SchedulerState,
    observed: list[Observed] | list[tuple[WorkloadKind, dict[str, Any]]] | list[dict[str, Any]],
    cluster: str,
    now: float,
    bindings: Bindings = OPEN,
    templates: Mapping[str, Mapping[str, dict[str, Any]]] | None = None,
) -> tuple[list[tuple[Event, str]], list[Action]]:
    """Compare the scheduler's decisions with the cluster's workloads: events to record, patches to make.
    Plain dicts are batch Jobs. `templates`: the ResourceClaimTemplates per namespace (DRA requests)."""
    items = [Observed(*o) if isinstance(o, tuple) else Observed(BatchJob(), o) for o in observed]
    events: list[tuple[Event, str]] = []
    actions: list[Action] = []
    for item in sorted(items, key=lambda o: (o.obj["metadata"]["namespace"], o.kind.kind, o.obj["metadata"]["name"])):
        kind, obj = item.kind, item.obj
        if owned_by_workload(obj):
            continue  # admitted through its owner
        if CLUSTERS_ANNOTATION in (obj["metadata"].get("annotations") or {}):
            continue  # a multi-cluster origin: it stays suspended, its one copy runs where it is dispatched
        meta = obj["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta.get("uid", "")
        jid = job_id(cluster, ns, name, kind)
        known = state.jobs.get(jid)
        held = kind.held(obj)
        done = kind.finished(obj)
        if known is None:
            if held and done is None:
                spec = spec_of(kind, obj, cluster, bindings, templates)
                submit = through_the_door(state, spec, jid, now) if isinstance(spec, JobSpec) else spec
                if isinstance(submit, str):
                    actions.append(Refuse(ns, name, kind.kind, uid, submit))
                elif submit is not None:
                    events.append((submit, stable_id("k8s-submitted", cluster, uid, jid)))
            continue
        if known.state in FINISHED:
            if known.state == JobState.CANCELLED and not held and done is None:
                actions += _suspend(kind, obj, ns, name)
            continue
        if done == "Complete":
            events.append((JobCompleted(job_id=jid, at=now), stable_id("k8s-completed", cluster, uid, jid)))
        elif done == "Failed":
            event = JobFailed(job_id=jid, at=now, reason=f"the Kubernetes {kind.kind} failed")
            events.append((event, stable_id("k8s-failed", cluster, uid, jid)))
        elif known.state == JobState.RUNNING and held:
            nodes = tuple(sorted({p.node for p in known.placements if p.cluster == cluster}))
            ops = kind.admit_ops(obj, nodes)
            if isinstance(kind, Pod):  # one pod: it carries the GPUs chosen for it (set before its gate lifts)
                here = [p for p in known.placements if p.cluster == cluster]
                node = state.nodes.get((cluster, here[0].node)) if here else None
                ops = [*device_ops(obj, here, node.gpu_uuids if node is not None else {}), *ops]
            actions.append(Admit(ns, name, nodes, kind.kind, tuple(ops)))
        elif known.state != JobState.RUNNING and not held:
            actions += _suspend(kind, obj, ns, name, known.reason)
    return events, actions


def device_annotations(placements: list[Placement], uuids: Mapping[int, str] | None = None) -> dict[str, str]:
    """What Chamber chose for one pod, for the device side to read: `chamber.io/gpus` (GPU indices on its
    node) and `chamber.io/gpu-uuids` (their UUIDs, where discovery reported them), and for a share
    `chamber.io/gpu-milli` (its part of the GPU) or `chamber.io/mig-instance` (`PROFILE@START`: the MIG
    instance's profile and first memory slice). The NVIDIA device plugin and DRA driver allocate the
    devices themselves and enforce isolation; these say what Chamber counted."""
    if not placements:
        return {}
    indices = [i for p in placements for i in p.gpu_indices]
    out = {GPUS_ANNOTATION: ",".join(map(str, indices))}
    if uuids and all(i in uuids for i in indices):
        out[UUIDS_ANNOTATION] = ",".join(uuids[i] for i in indices)
    mig = [f"{p.mig_profile}@{p.mig_start}" for p in placements if p.mig_profile and p.mig_start is not None]
    if mig:
        out[MIG_ANNOTATION] = ",".join(mig)
    elif any(p.share_milli < 1000 for p in placements):
        out[MILLI_ANNOTATION] = ",".join(str(p.share_milli) for p in placements)
    return out


def device_ops(obj: dict[str, Any], placements: list[Placement], uuids: Mapping[int, str] | None = None) -> list[Op]:
    """The pod's annotations of what Chamber chose (`device_annotations`); stale ones removed."""
    want = device_annotations(placements, uuids)
    ops: list[Op] = []
    for key in (GPUS_ANNOTATION, UUIDS_ANNOTATION, MIG_ANNOTATION, MILLI_ANNOTATION):
        value = want.get(key)
        current = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
        if value != current:
            ops += annotation_ops(obj, key, value)
            if value is not None and not (obj.get("metadata") or {}).get("annotations"):
                obj = {**obj, "metadata": {**(obj.get("metadata") or {}), "annotations": {key: value}}}
    return ops


def _suspend(kind: WorkloadKind, obj: dict[str, Any], ns: str, name: str, reason: str = "") -> list[Action]:
    """Suspend (or gate) the workload; with a reason, also ask it to checkpoint now: the annotation says
    why, and its pods' SIGTERM and grace period are the job's own signal to save its state."""
    ops = kind.suspend_ops(obj)
    if ops is None:
        return []
    if reason:
        ops = [*ops, *annotation_ops(obj, CHECKPOINT_ANNOTATION, reason[:1000])]
    return [Suspend(ns, name, kind.kind, tuple(ops), reason)]


def share_request(
    share: ShareRequest,
    *,
    models: frozenset[str] = frozenset(),
    gpu_memory_mib: int | None = None,
    cpu_milli: int = 0,
    memory_mib: int = 0,
) -> PodRequest:
    """A pod's MIG instance or GPU fraction (`services.kube.resources.pod_share`) as the packer's request.
    `gpu_memory_mib` is the memory of the GPUs a `gpu-memory` fraction is measured against."""
    # Imported here: the packer needs numpy, which the scheduler's service process does not load.
    from services.scheduler.core.mig import MigError
    from services.scheduler.core.sharing import MILLI, PodRequest, mig_request_on_any

    if share.mig_profile:
        if share.mig_count != 1:
            raise WorkloadError(f"nvidia.com/mig-{share.mig_profile}: {share.mig_count} instances; a pod takes one")
        try:
            return mig_request_on_any(share.mig_profile, models, cpu_milli, memory_mib)
        except MigError as exc:
            raise WorkloadError(f"nvidia.com/mig-{share.mig_profile}: {exc}") from None
    milli = share.gpu_milli
    if share.gpu_memory_mib:
        if not gpu_memory_mib:
            raise WorkloadError("gpu-memory: the GPUs' memory is unknown here; ask with gpu-fraction instead")
        if share.gpu_memory_mib > gpu_memory_mib:
            raise WorkloadError(f"gpu-memory: {share.gpu_memory_mib} MiB is more than one GPU ({gpu_memory_mib} MiB)")
        milli = -(-MILLI * share.gpu_memory_mib // gpu_memory_mib)  # round up: the memory must fit
    return PodRequest(cpu_milli, memory_mib, 1, milli, models)
