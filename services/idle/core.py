"""Idle reclaim: decide, per job, whether it holds GPUs while doing nothing.

Pure: `evolve(state, event)` folds JOBS (placements, team, end) and TELEMETRY (NodeSample GPU
activity and memory, FabricSample NCCL communicator progress); `decide(state, now)` returns the
verdicts due at `now`. No clock, no I/O: time comes from the events and from the caller.

A job is idle when, on every GPU it holds, SM activity (DCGM's, else NVML utilization) stayed below
the team's threshold, its used memory did not move by more than a tolerance, and none of its NCCL
communicators completed a collective, for `idle_minutes` in a row. Any one sign of work resets the
clock, so a bursty job with gaps shorter than `idle_minutes` is never flagged. A job in its first
`grace_minutes`, or whose collectives progressed within the window, is never flagged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from events.base import Event
from events.fabric import FabricSample
from events.idle import IdleModeName, IdlePolicySet, JobIdleDetected
from events.jobs import (
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobSuspended,
)
from events.telemetry import NodeSample

NodeKey = tuple[str, str]
STALE_S = 300.0  # no sample of a job for this long: its telemetry stopped, no verdict until it resumes


class IdleMode(StrEnum):
    OFF = "off"
    NOTIFY = "notify"  # flag it (dashboard, event); the job keeps its GPUs
    SUSPEND = "suspend"  # checkpoint and suspend it, as a preemption its owner can resume


@dataclass(frozen=True, kw_only=True)
class IdlePolicy:
    mode: IdleMode = IdleMode.OFF
    sm_below_pct: float = 5.0
    memory_tolerance_mib: float = 64.0  # allocator noise below this is not "memory changed"
    idle_minutes: float = 30.0
    grace_minutes: float = 15.0

    def __post_init__(self) -> None:
        if not 0.0 < self.sm_below_pct <= 100.0:
            raise ValueError(f"sm_below_pct must be in (0, 100], got {self.sm_below_pct}")
        if self.idle_minutes <= 0 or self.grace_minutes < 0 or self.memory_tolerance_mib < 0:
            raise ValueError("idle_minutes must be > 0; grace_minutes and memory_tolerance_mib >= 0")


@dataclass(frozen=True, kw_only=True)
class IdleVerdict:
    """What `decide` returns: `action` is the team's mode (notify or suspend) at the time."""

    job_id: str
    team: str
    action: IdleMode
    idle_since: float
    at: float
    gpus: int


@dataclass
class _Job:
    team: str
    started: float
    placements: dict[NodeKey, tuple[int, ...]]
    last_work: float  # the last time any sign of work was seen (starts at the job's start)
    last_collective: float | None = None
    memory: dict[tuple[NodeKey, int], float] = field(default_factory=dict)
    ops: dict[tuple[NodeKey, str], int] = field(default_factory=dict)
    flagged: bool = False
    # Telemetry seen for it by this process: the first and the latest sample. A job is judged only on
    # what was watched (a restart replays no telemetry: a job is not idle for lack of samples), and
    # not while its samples stopped coming (an agent away says nothing about the job).
    watched_since: float | None = None
    last_sample: float | None = None

    @property
    def gpus(self) -> int:
        return sum(len(g) for g in self.placements.values())


@dataclass
class IdleState:
    policies: dict[str, IdlePolicy] = field(default_factory=dict)  # by team; missing: default (off)
    default: IdlePolicy = field(default_factory=IdlePolicy)
    jobs: dict[str, _Job] = field(default_factory=dict)
    node_jobs: dict[NodeKey, set[str]] = field(default_factory=dict)

    def policy(self, team: str) -> IdlePolicy:
        return self.policies.get(team, self.default)


def evolve(state: IdleState, event: Event) -> IdleState:
    """Fold one event in (mutates and returns `state`)."""
    match event:
        case JobScheduled():
            _track(state, event.job_id, event.team, event.at, event.placements)
        case JobResumed():
            prev = state.jobs.get(event.job_id)
            if prev is not None:  # a resume restarts the grace period: it is reloading its state
                _track(state, event.job_id, prev.team, event.at, event.placements)
        case JobPreempted() | JobSuspended() | JobRequeued() | JobCompleted() | JobFailed() | JobCancelled():
            _untrack(state, event.job_id, keep=isinstance(event, JobPreempted | JobSuspended | JobRequeued))
        case IdlePolicySet():
            state.policies[event.team] = policy_of(event)
        case JobIdleDetected():
            if (job := state.jobs.get(event.job_id)) is not None:
                job.flagged = True  # decided before (by this or another replica): one verdict per run
        case NodeSample():
            _on_node_sample(state, event)
        case FabricSample():
            _on_fabric(state, event)
    return state


