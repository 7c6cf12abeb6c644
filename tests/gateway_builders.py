"""Builders for the gateway's scenarios: a small fleet, jobs on it, teams with quotas and costs.

Shared by the unit tests (folding events into the core) and the integration and browser tests
(publishing the same events to a real nats-server, as the other services would).
"""

from __future__ import annotations

from events import (
    CostAccrued,
    Event,
    GpuFaultDetected,
    GpuSample,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeDiscovered,
    NodeInventory,
    NodeIsolated,
    NodeSample,
    Placement,
    PriceSet,
    TeamQuotaSet,
)
from events.faults import FaultKind, Severity
from events.jobs import PriorityClass
from events.telemetry import GpuInfo

T0 = 1_800_000_000.0
CLUSTER = "local"


def gpu_infos(node: str, gpus: int = 8, model: str = "H100-80GB") -> list[GpuInfo]:
    return [GpuInfo(index=i, uuid=f"GPU-{node}-{i}", model=model, memory_total_mib=81_559.0) for i in range(gpus)]


def a_node_inventory(node: str, *, gpus: int = 8, model: str = "H100-80GB", at: float = T0) -> NodeInventory:
    return NodeInventory(cluster=CLUSTER, node=node, observed_at=at, gpus=gpu_infos(node, gpus, model), simulated=True)


def a_node_discovered(node: str, *, gpus: int = 8, model: str = "H100-80GB", at: float = T0) -> NodeDiscovered:
    return NodeDiscovered(cluster=CLUSTER, node=node, at=at, gpus=gpu_infos(node, gpus, model))


def a_sample(node: str, utils: list[float], *, seq: int = 1, at: float = T0 + 1) -> NodeSample:
    return NodeSample(
        cluster=CLUSTER,
        node=node,
        seq=seq,
        observed_at=at,
        interval_s=1.0,
        gpus=[
            GpuSample(index=i, uuid=f"GPU-{node}-{i}", utilization_pct=u, temperature_c=60.0, memory_used_mib=1000.0)
            for i, u in enumerate(utils)
        ],
    )


def a_submitted(
    job_id: str,
    *,
    team: str = "vision",
    gpus: int = 4,
    replicas: int = 1,
    priority: PriorityClass = PriorityClass.NORMAL,
    model: str | None = None,
    at: float = T0 + 2,
) -> JobSubmitted:
    spec = JobSpec(team=team, gpus_per_replica=gpus, replicas=replicas, priority=priority, gpu_model=model, name=job_id)
    return JobSubmitted(job_id=job_id, at=at, spec=spec)


def a_scheduled(
    job_id: str, node: str, indices: list[int], *, team: str = "vision", at: float = T0 + 3
) -> JobScheduled:
    return JobScheduled(
        job_id=job_id,
        at=at,
        team=team,
        placements=[Placement(cluster=CLUSTER, node=node, gpu_indices=indices)],
        reason="fits on one node",
    )


def a_started(job_id: str, *, at: float = T0 + 4) -> JobStarted:
    return JobStarted(job_id=job_id, at=at)


def a_quota(team: str, guaranteed: int, *, pool: str = "default", at: float = T0) -> TeamQuotaSet:
    return TeamQuotaSet(team=team, pool=pool, at=at, guaranteed_gpus=guaranteed)


def a_price(model: str = "H100-80GB", price: float = 2.5, *, at: float = T0) -> PriceSet:
    return PriceSet(gpu_model=model, at=at, price_per_gpu_hour=price)


def a_cost(team: str | None, cost: float, *, gpu_seconds: float = 3600.0, at: float = T0 + 60) -> CostAccrued:
    return CostAccrued(
        period_start=at - 60,
        period_end=at,
        gpu_model="H100-80GB",
        gpu_seconds=gpu_seconds,
        cost=cost,
        team=team,
        idle=team is None,
    )


def a_fault(node: str, gpu: int | None = 3, *, at: float = T0 + 10, xid: int = 79) -> GpuFaultDetected:
    return GpuFaultDetected(
        fault_id=f"f-{node}-{gpu}-{at}",
        cluster=CLUSTER,
        node=node,
        kind=FaultKind.XID,
        severity=Severity.CRITICAL,
        observed_at=at,
        gpu_index=gpu,
        xid=xid,
        detail="GPU has fallen off the bus",
    )


def an_isolation(node: str, *, at: float = T0 + 11, reason: str = "xid 79") -> NodeIsolated:
    return NodeIsolated(cluster=CLUSTER, node=node, at=at, reason=reason, fault_ids=[f"f-{node}-3-{T0 + 10}"])


def a_scripted_fleet() -> list[Event]:
    """Three 8-GPU nodes; vision runs 8 GPUs on n1 and 4 on n2, nlp 2 on n2; n3 is isolated; one job waits.

    Counts: total 24, isolated 8, in service 16, allocated 14, idle 2, queue depth 1.
    Utilization on allocated GPUs: n1 8 x 90 %, n2 4 x 50 % + 2 x 100 % -> busy 7.2 + 2.0 + 2.0 = 11.2.
    """
    events: list[Event] = [a_price(), a_quota("vision", 8), a_quota("nlp", 4), a_quota("speech", 4)]
    for n in ("n1", "n2", "n3"):
        events += [a_node_inventory(n), a_node_discovered(n)]
    events += [
        a_sample("n1", [90.0] * 8),
        a_sample("n2", [50.0] * 4 + [100.0] * 2 + [0.0] * 2),
        a_sample("n3", [0.0] * 8),
        a_submitted("train-llm", team="vision", gpus=8),
        a_scheduled("train-llm", "n1", list(range(8))),
        a_started("train-llm"),
        a_submitted("finetune", team="vision", gpus=4),
        a_scheduled("finetune", "n2", [0, 1, 2, 3]),
        a_started("finetune"),
        a_submitted("embed", team="nlp", gpus=2),
        a_scheduled("embed", "n2", [4, 5], team="nlp"),
        a_started("embed"),
        a_submitted("big-sweep", team="speech", gpus=8, at=T0 + 5),
        a_fault("n3"),
        an_isolation("n3"),
        a_cost("vision", 30.0, gpu_seconds=12 * 3600.0),
        a_cost("nlp", 5.0, gpu_seconds=2 * 3600.0),
        a_cost(None, 4.0, gpu_seconds=1.6 * 3600.0),
    ]
    return events
