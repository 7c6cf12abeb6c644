"""Serving workloads under the same quotas (services/kube/serving.py says which kinds and how their pods
are found): each replica of a Deployment, StatefulSet or LeaderWorkerSet that names a team is a Chamber
job of class `serving` (a LeaderWorkerSet group is one gang of `size` pods).

- Replicas `0 .. min - 1` (`chamber.io/min-replicas`, default 1) are guaranteed: non-preemptible, so the
  quota rules for non-preemptible work apply and they preempt lower classes as such work does; they are
  never preempted. Replicas from `min` up are preemptible and borrow like any other work.
- Scaling (an HPA or KEDA changing `spec.replicas`) submits or cancels only the difference, the highest
  replicas first; running replicas are never touched. Scaled to zero, every replica is cancelled in the
  same round, so its quota returns at once. A workload deleted is scaled to zero.
- A replica admitted releases its pods (the scheduling gate lifted, pinned to the replica's nodes); a
  borrowed replica preempted has its pods deleted (its controller makes them again, gated, and they
  wait for the replica's next admission).

`reconcile_serving(...)` is pure and level-triggered like `services.scheduler.kubernetes.reconcile`.
A replica's job id is `<workload's job id>-r<replica>`; once that job has finished (scaled down and
up again) the next is `...-r<replica>-<n>`. Which job is a replica's is read from the live jobs' specs
(`spec.serving`), not from the ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from events import Event, JobCancelled, JobSpec, PriorityClass, ServingReplica
from events.codec import stable_id
from services.kube.bindings import Bindings
from services.kube.kinds import Observed, Pod
from services.kube.resources import WorkloadError
from services.kube.serving import SERVING_KINDS, ServingKind, release_ops
from services.scheduler.core import Job, JobState, SchedulerState
from services.scheduler.kubernetes import OPEN, Admit, Refuse, job_id, spec_of, through_the_door

_GATE = Pod()


@dataclass(frozen=True)
class DeletePod:
    """A preempted replica's pod: deleted, its controller makes it again (gated)."""

    namespace: str
    name: str
    reason: str
    kind: str = "Pod"


@dataclass(frozen=True)
class Workload:
    kind: ServingKind
    obj: dict[str, Any]
    pods: tuple[dict[str, Any], ...]

    @property
    def key(self) -> tuple[str, str]:
        meta = self.obj["metadata"]
        return (meta["namespace"], f"{self.kind.short}/{meta['name']}")


def split(listed: list[Observed]) -> tuple[list[Observed], list[Workload]]:
    """The serving workloads (with their pods), and everything else: pods of a listed serving workload
    are its replicas', not plain Pods of their own."""
    serving = [o for o in listed if isinstance(o.kind, ServingKind) and not o.kind.owned(o.obj)]
    by_owner: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for o in serving:
        meta = o.obj["metadata"]
        by_owner[(meta["namespace"], o.kind.kind, meta["name"])] = []
    rest = []
    for o in listed:
        if isinstance(o.kind, ServingKind):
            continue  # a workload, or a part of one (a LeaderWorkerSet's StatefulSets)
        if isinstance(o.kind, Pod):
            ns = o.obj["metadata"]["namespace"]
            owner = next(
                (pods for k in SERVING_KINDS if (pods := by_owner.get((ns, k.kind, k.owns(o.obj) or ""))) is not None),
                None,
            )
            if owner is not None:
                owner.append(o.obj)
                continue
        rest.append(o)
    out = []
    for o in serving:
        assert isinstance(o.kind, ServingKind)
        meta = o.obj["metadata"]
        pods = by_owner[(meta["namespace"], o.kind.kind, meta["name"])]
        out.append(Workload(o.kind, o.obj, tuple(sorted(pods, key=lambda p: p["metadata"]["name"]))))
    return rest, out


def replica_id(base: str, replica: int, incarnation: int) -> str:
    return f"{base}-r{replica}" if incarnation == 0 else f"{base}-r{replica}-{incarnation}"