def policy_of(e: IdlePolicySet) -> IdlePolicy:
    return IdlePolicy(
        mode=IdleMode(e.mode),
        sm_below_pct=e.sm_below_pct,
        memory_tolerance_mib=e.memory_tolerance_mib,
        idle_minutes=e.idle_minutes,
        grace_minutes=e.grace_minutes,
    )


def _fresh(job: _Job, now: float, window: float) -> bool:
    return job.last_sample is not None and now - job.last_sample <= min(STALE_S, window)


def _track(state: IdleState, job_id: str, team: str, at: float, placements: list) -> None:
    _untrack(state, job_id, keep=False)
    where = {(p.cluster, p.node): tuple(sorted(p.gpu_indices)) for p in placements}
    state.jobs[job_id] = _Job(team=team, started=at, placements=where, last_work=at)
    for key in where:
        state.node_jobs.setdefault(key, set()).add(job_id)


def _untrack(state: IdleState, job_id: str, *, keep: bool) -> None:
    job = state.jobs.get(job_id)
    if job is None:
        return
    for key in job.placements:
        state.node_jobs.get(key, set()).discard(job_id)
    if keep:
        job.placements = {}  # off its GPUs; remembered (team) so a resume can re-track it
        job.flagged = True  # nothing to reclaim while it holds nothing
    else:
        del state.jobs[job_id]


def _on_node_sample(state: IdleState, s: NodeSample) -> None:
    key = (s.cluster, s.node)
    by_index = {g.index: g for g in s.gpus}
    for job_id in state.node_jobs.get(key, ()):
        job = state.jobs[job_id]
        threshold = state.policy(job.team).sm_below_pct
        tolerance = state.policy(job.team).memory_tolerance_mib
        _watched(job, s.observed_at)
        for idx in job.placements.get(key, ()):
            g = by_index.get(idx)
            if g is None:
                continue
            activity = g.sm_activity_pct if g.sm_activity_pct is not None else g.utilization_pct
            worked = activity is not None and activity >= threshold
            if g.memory_used_mib is not None:
                prev = job.memory.get((key, idx))
                if prev is not None and abs(g.memory_used_mib - prev) > tolerance:
                    worked = True
                if prev is None or worked:
                    job.memory[(key, idx)] = g.memory_used_mib
            if worked:
                job.last_work = max(job.last_work, s.observed_at)


def _on_fabric(state: IdleState, s: FabricSample) -> None:
    key = (s.cluster, s.node)
    here = state.node_jobs.get(key, set())
    for c in s.comms:
        # RAS may not know the job; on a node with one tracked job, its communicators are that job's
        job_id = c.job if c.job is not None else (next(iter(here)) if len(here) == 1 else None)
        if job_id is None or job_id not in here or c.ops < 0:  # ops < 0: RAS text without counts
            continue
        job = state.jobs[job_id]
        _watched(job, s.observed_at)
        prev = job.ops.get((key, c.comm))
        job.ops[(key, c.comm)] = c.ops
        if prev is not None and c.ops > prev:
            job.last_collective = s.observed_at
            job.last_work = max(job.last_work, s.observed_at)


def _watched(job: _Job, at: float) -> None:
    if job.watched_since is None:
        job.watched_since = at
    job.last_sample = max(job.last_sample or at, at)


def decide(state: IdleState, now: float) -> list[IdleVerdict]:
    """Verdicts due at `now`. Pure: a verdict marks its job flagged (one per run) only when it comes
    back from the log as the JobIdleDetected `event_of` makes of it (the host waits for it)."""
    out: list[IdleVerdict] = []
    for job_id in sorted(state.jobs):
        job = state.jobs[job_id]
        policy = state.policy(job.team)
        if job.flagged or not job.placements or policy.mode is IdleMode.OFF:
            continue
        if now - job.started < policy.grace_minutes * 60.0:
            continue
        window = policy.idle_minutes * 60.0
        if job.last_collective is not None and now - job.last_collective < window:
            continue  # collectives progressed: never idle, whatever the SM counters say
        if now - job.last_work < window:
            continue
        if job.watched_since is None or now - job.watched_since < window or not _fresh(job, now, window):
            continue  # not watched for a whole window, or its samples stopped: no evidence of idleness
        out.append(
            IdleVerdict(
                job_id=job_id,
                team=job.team,
                action=policy.mode,
                idle_since=max(job.last_work, job.watched_since),  # what was seen of it, not before
                at=now,
                gpus=job.gpus,
            )
        )
    return out


def event_of(v: IdleVerdict) -> JobIdleDetected:
    """The event a verdict is published as (and folded back from)."""
    idle_for = (v.at - v.idle_since) / 60.0
    return JobIdleDetected(
        job_id=v.job_id,
        at=v.at,
        team=v.team,
        action=IdleModeName(v.action.value),
        idle_since=v.idle_since,
        gpus=v.gpus,
        reason=f"no SM activity, memory change or collective progress on its {v.gpus} GPU(s) for {idle_for:.0f} min",
    )
