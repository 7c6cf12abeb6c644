"""A cluster's dispatch actuator, the pure part: what the dispatch log (folded by `evolve`) and the
cluster's own objects (one listing) call for, as events to publish and Kubernetes actions. The shell
(services/dispatch/service.py, `--actuator`) lists, calls `plan`, deletes, then creates and patches.

The MultiKueue model (Kueue's manager and worker clusters): the object a user creates in the origin
cluster with `chamber.io/clusters` stays suspended and is the user's one handle; the dispatcher picks
one cluster; that cluster's actuator creates one copy (same namespace, name and spec, held as the
origin was, so the cluster's own admission path places it; labels name the origin and generation),
reports its phase, and deletes it when it is recalled. The origin's actuator writes the copy's phase
back onto the origin object (annotation `chamber.io/dispatch-status`) and offers the workload.

No duplicate running: a copy whose (workload, generation) is not the live one in the log is deleted,
and deletions come first in every round (`plan` returns them before anything else), so a cluster that
comes back after being declared lost deletes its fenced copies before it creates anything. An
actuator that could not reach the bus for `FENCE_FRACTION` of `lost_after_s` fences itself: it
deletes every copy it holds, before the dispatcher (after the whole of `lost_after_s`) sends their
workloads elsewhere.
"""

from __future__ import annotations

import copy as copylib
import json
from dataclasses import dataclass, field
from typing import Any

from events import Event
from events.codec import stable_id
from events.dispatch import (
    FINAL_PHASES,
    CopyPhase,
    CopyRecalled,
    CopyReported,
    WorkloadDispatched,
    WorkloadOffered,
    WorkloadWithdrawn,
)
from events.jobs import JobSpec
from services.dispatch.core import CLUSTERS_ANNOTATION, DispatchError, parse_clusters
from services.kube.kinds import SCHEDULING_GATE, Observed, WorkloadKind, kind_of, owned_by_workload
from services.kube.patches import Op, annotation_ops
from services.kube.resources import WorkloadError

STATUS_ANNOTATION = "chamber.io/dispatch-status"  # on the origin: where its one copy is and how it is
WORKLOAD_LABEL = "chamber.io/dispatch-workload"  # on a copy: the workload it is a copy of
GENERATION_LABEL = "chamber.io/dispatch-generation"
ORIGIN_LABEL = "chamber.io/origin-cluster"
ORIGIN_NAMESPACE_LABEL = "chamber.io/origin-namespace"
ORIGIN_NAME_ANNOTATION = "chamber.io/origin-name"  # names may be longer than a label value allows
ORIGIN_UID_LABEL = "chamber.io/origin-uid"
LABEL_MAX = 63
FENCE_FRACTION = 0.5  # an actuator without the bus for this part of the timeout deletes its copies
# dropped from the copy: the origin's own bookkeeping, and what would make the copy an origin again
_NOT_COPIED = (CLUSTERS_ANNOTATION, STATUS_ANNOTATION, "kubectl.kubernetes.io/last-applied-configuration")


NOT_DISPATCHED = (
    f"a serving workload (Deployment, StatefulSet, LeaderWorkerSet) runs in the cluster it is created in; "
    f"remove the {CLUSTERS_ANNOTATION} annotation, or create it in the cluster it should run in"
)


def multi_cluster(obj: dict[str, Any]) -> bool:
    """An origin object: it names the clusters it may run in. The scheduler's own actuator leaves
    it alone (it never runs where it was created; its copy does, wherever it is dispatched)."""
    return CLUSTERS_ANNOTATION in ((obj.get("metadata") or {}).get("annotations") or {})


def is_copy(obj: dict[str, Any]) -> bool:
    return WORKLOAD_LABEL in ((obj.get("metadata") or {}).get("labels") or {})


@dataclass
class ActuatorState:
    cluster: str
    offers: dict[str, WorkloadOffered] = field(default_factory=dict)
    live: dict[str, tuple[str, int]] = field(default_factory=dict)  # workload -> (cluster, generation)
    generations: dict[str, int] = field(default_factory=dict)
    final: dict[str, str] = field(default_factory=dict)  # workload -> why it is done
    final_at: dict[str, float] = field(default_factory=dict)  # workload -> when it was recalled for good
    withdrawn: set[str] = field(default_factory=set)
    reports: dict[str, CopyReported] = field(default_factory=dict)  # workload -> its live copy's last report
    mine: dict[tuple[str, int], CopyPhase] = field(default_factory=dict)  # what this cluster reported