def live_replicas(state: SchedulerState, cluster: str) -> dict[tuple[str, str], dict[int, Job]]:
    """(namespace, `<kind>/<name>`) -> replica -> its live (queued or running) job, in this cluster."""
    found: dict[tuple[str, str], dict[int, Job]] = {}
    live = {jid for ids in state.running.values() for jid in ids}
    live.update(jid for line in state.fifo_lines.values() for _, jid in line)
    for jid in sorted(live):  # sorted: of two jobs for one replica (never made here) the first wins
        job = state.jobs[jid]
        serving, namespace = job.spec.serving, job.spec.namespace
        if serving is not None and namespace is not None and job.spec.cluster == cluster:
            found.setdefault((namespace, serving.workload), {}).setdefault(serving.replica, job)
    return found


def next_id(state: SchedulerState, base: str, replica: int) -> str:
    """The id a replica's next job takes: the first of its ids the state does not hold (one forgotten
    long ago may come again; the submission's event id differs by the workload's generation)."""
    n = 0
    while replica_id(base, replica, n) in state.jobs:
        n += 1
    return replica_id(base, replica, n)


def reconcile_serving(
    state: SchedulerState, workloads: list[Workload], cluster: str, now: float, bindings: Bindings = OPEN
) -> tuple[list[tuple[Event, str]], list[Admit | DeletePod | Refuse]]:
    """Replica jobs to submit or cancel as the workloads scale, and pods to release or delete."""
    events: list[tuple[Event, str]] = []
    actions: list[Admit | DeletePod | Refuse] = []
    live = live_replicas(state, cluster)
    for w in sorted(workloads, key=lambda w: w.key):
        meta = w.obj["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta.get("uid", "")
        mine = live.pop(w.key, {})
        spec = spec_of(w.kind, w.obj, cluster, bindings)
        if spec is None:  # asks for no GPU: not Chamber's to admit; its pods go as they are
            actions += [_release(w, p, None, 0, cluster) for p in w.pods if _GATE.held(p)]
            events += [_cancel(j.id, now, "it asks for no GPU now", cluster) for _, j in sorted(mine.items())]
            continue
        desired, minimum, why = _scale(w, spec)
        if why is not None:
            actions.append(Refuse(ns, name, w.kind.kind, uid, why))
        for r, job in sorted(mine.items()):
            if r >= desired:
                events.append(_cancel(job.id, now, f"{w.kind.kind} {ns}/{name} scaled to {desired} replicas", cluster))
        jobs = {r: job for r, job in mine.items() if r < desired}
        base = job_id(cluster, ns, name, w.kind)
        for r in range(desired):
            if r in jobs:
                continue
            assert isinstance(spec, JobSpec)
            jid = next_id(state, base, r)
            submit = _submit(state, spec, jid, now, r, minimum, f"{w.kind.short}/{name}")
            if isinstance(submit, str):
                actions.append(Refuse(ns, name, w.kind.kind, uid, submit))
                break
            generation = str(meta.get("generation", ""))  # a forgotten id that comes again is a new event
            events.append((submit, stable_id("k8s-serving-submitted", cluster, uid, jid, generation)))
        actions += _pods(w, jobs, desired, cluster)
    for (ns, workload), gone in sorted(live.items()):  # no longer listed (deleted, or its label removed)
        for _, job in sorted(gone.items()):
            events.append(_cancel(job.id, now, f"{workload} in namespace {ns} is gone", cluster))
    return events, actions


def _scale(w: Workload, spec: JobSpec | str) -> tuple[int, int, str | None]:
    """(replicas wanted, replicas guaranteed, why it is refused): a refused workload is scaled to 0."""
    if isinstance(spec, str):
        return 0, 0, spec
    try:
        return w.kind.replicas(w.obj), w.kind.min_replicas(w.obj), None
    except WorkloadError as exc:
        return 0, 0, str(exc)


def _submit(
    state: SchedulerState, spec: JobSpec, jid: str, now: float, replica: int, minimum: int, workload: str
) -> Event | str:
    """One replica's JobSubmitted through the door of `chamber submit` (as high: the door keeps class
    serving to replicas), then made a replica: class serving, preemptible above the minimum."""
    submit = through_the_door(state, msgspec.structs.replace(spec, priority=PriorityClass.HIGH), jid, now)
    if isinstance(submit, str):
        return submit
    spec = msgspec.structs.replace(
        submit.spec,
        priority=PriorityClass.SERVING,
        preemptible=replica >= minimum,
        serving=ServingReplica(workload=workload, replica=replica),
    )
    return msgspec.structs.replace(submit, spec=spec)


def _cancel(jid: str, now: float, why: str, cluster: str) -> tuple[Event, str]:
    event = JobCancelled(job_id=jid, at=now, by="kubernetes", reason=why)
    return event, stable_id("k8s-serving-cancelled", cluster, jid)


def _pods(w: Workload, jobs: dict[int, Job], desired: int, cluster: str) -> list[Admit | DeletePod | Refuse]:
    """Release the pods of admitted replicas, delete those of preempted ones. A Deployment's pods get
    their replica as they are released: the gated ones go to admitted replicas without a pod, lowest
    replica first. A released pod of a replica no longer wanted is deleted too: its controller removes
    it anyway, unless it removed another replica's pod instead (a ReplicaSet deletes a pod that is not
    ready before a ready one, whatever its deletion cost); then this pod must not run on GPUs the
    cancelled replica gave back, and the pod made in its place is released for the replica left without one."""
    out: list[Admit | DeletePod | Refuse] = []
    name = w.obj["metadata"]["name"]
    bound: dict[int, list[dict[str, Any]]] = {}
    unbound: list[dict[str, Any]] = []
    for pod in w.pods:
        if _GATE.finished(pod) is not None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        r = w.kind.replica_of(pod, name)
        if r is None:
            if _GATE.held(pod):
                unbound.append(pod)
            continue
        bound.setdefault(r, []).append(pod)
    running = {r: j for r, j in jobs.items() if j.state == JobState.RUNNING}
    waiting = sorted(r for r in running if r not in bound)
    for pod in unbound:
        if not waiting:
            break
        r = waiting.pop(0)
        out.append(_release(w, pod, running[r], r, cluster))
    for r, pods in sorted(bound.items()):
        job = jobs.get(r)
        for pod in pods:
            if job is not None and job.state == JobState.RUNNING and _GATE.held(pod):
                out.append(_release(w, pod, job, r, cluster))
            elif job is not None and job.state != JobState.RUNNING and job.ran_before and not _GATE.held(pod):
                why = job.reason or f"replica {r} was preempted"
                out.append(DeletePod(pod["metadata"]["namespace"], pod["metadata"]["name"], why))
            elif job is None and r >= desired and not _GATE.held(pod):
                why = f"replica {r} is no longer wanted ({desired} replicas)"
                out.append(DeletePod(pod["metadata"]["namespace"], pod["metadata"]["name"], why))
    return out


def _release(w: Workload, pod: dict[str, Any], job: Job | None, replica: int, cluster: str) -> Admit:
    """Lift the pod's gate, pinned to the replica's nodes (no job: a pod without GPUs, not pinned)."""
    if job is None:
        return Admit(pod["metadata"]["namespace"], pod["metadata"]["name"], (), "Pod", tuple(_GATE.admit_ops(pod, ())))
    nodes = tuple(sorted({p.node for p in job.placements if p.cluster == cluster}))
    ops = [*release_ops(w.kind, pod, replica), *_GATE.admit_ops(pod, nodes)]
    return Admit(pod["metadata"]["namespace"], pod["metadata"]["name"], nodes, "Pod", tuple(ops))
