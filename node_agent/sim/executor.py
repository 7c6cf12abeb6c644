"""The simulated fleet as the job executor (the part a kubelet plays in a real cluster).

Pure core: `evolve(state, event)` folds JOBS events in; `decide(state, now)` says which jobs start and
which complete. It starts a job when a placement on one of its nodes arrives (JobScheduled or
JobResumed), and completes it once it has run `spec.sim_duration_s` seconds in total (running time
adds up across preemptions); a job without `sim_duration_s` runs until it is stopped. Times come from
the events, so replaying the JOBS stream gives the same decisions, and the deterministic message ids
let JetStream drop re-emitted ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from events.base import Event
from events.codec import stable_id
from events.jobs import (
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobStarted,
    JobSubmitted,
    JobSuspended,
)


@dataclass
class SimJob:
    duration_s: float | None = None
    placements: dict[str, tuple[int, ...]] = field(default_factory=dict)  # our nodes only
    running_since: float | None = None
    ran_s: float = 0.0
    start_pending: float | None = None  # the placement time of a start not yet reported
    done: bool = False


@dataclass
class ExecutorState:
    cluster: str
    nodes: frozenset[str]
    jobs: dict[str, SimJob] = field(default_factory=dict)
    version: int = 0  # bumped when GPU allocations change


def evolve(state: ExecutorState, event: Event) -> ExecutorState:
    """Fold one JOBS event in (mutates and returns `state`; never raises on a valid event)."""
    match event:
        case JobSubmitted():
            state.jobs.setdefault(event.job_id, SimJob()).duration_s = event.spec.sim_duration_s
        case JobScheduled() | JobResumed():
            job = state.jobs.setdefault(event.job_id, SimJob())
            ours = {
                p.node: tuple(p.gpu_indices)
                for p in event.placements
                if p.cluster == state.cluster and p.node in state.nodes
            }
            if job.done or not ours:
                return state
            _stop(job, event.at)
            job.placements = ours
            job.running_since = event.at
            job.start_pending = event.at
            state.version += 1
        case JobStarted():
            started = state.jobs.get(event.job_id)
            if started is not None and started.start_pending is not None and event.at >= started.start_pending:
                started.start_pending = None
        case JobPreempted() | JobSuspended() | JobRequeued():
            stopped = state.jobs.get(event.job_id)
            if stopped is not None and stopped.placements:
                _stop(stopped, event.at)
                state.version += 1
        case JobCancelled() | JobCompleted() | JobFailed():
            job = state.jobs.setdefault(event.job_id, SimJob())
            had = bool(job.placements)
            _stop(job, event.at)
            job.done = True
            job.start_pending = None
            if had:
                state.version += 1
    return state


def _stop(job: SimJob, at: float) -> None:
    if job.running_since is not None:
        job.ran_s += max(0.0, at - job.running_since)
    job.running_since = None
    job.start_pending = None
    job.placements = {}


def completes_at(job: SimJob) -> float | None:
    if job.duration_s is None or job.running_since is None:
        return None
    return job.running_since + max(0.0, job.duration_s - job.ran_s)


def decide(state: ExecutorState, now: float) -> list[tuple[Event, str]]:
    """Events to publish now, each with its deterministic message id. Fold them back in with
    `evolve` once published, so they are not decided twice. Sorted by job id (deterministic)."""
    out: list[tuple[Event, str]] = []
    for job_id in sorted(state.jobs):
        job = state.jobs[job_id]
        if job.done:
            continue
        if job.start_pending is not None:
            at = job.start_pending
            out.append((JobStarted(job_id=job_id, at=at), stable_id("sim-executor", "started", job_id, at)))
        due = completes_at(job)
        if due is not None and now >= due:
            out.append((JobCompleted(job_id=job_id, at=due), stable_id("sim-executor", "completed", job_id)))
    return out


def allocations(state: ExecutorState) -> dict[str, dict[int, str]]:
    """node -> GPU index -> job id, for the jobs running on our nodes."""
    out: dict[str, dict[int, str]] = {}
    for job_id, job in state.jobs.items():
        for node, gpus in job.placements.items():
            slot = out.setdefault(node, {})
            for i in gpus:
                slot[i] = job_id
    return out


def evolve_all(state: ExecutorState, events: Iterable[Event]) -> ExecutorState:
    for event in events:
        evolve(state, event)
    return state
