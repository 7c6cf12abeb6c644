"""Builders for the gateway's scenarios: a small fleet, jobs on it, teams with quotas and costs.

Shared by the unit tests (folding events into the core) and the integration and browser tests
(publishing the same events to a real nats-server, as the other services would).
"""

from __future__ import annotations

import random

from events import (
    CostAccrued,
    Event,
    GpuFaultDetected,
    GpuIsolated,
    GpuRestored,
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
        pool="default",
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


def a_demo_fleet(
    nodes: int = 16, gpus: int = 8, *, seed: int = 7, t0: float = T0
) -> tuple[list[Event], list[list[Event]]]:
    """A fleet that looks like a busy afternoon: three teams, jobs packed on nodes, a queue, one node
    isolated after a fault, costs accrued. Returns (setup events, waves of samples to publish over time).

    Deterministic for a seed; the tests compute what to expect by folding the same events.
    """
    rng = random.Random(seed)
    names = [f"gpu-{i:02d}" for i in range(nodes)]
    events: list[Event] = [
        a_price(at=t0),
        a_quota("vision", 48, at=t0),
        a_quota("nlp", 40, at=t0),
        a_quota("speech", 24, at=t0),
    ]
    for n in names:
        events += [a_node_inventory(n, gpus=gpus, at=t0), a_node_discovered(n, gpus=gpus, at=t0)]
    teams = ["vision", "nlp", "speech", "vision", "nlp"]
    busy: dict[tuple[str, int], float] = {}
    k = 0
    for ni, n in enumerate(names[:-2]):  # the last two nodes: one idle, one isolated
        free = list(range(gpus))
        while free and rng.random() < 0.9:
            size = min(len(free), rng.choice([1, 2, 4, 8]))
            taken, free = free[:size], free[size:]
            team = teams[(ni + k) % len(teams)]
            job = f"{team}-{['train', 'finetune', 'eval', 'sweep'][k % 4]}-{k:03d}"
            k += 1
            events += [
                a_submitted(job, team=team, gpus=size, at=t0 + 30 * k),
                a_scheduled(job, n, taken, team=team, at=t0 + 30 * k + 5),
                a_started(job, at=t0 + 30 * k + 20),
            ]
            level = rng.uniform(55, 98) if k != 6 else 1.0  # one job holds its GPUs and does nothing
            for i in taken:
                busy[(n, i)] = level
    waiting = [("speech", 16, PriorityClass.HIGH), ("nlp", 8, PriorityClass.NORMAL), ("vision", 32, PriorityClass.LOW)]
    for i, (team, size, prio) in enumerate(waiting):
        events.append(a_submitted(f"{team}-queued-{i}", team=team, gpus=size, priority=prio, at=t0 + 2400 + 300 * i))
    bad = names[-1]
    events += [a_fault(bad, 3, at=t0 + 1800), an_isolation(bad, at=t0 + 1801)]
    flaky = names[2]  # an earlier thermal episode on one GPU, isolated for a while and restored
    events += [
        GpuIsolated(cluster=CLUSTER, node=flaky, gpu_index=5, at=t0 + 900, reason="thermal: 94 C sustained"),
        GpuRestored(cluster=CLUSTER, node=flaky, gpu_index=5, at=t0 + 1500, reason="probation passed"),
    ]
    at = t0 + 3000
    events += [
        a_cost("vision", 412.5, gpu_seconds=165 * 3600, at=at),
        a_cost("nlp", 301.25, gpu_seconds=120.5 * 3600, at=at),
        a_cost("speech", 96.0, gpu_seconds=38.4 * 3600, at=at),
        a_cost(None, 58.0, gpu_seconds=23.2 * 3600, at=at),
    ]
    waves: list[list[Event]] = []
    for w in range(6):
        wave: list[Event] = []
        for n in names:
            utils = [_jitter(busy[(n, i)], rng) if (n, i) in busy else rng.uniform(0, 3) for i in range(gpus)]
            wave.append(a_sample(n, utils, seq=w + 2, at=t0 + 3300 + w))
        waves.append(wave)
    return events, waves


def _jitter(level: float, rng: random.Random) -> float:
    return level if level < 5 else max(0.0, min(100.0, level + rng.uniform(-12, 8)))
