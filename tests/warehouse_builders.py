"""Builders for warehouse and recorder scenarios: a fleet, its samples, and a job timeline."""

from __future__ import annotations

import time

from events import (
    GpuInfo,
    GpuSample,
    JobCompleted,
    JobPreempted,
    JobResumed,
    JobScheduled,
    JobSpec,
    JobSubmitted,
    NodeInventory,
    NodeSample,
    Placement,
    PreemptionReason,
    ServingReplica,
)

# An hour boundary a few hours ago: recent enough for the raw samples' TTL, fixed for the whole run.
T0 = float(int(time.time()) // 3600 * 3600 - 4 * 3600)


def an_inventory(
    node: str, *, gpus: int = 4, model: str = "H100-80GB", cluster: str = "c1", at: float = T0
) -> NodeInventory:
    return NodeInventory(
        cluster=cluster,
        node=node,
        observed_at=at,
        gpus=[GpuInfo(index=i, uuid=f"GPU-{node}-{i}", model=model) for i in range(gpus)],
    )


def a_sample(
    node: str, at: float, utils: list[float], *, seq: int = 0, interval_s: float = 10.0, cluster: str = "c1"
) -> NodeSample:
    return NodeSample(
        cluster=cluster,
        node=node,
        seq=seq,
        observed_at=at,
        interval_s=interval_s,
        gpus=[GpuSample(index=i, uuid=f"GPU-{node}-{i}", utilization_pct=u) for i, u in enumerate(utils)],
    )


def submitted(job: str, team: str, gpus: int, at: float, *, model: str | None = None) -> JobSubmitted:
    return JobSubmitted(job_id=job, at=at, spec=JobSpec(team=team, gpus_per_replica=gpus, gpu_model=model))


def a_serving_replica(job: str, replica: int, at: float, *, workload: str = "deployment/llm") -> JobSubmitted:
    """A replica of a serving workload in namespace ml of cluster c1 (services/scheduler/serving.py)."""
    spec = JobSpec(
        team="vision",
        gpus_per_replica=2,
        cluster="c1",
        namespace="ml",
        name=workload.split("/")[1],
        serving=ServingReplica(workload=workload, replica=replica),
    )
    return JobSubmitted(job_id=job, at=at, spec=spec)


def scheduled(job: str, team: str, node: str, indices: list[int], at: float, cluster: str = "c1") -> JobScheduled:
    return JobScheduled(
        job_id=job,
        at=at,
        team=team,
        placements=[Placement(cluster=cluster, node=node, gpu_indices=indices)],
        pool="default",
    )


def resumed(job: str, node: str, indices: list[int], at: float, cluster: str = "c1") -> JobResumed:
    return JobResumed(
        job_id=job, at=at, placements=[Placement(cluster=cluster, node=node, gpu_indices=indices)], pool="default"
    )


def preempted(job: str, team: str, at: float) -> JobPreempted:
    return JobPreempted(job_id=job, at=at, team=team, reason=PreemptionReason.PRIORITY)


def completed(job: str, at: float) -> JobCompleted:
    return JobCompleted(job_id=job, at=at)