def evolve(s: ActuatorState, event: Event) -> None:
    match event:
        case WorkloadOffered():
            s.offers.setdefault(event.workload, event)
        case WorkloadWithdrawn():
            s.withdrawn.add(event.workload)
        case WorkloadDispatched():
            if event.generation > s.generations.get(event.workload, 0):
                s.generations[event.workload] = event.generation
                s.live[event.workload] = (event.cluster, event.generation)
        case CopyRecalled():
            if s.live.get(event.workload) == (event.cluster, event.generation):
                del s.live[event.workload]
            if event.final:
                s.final[event.workload] = event.reason or "done"
                s.final_at.setdefault(event.workload, event.at)
        case CopyReported():
            if event.cluster == s.cluster:
                s.mine[(event.workload, event.generation)] = event.phase
            if event.generation >= s.generations.get(event.workload, 0):
                s.reports[event.workload] = event


@dataclass(frozen=True)
class Create:
    kind: str
    api_version: str
    namespace: str
    name: str
    body: dict[str, Any] = field(compare=False)
    workload: str = field(default="", compare=False)  # its CREATED report is published once it is made


@dataclass(frozen=True)
class Delete:
    kind: str
    api_version: str
    namespace: str
    name: str
    reason: str = field(default="", compare=False)


@dataclass(frozen=True)
class Patch:
    kind: str
    api_version: str
    namespace: str
    name: str
    ops: tuple[Op, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Refuse:
    """An origin Chamber cannot dispatch as written: a Kubernetes Event on it says why (once per uid)."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str = ""
    reason: str = field(default="", compare=False)


Action = Delete | Create | Patch | Refuse


def workload_id(cluster: str, namespace: str, name: str, kind: WorkloadKind) -> str:
    from services.scheduler.kubernetes import job_id

    return job_id(cluster, namespace, name, kind)


def _label_value(value: str) -> str:
    """A label value (63 characters at most): long ones keep a digest of the whole."""
    if len(value) <= LABEL_MAX:
        return value
    digest = stable_id("label", value)[:8]
    return f"{value[: LABEL_MAX - 9]}-{digest}"


def copy_name(offer: WorkloadOffered, cluster: str) -> str:
    """The copy keeps the origin's name, as MultiKueue's do; in the origin cluster itself (where the
    origin object holds the name) it takes a suffix."""
    if cluster != offer.origin:
        return offer.name
    suffix = "-dispatched"
    return offer.name[: 253 - len(suffix)] + suffix


def manifest_of(kind: WorkloadKind, obj: dict[str, Any]) -> str:
    """What is copied: apiVersion, kind, labels, annotations (less the origin's own) and the spec, held."""
    meta = obj.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _NOT_COPIED}
    body: dict[str, Any] = {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"labels": dict(meta.get("labels") or {}), "annotations": annotations},
        "spec": copylib.deepcopy(obj.get("spec") or {}),
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def released(kind: WorkloadKind, body: dict[str, Any]) -> dict[str, Any]:
    """The copy let run at once (`--copies released`): unsuspended, or Chamber's gate lifted from a Pod;
    the cluster's own scheduler places its pods."""
    if kind.suspend_pointer is None:
        spec = body.setdefault("spec", {})
        gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != SCHEDULING_GATE]
        if gates:
            spec["schedulingGates"] = gates
        else:
            spec.pop("schedulingGates", None)
        return body
    *parents, last = kind.suspend_pointer.strip("/").split("/")
    node = body
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = False
    return body


