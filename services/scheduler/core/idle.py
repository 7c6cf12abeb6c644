"""Idle reclaim, the scheduler's part: a JobIdleDetected whose team policy says `suspend` makes the next
cycle preempt the job (reason `idle`, the usual JobPreempted + JobSuspended, so a Kubernetes workload
is suspended and checkpoints as for any preemption). A job suspended so stays suspended (its GPUs go to
others) until its owner asks for it again (JobResumeRequested, `chamber resume JOB`); it then queues
and resumes as any suspended job does. The verdicts come from the idle decider (services/idle). A
serving replica is only flagged: its workload scales (services/scheduler/serving.py).

Pure, like the rest of the core: folds set facts, the cycle reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from events import PreemptionReason
from events.idle import IdleModeName, JobIdleDetected, JobResumeRequested

if TYPE_CHECKING:
    from services.scheduler.core.state import Job, SchedulerState


@dataclass
class IdleReclaim:
    generation: int  # the run of the job the verdict is about: a later run is not reclaimed for it
    detail: str
    suspend: bool  # False: its team's policy is notify (a flag in `chamber explain`, nothing else)


def fold_idle_detected(s: SchedulerState, e: JobIdleDetected) -> None:
    from services.scheduler.core.state import JobState  # state imports this module

    job = s.jobs.get(e.job_id)
    if job is None or job.state != JobState.RUNNING:
        return
    for jid in [j for j in s.idle_reclaim if j not in s.jobs]:  # jobs that left memory since
        del s.idle_reclaim[jid]
    idle_min = max(0.0, e.at - e.idle_since) / 60.0
    why = e.reason or f"idle for {idle_min:.0f} min"
    if job.spec.serving is not None:  # scaled by its autoscaler (to zero: its quota returns at once)
        detail = f"flagged idle ({why}); a serving replica keeps its GPUs: scale its workload down instead"
        s.idle_reclaim[e.job_id] = IdleReclaim(job.generation, detail, suspend=False)
        return
    if e.action != IdleModeName.SUSPEND:
        detail = f"flagged idle ({why}); its team's idle policy is notify: it keeps its GPUs"
        s.idle_reclaim[e.job_id] = IdleReclaim(job.generation, detail, suspend=False)
        return
    detail = f"suspended as idle ({why}); resume it with `chamber resume {e.job_id}`"
    s.idle_reclaim[e.job_id] = IdleReclaim(job.generation, detail, suspend=True)
    s.capacity_epoch += 1  # the next cycle is full: it preempts the job


def fold_resume_requested(s: SchedulerState, e: JobResumeRequested) -> None:
    if s.idle_reclaim.pop(e.job_id, None) is not None:
        s.capacity_epoch += 1  # it may start again: the next cycle looks at it


def due(s: SchedulerState) -> list[tuple[Job, IdleReclaim]]:
    """Running jobs an idle verdict says to suspend now (their run is the one the verdict saw)."""
    from services.scheduler.core.state import JobState

    out = []
    for jid, mark in sorted(s.idle_reclaim.items()):
        job = s.jobs.get(jid)
        if mark.suspend and job is not None and job.state == JobState.RUNNING and job.generation == mark.generation:
            out.append((job, mark))
    return out


def held(s: SchedulerState, job: Job) -> str | None:
    """Why a job suspended as idle does not resume on its own."""
    mark = s.idle_reclaim.get(job.id)
    if mark is None or not mark.suspend or job.preempt_reason != PreemptionReason.IDLE.value:
        return None
    return mark.detail


def flag(s: SchedulerState, job: Job) -> str | None:
    """For `chamber explain`: the notify flag of the job's current run, if any."""
    mark = s.idle_reclaim.get(job.id)
    if mark is None or mark.suspend or mark.generation != job.generation:
        return None
    return mark.detail
