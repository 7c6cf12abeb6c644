"""Builders and a tiny driver so scheduler tests read as scenarios: given events, when a cycle runs,
then these decisions. The driver folds the cycle's own events back, as the service does."""

from __future__ import annotations

from dataclasses import dataclass, field

from events import (
    Event,
    GpuInfo,
    GpuShare,
    JobCompleted,
    JobSpec,
    JobSubmitted,
    NodeDiscovered,
    PriorityClass,
    TeamQuotaSet,
)
from services.scheduler.core import Cycle, CycleMark, Policy, SchedulerState, events_for, evolve, schedule


def a_node(
    name: str,
    gpus: int = 8,
    *,
    cluster: str = "c1",
    model: str = "H100",
    at: float = 0.0,
    memory_mib: float | None = None,
    host_cpu: int | None = None,
    host_memory: int | None = None,
    **labels: str,
) -> NodeDiscovered:
    return NodeDiscovered(
        cluster=cluster,
        node=name,
        at=at,
        gpus=[
            GpuInfo(index=i, uuid=f"GPU-{cluster}-{name}-{i}", model=model, memory_total_mib=memory_mib)
            for i in range(gpus)
        ],
        labels=labels,
        cpu_milli=host_cpu,
        memory_mib=host_memory,
    )


def a_job(
    job_id: str,
    *,
    team: str = "vision",
    gpus: int = 8,
    replicas: int = 1,
    priority: str = "normal",
    at: float = 1.0,
    preemptible: bool = True,
    estimate: float | None = None,
    checkpoint: float | None = None,
    model: str | None = None,
    pool: str | None = None,
    cluster: str | None = None,
    share: GpuShare | None = None,
    cpu: int | None = None,
    memory: int | None = None,
) -> JobSubmitted:
    return JobSubmitted(
        job_id=job_id,
        at=at,
        spec=JobSpec(
            team=team,
            gpus_per_replica=gpus,
            replicas=replicas,
            priority=PriorityClass(priority),
            preemptible=preemptible,
            expected_duration_s=estimate,
            checkpoint_interval_s=checkpoint,
            gpu_model=model,
            pool=pool,
            cluster=cluster,
            name=job_id,
            share=share,
            cpu_milli=cpu,
            memory_mib=memory,
        ),
    )


def a_quota(
    team: str,
    gpus: int,
    *,
    pool: str = "default",
    borrow: int | None = None,
    lend: int | None = None,
    critical: bool = False,
    np_lend: int | None = None,
) -> TeamQuotaSet:
    return TeamQuotaSet(
        team=team,
        pool=pool,
        at=0.0,
        guaranteed_gpus=gpus,
        borrow_limit=borrow,
        lend_limit=lend,
        critical=critical,
        np_lend_limit=np_lend,
    )


def done(job_id: str, at: float = 100.0) -> JobCompleted:
    return JobCompleted(job_id=job_id, at=at)


@dataclass
class Driver:
    state: SchedulerState = field(default_factory=SchedulerState)
    mark: CycleMark | None = None
    log: list[Event] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)

    def given(self, *events: Event) -> Driver:
        for e in events:
            self.log.append(e)
            evolve(self.state, e)
        return self

    def cycle(self, now: float = 10.0, policy: Policy | None = None) -> Cycle:
        cycle = (
            schedule(self.state, now, self.mark) if policy is None else schedule(self.state, now, None, policy=policy)
        )
        self.mark = cycle.mark
        self.waiting.update(cycle.waiting)
        for event, _ in events_for(cycle.decisions, now):
            self.given(event)
        return cycle

    def where(self, job_id: str) -> dict[str, list[int]]:
        job = self.state.jobs[job_id]
        return {p.node: list(p.gpu_indices) for p in job.placements}

    def state_of(self, job_id: str) -> str:
        return self.state.jobs[job_id].state.value