def copy_body(offer: WorkloadOffered, cluster: str, generation: int, *, release: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(offer.manifest)
    meta = body.setdefault("metadata", {})
    meta["name"], meta["namespace"] = copy_name(offer, cluster), offer.namespace
    meta.setdefault("labels", {}).update(
        {
            WORKLOAD_LABEL: _label_value(offer.workload),
            GENERATION_LABEL: str(generation),
            ORIGIN_LABEL: _label_value(offer.origin),
            ORIGIN_NAMESPACE_LABEL: _label_value(offer.namespace),
            ORIGIN_UID_LABEL: _label_value(offer.uid),
        }
    )
    meta.setdefault("annotations", {})[ORIGIN_NAME_ANNOTATION] = offer.name
    kind = kind_of(body.get("apiVersion", ""), body.get("kind", ""))
    return released(kind, body) if release and kind is not None else body


def phase_of(kind: WorkloadKind, obj: dict[str, Any], before: CopyPhase | None) -> CopyPhase:
    done = kind.finished(obj)
    if done == "Complete":
        return CopyPhase.COMPLETE
    if done == "Failed":
        return CopyPhase.FAILED
    if not kind.held(obj):
        return CopyPhase.RUNNING
    return CopyPhase.SUSPENDED if before in (CopyPhase.RUNNING, CopyPhase.SUSPENDED) else CopyPhase.CREATED


def status_of(s: ActuatorState, workload: str) -> dict[str, Any]:
    """What the origin object shows: the cluster of its one copy, the copy's phase, or why none."""
    report = s.reports.get(workload)
    live = s.live.get(workload)
    if workload in s.final:
        phase = str(report.phase) if report is not None and report.phase in FINAL_PHASES else s.final[workload]
        out: dict[str, Any] = {"phase": phase}
        if report is not None:
            out["cluster"] = report.cluster
        return out
    if live is None:
        return {"phase": "waiting", "message": "no cluster may run it now (allow-list, quota, capacity)"}
    cluster, generation = live
    phase = CopyPhase.CREATED
    if report is not None and (report.cluster, report.generation) == live:
        phase = report.phase
    return {"cluster": cluster, "generation": generation, "phase": str(phase)}


def _key(o: Observed) -> tuple[str, str, str]:
    meta = o.obj["metadata"]
    return (meta["namespace"], o.kind.kind, meta["name"])


def plan(
    s: ActuatorState,
    listed: list[Observed],
    now: float,
    *,
    fenced: bool = False,
    release: bool = False,
    keep_finished_s: float = 0.0,
) -> tuple[list[tuple[Event, str]], list[Action]]:
    """This cluster's round: events (offers, withdrawals, copy phases) and actions, deletions first.
    `fenced`: the actuator lost the bus for too long: every copy here is deleted, nothing created.
    `release`: copies are created released (`released`), else held as their origin was.
    `keep_finished_s`: a copy that completed or failed is deleted this long after its recall, so
    whatever admitted it in its cluster (Chamber's scheduler, Kueue) sees it finish first."""
    me = s.cluster
    events: list[tuple[Event, str]] = []
    deletes: list[Action] = []
    others: list[Action] = []
    origins: dict[str, Observed] = {}
    copies: dict[tuple[str, int], Observed] = {}
    for o in sorted(listed, key=_key):
        if owned_by_workload(o.obj):
            continue
        meta = o.obj["metadata"]
        labels = meta.get("labels") or {}
        if is_copy(o.obj):
            try:
                generation = int(labels.get(GENERATION_LABEL, "0"))
            except ValueError:
                generation = 0
            wid = _copy_workload(s, labels.get(WORKLOAD_LABEL, ""))
            key = (wid, generation)
            if fenced or s.live.get(wid) != (me, generation) or key in copies:
                if not fenced and wid in s.final and o.kind.finished(o.obj) and now < s.final_at[wid] + keep_finished_s:
                    continue  # finished: kept a little, so the cluster's own admission sees it finish
                why = "fenced: this cluster lost the bus" if fenced else "not the workload's live copy"
                deletes.append(Delete(o.kind.kind, o.kind.api_version, meta["namespace"], meta["name"], why))
                continue
            copies[key] = o
        elif multi_cluster(o.obj):
            origins[workload_id(me, meta["namespace"], meta["name"], o.kind)] = o
    # copies this cluster should hold: report phase changes, create the missing ones
    if not fenced:
        for wid, (cluster, generation) in sorted(s.live.items()):
            if cluster != me or wid not in s.offers:
                continue
            before = s.mine.get((wid, generation))
            found = copies.get((wid, generation))
            if found is None:
                if before is None:
                    offer = s.offers[wid]
                    body = copy_body(offer, me, generation, release=release)
                    kind = kind_of(body["apiVersion"], body["kind"])
                    if kind is not None:
                        name = body["metadata"]["name"]
                        others.append(Create(kind.kind, kind.api_version, offer.namespace, name, body, wid))
                        events.append(_report(wid, me, generation, CopyPhase.CREATED, now))
                elif before not in FINAL_PHASES and before != CopyPhase.GONE:
                    events.append(_report(wid, me, generation, CopyPhase.GONE, now, "deleted outside Chamber"))
                continue
            phase = phase_of(found.kind, found.obj, before)
            if phase != before:
                events.append(_report(wid, me, generation, phase, now))
    # origins created here: offer once, keep suspended, mirror the copy's status
    for wid, o in origins.items():
        meta = o.obj["metadata"]
        if kind_of(o.kind.api_version, o.kind.kind) is None:  # a serving workload: not copied, not touched
            ns, name, uid = meta["namespace"], meta["name"], meta.get("uid", "")
            others.append(Refuse(o.kind.kind, o.kind.api_version, ns, name, uid, NOT_DISPATCHED))
            continue
        if wid not in s.offers:
            offered = offer_of(o, me, now)
            if isinstance(offered, WorkloadOffered):
                events.append((offered, stable_id("dispatch-offered", me, meta.get("uid", ""), wid)))
            elif isinstance(offered, str):
                ns, name, uid = meta["namespace"], meta["name"], meta.get("uid", "")
                others.append(Refuse(o.kind.kind, o.kind.api_version, ns, name, uid, offered))
        ops: list[Op] = []
        if not o.kind.held(o.obj):
            ops += o.kind.suspend_ops(o.obj) or []
        status = json.dumps(status_of(s, wid), sort_keys=True, separators=(",", ":"))
        if (meta.get("annotations") or {}).get(STATUS_ANNOTATION) != status and wid in s.offers:
            ops += annotation_ops(o.obj, STATUS_ANNOTATION, status)
        if ops:
            others.append(Patch(o.kind.kind, o.kind.api_version, meta["namespace"], meta["name"], tuple(ops)))
    # origins gone from here (deleted by their user): withdrawn, so their copy is recalled
    for wid, offer in sorted(s.offers.items()):
        if offer.origin == me and wid not in origins and wid not in s.final and wid not in s.withdrawn:
            events.append((WorkloadWithdrawn(workload=wid, origin=me, at=now), stable_id("dispatch-withdrawn", wid)))
    return events, [*deletes, *others]


def load(listed: list[Observed]) -> tuple[int, int]:
    """(GPUs running, GPUs waiting) of the cluster's own Chamber workloads: released and not finished,
    or held; dispatched copies and origins are not counted (the dispatcher counts copies itself, and an
    origin never runs where it was created)."""
    running = queued = 0
    for o in listed:
        if owned_by_workload(o.obj) or is_copy(o.obj) or multi_cluster(o.obj) or o.kind.finished(o.obj):
            continue
        try:
            demand = o.kind.demand(o.obj)
        except WorkloadError:
            continue
        if demand is None:
            continue
        gpus = demand.gpus_per_pod * demand.pods
        if o.kind.held(o.obj):
            queued += gpus
        else:
            running += gpus
    return running, queued


def _copy_workload(s: ActuatorState, label: str) -> str:
    """The workload a copy's label names (a long id was cut to a label value with a digest)."""
    if label in s.live or label in s.offers:
        return label
    return next((w for w in s.offers if _label_value(w) == label), label)


def _report(
    wid: str, cluster: str, generation: int, phase: CopyPhase, now: float, message: str = ""
) -> tuple[Event, str]:
    event = CopyReported(workload=wid, cluster=cluster, generation=generation, phase=phase, at=now, message=message)
    return event, stable_id("copy-reported", wid, cluster, generation, phase)


def offer_of(o: Observed, cluster: str, now: float) -> WorkloadOffered | str | None:
    """The offer an origin object becomes; why not (a refusal naming the fix); None: not Chamber's."""
    from services.scheduler.kubernetes import spec_of

    meta = o.obj["metadata"]
    try:
        clusters = parse_clusters((meta.get("annotations") or {}).get(CLUSTERS_ANNOTATION))
    except DispatchError as exc:
        return str(exc)
    spec = spec_of(o.kind, o.obj, cluster)
    if not isinstance(spec, JobSpec):
        return spec
    return WorkloadOffered(
        workload=workload_id(cluster, meta["namespace"], meta["name"], o.kind),
        origin=cluster,
        namespace=meta["namespace"],
        name=meta["name"],
        team=spec.team,
        gpus=spec.gpus_per_replica * spec.replicas,
        at=now,
        uid=meta.get("uid", ""),
        kind=o.kind.kind,
        clusters=clusters,
        manifest=manifest_of(o.kind, o.obj),
    )
