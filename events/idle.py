"""Idle reclaim: a team's idle policy (QUOTA) and the verdicts on jobs that hold GPUs doing nothing (JOBS)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from msgspec import Meta

from events.base import Event, Name, event_type
from events.names import Team, Text


class IdleModeName(StrEnum):
    OFF = "off"
    NOTIFY = "notify"  # flag it (dashboard, event); the job keeps its GPUs
    SUSPEND = "suspend"  # suspend it as a preemption its owner resumes (`chamber resume JOB`)


Percent = Annotated[float, Meta(gt=0, le=100)]
Minutes = Annotated[float, Meta(ge=0, le=7 * 24 * 60)]


class IdlePolicySet(Event, frozen=True, tag=event_type("quota", "idle_policy_set")):
    """A team's idle policy (docs/idle-reclaim.md): `off`, `notify` (flag the job) or `suspend` (suspend
    it as a preemption its owner resumes), and the thresholds that make a job idle."""

    team: Team
    at: float
    mode: IdleModeName = IdleModeName.OFF
    sm_below_pct: Percent = 5.0
    memory_tolerance_mib: Annotated[float, Meta(ge=0)] = 64.0
    idle_minutes: Annotated[float, Meta(gt=0, le=7 * 24 * 60)] = 30.0
    grace_minutes: Minutes = 15.0
    by: Text = ""


class JobIdleDetected(Event, frozen=True, tag=event_type("perf", "job_idle_detected")):
    """A running job held its GPUs idle for its team's `idle_minutes`. `action` is what its team's
    policy did about it: `notify` (a flag only) or `suspend` (the scheduler suspends it as a preemption;
    its owner resumes it with `chamber resume JOB`)."""

    job_id: Name
    at: float
    team: Team
    action: IdleModeName = IdleModeName.NOTIFY  # notify or suspend (never off: no verdict then)
    idle_since: float = 0.0
    gpus: int = 0
    reason: Text = ""


class JobResumeRequested(Event, frozen=True, tag=event_type("jobs", "job_resume_requested")):
    """The owner asks for a job suspended as idle to be queued again (it resumes when it fits)."""

    job_id: Name
    at: float
    by: Text = ""
