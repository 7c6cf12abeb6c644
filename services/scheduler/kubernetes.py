"""Kubernetes batch Jobs, the way Kueue does it: a Job labeled `chamber.io/team` and created with
`spec.suspend: true` is picked up as a Chamber job; admission writes node affinity for the chosen
nodes and unsuspends it; preemption suspends it again; the Job's completion or failure becomes a
job event. Each cluster's actuator acts only on its own cluster's Jobs.

`reconcile(...)` is pure and level-triggered (desired state from the scheduler's state, observed
state from one list of Jobs), so a missed or repeated round never leaves a Job wrong for long.
`KubernetesJobs` is the thin adapter over the real `kubernetes` client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from events import Event, JobCompleted, JobFailed, JobSpec, JobSubmitted, PriorityClass
from events.codec import stable_id
from events.names import InvalidName, normalize_team
from services.scheduler.core import FINISHED, JobState, SchedulerState

TEAM_LABEL = "chamber.io/team"
PRIORITY_LABEL = "chamber.io/priority"
PREEMPTIBLE_LABEL = "chamber.io/preemptible"
GPU_RESOURCE = "nvidia.com/gpu"
HOSTNAME_LABEL = "kubernetes.io/hostname"
# Set on a Job as it is suspended: the job should checkpoint now (its pods then get SIGTERM and their
# grace period: the job's own signal); it resumes from that checkpoint wherever it is placed next.
CHECKPOINT_ANNOTATION = "chamber.io/checkpoint-requested"


@dataclass(frozen=True)
class Admit:
    namespace: str
    name: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Suspend:
    namespace: str
    name: str
    reason: str = ""  # why (preempted, requeued off an isolated GPU or a slowdown culprit)


Action = Admit | Suspend


def job_id(cluster: str, namespace: str, name: str) -> str:
    return f"k8s-{cluster}-{namespace}-{name}"


def _gpus(pod_spec: dict[str, Any]) -> int:
    total = 0
    for container in pod_spec.get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        total += int(str(limits.get(GPU_RESOURCE, 0)))
    return total


def _finished(job: dict[str, Any]) -> str | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            return str(cond["type"])
    return None


def spec_of(job: dict[str, Any], cluster: str) -> JobSpec | None:
    """The Chamber job a labeled Kubernetes Job asks for; None if it is not one of ours or asks no GPU."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    team = labels.get(TEAM_LABEL)
    spec = job.get("spec") or {}
    gpus = _gpus(((spec.get("template") or {}).get("spec")) or {})
    if not team or gpus < 1:
        return None
    try:
        team = normalize_team(team)  # the one team rule: `Vision` is vision; `../..` is no team
    except InvalidName:
        return None
    try:
        priority = PriorityClass(labels.get(PRIORITY_LABEL, "normal"))
    except ValueError:
        priority = PriorityClass.NORMAL
    return JobSpec(
        team=team,
        gpus_per_replica=gpus,
        replicas=int(spec.get("parallelism") or 1),
        priority=priority,
        name=meta["name"],
        namespace=meta["namespace"],
        cluster=cluster,
        preemptible=labels.get(PREEMPTIBLE_LABEL, "true").lower() != "false",
    )


def reconcile(
    state: SchedulerState, jobs: list[dict[str, Any]], cluster: str, now: float
) -> tuple[list[tuple[Event, str]], list[Action]]:
    """Compare the scheduler's decisions with the cluster's Jobs: events to record, patches to make."""
    events: list[tuple[Event, str]] = []
    actions: list[Action] = []
    for job in sorted(jobs, key=lambda j: (j["metadata"]["namespace"], j["metadata"]["name"])):
        meta = job["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta.get("uid", "")
        jid = job_id(cluster, ns, name)
        known = state.jobs.get(jid)
        suspended = bool((job.get("spec") or {}).get("suspend"))
        done = _finished(job)
        if known is None:
            spec = spec_of(job, cluster)
            if spec is not None and suspended and done is None:
                events.append(
                    (JobSubmitted(job_id=jid, at=now, spec=spec), stable_id("k8s-submitted", cluster, uid, jid))
                )
            continue
        if known.state in FINISHED:
            if known.state == JobState.CANCELLED and not suspended and done is None:
                actions.append(Suspend(ns, name))
            continue
        if done == "Complete":
            events.append((JobCompleted(job_id=jid, at=now), stable_id("k8s-completed", cluster, uid, jid)))
        elif done == "Failed":
            event = JobFailed(job_id=jid, at=now, reason="the Kubernetes Job failed")
            events.append((event, stable_id("k8s-failed", cluster, uid, jid)))
        elif known.state == JobState.RUNNING and suspended:
            nodes = tuple(sorted({p.node for p in known.placements if p.cluster == cluster}))
            actions.append(Admit(ns, name, nodes))
        elif known.state != JobState.RUNNING and not suspended:
            actions.append(Suspend(ns, name, known.reason))
    return events, actions


class KubernetesJobs:
    """The adapter: list labeled Jobs, admit (affinity, then unsuspend), suspend."""

    def __init__(self, api: Any) -> None:
        self.api = api  # kubernetes.client.BatchV1Api

    def list(self) -> list[dict[str, Any]]:
        result = self.api.list_job_for_all_namespaces(label_selector=TEAM_LABEL)
        client = self.api.api_client
        return [client.sanitize_for_serialization(item) for item in result.items]

    def act(self, action: Action) -> None:
        if isinstance(action, Admit):
            # While the Job is suspended its pod template's scheduling directives may change
            # (Kubernetes >= 1.27): pin it to the chosen nodes first, then let it run.
            affinity = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": HOSTNAME_LABEL, "operator": "In", "values": list(action.nodes)}
                                ]
                            }
                        ]
                    }
                }
            }
            self.api.patch_namespaced_job(
                action.name, action.namespace, {"spec": {"template": {"spec": {"affinity": affinity}}}}
            )
            self.api.patch_namespaced_job(action.name, action.namespace, {"spec": {"suspend": False}})
        else:
            patch: dict[str, Any] = {"spec": {"suspend": True}}
            if action.reason:
                patch["metadata"] = {"annotations": {CHECKPOINT_ANNOTATION: action.reason[:1000]}}
            self.api.patch_namespaced_job(action.name, action.namespace, patch)
