"""What a scheduling cycle decides, and the events those decisions become."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec

from events import (
    Event,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobSuspended,
    Placement,
    PreemptionReason,
)
from events.codec import stable_id
from events.fleet import MigLayoutPlanned


# A msgspec Struct, not a dataclass: a full cycle makes one per admission (82,000 at 50,000 nodes),
# and a frozen dataclass's __init__ (object.__setattr__ per field) cost ~1 us each, this ~0.06 us.
# The same fields, repr, equality and hash. gc=False: it holds strings, numbers and a tuple of
# placements (untracked themselves), so it can never be part of a reference cycle.
class Admit(msgspec.Struct, frozen=True, gc=False):
    job_id: str
    team: str
    placements: tuple[Placement, ...]
    borrowed_gpus: float
    reason: str
    resume: bool  # the job ran before (suspended or requeued): it resumes from its checkpoint
    generation: int
    pool: str = ""  # the pool it is admitted in, carried by the event


@dataclass(frozen=True)
class Preempt:
    job_id: str
    team: str
    reason: PreemptionReason
    preemptor: str
    lost_work_gpu_s: float
    detail: str
    generation: int


@dataclass(frozen=True)
class Requeue:
    job_id: str
    reason: str
    node: str | None
    generation: int
    fault_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanLayout:
    """A new MIG layout for one GPU (core/mig_live.py): published as its `MigLayoutPlanned`."""

    event: MigLayoutPlanned


Decision = Admit | Preempt | Requeue | PlanLayout


@dataclass(frozen=True)
class Reservation:
    """EASY backfill: the first job blocked for capacity in a pool, and when it should start."""

    job_id: str
    key: tuple[int, float, float, str]
    gpus: float
    shadow_at: float  # estimated time enough GPUs are free for it
    extra_gpus: float  # GPUs free at shadow time beyond what it needs: later jobs may use them


@dataclass(frozen=True)
class Drain:
    """A node held for a protected whole-node job no node has room for: while it waits, only critical
    work and jobs that end (by estimates) before `ready_at` start there, so the node drains for it."""

    job_id: str
    node: int  # node id (the capacity index's)
    ready_at: float  # when its running work ends, by estimates


@dataclass(frozen=True)
class CycleMark:
    """Where a cycle left off: the next one is incremental if capacity and rules did not change."""

    capacity_epoch: int
    pending_seq: int
    reservations: tuple[tuple[str, Reservation], ...] = ()
    guard_at: float = math.inf  # when the next queued job becomes protected: the cycle then is full
    # pool -> the first protected job waiting there for capacity: jobs not yet protected start in that
    # pool only by preemption (kept for incremental cycles, which do not look at old jobs)
    starving: tuple[tuple[str, str], ...] = ()
    # running jobs left on degraded hardware (no healthy place then), with the faults behind it: the
    # next cycle need not be full for them unless capacity frees or their hardware's state changes
    staying: tuple[tuple[str, tuple[str, ...]], ...] = ()
    draining: tuple[tuple[str, Drain], ...] = ()  # pool -> the node held for its protected whole-node job


@dataclass
class Cycle:
    decisions: list[Decision]
    waiting: dict[str, str]  # job id -> why it still waits (only the jobs this cycle looked at)
    mark: CycleMark
    full: bool
    considered: int = 0
    reservations: dict[str, Reservation] = field(default_factory=dict)
    staying: dict[str, str] = field(default_factory=dict)  # job id -> why it keeps running on degraded hardware


def events_for(decisions: list[Decision], now: float) -> list[tuple[Event, str]]:
    """Decision values -> (event, deterministic id). Ids hash the job and its generation, so a
    replayed scheduler that takes the same decision again is de-duplicated by JetStream."""
    out: list[tuple[Event, str]] = []
    for d in decisions:
        if isinstance(d, Admit):
            if d.resume:
                ev: Event = JobResumed(
                    job_id=d.job_id,
                    at=now,
                    placements=list(d.placements),
                    reason=d.reason,
                    borrowed_gpus=d.borrowed_gpus,
                    pool=d.pool,
                )
                out.append((ev, stable_id("resumed", d.job_id, d.generation)))
            else:
                ev = JobScheduled(
                    job_id=d.job_id,
                    at=now,
                    team=d.team,
                    placements=list(d.placements),
                    reason=d.reason,
                    borrowed_gpus=d.borrowed_gpus,
                    pool=d.pool,
                )
                out.append((ev, stable_id("scheduled", d.job_id, d.generation)))
        elif isinstance(d, Preempt):
            out.append(
                (
                    JobPreempted(
                        job_id=d.job_id,
                        at=now,
                        team=d.team,
                        reason=d.reason,
                        preemptor_job_id=d.preemptor or None,  # none for an idle job
                        lost_work_gpu_s=d.lost_work_gpu_s,
                        detail=d.detail,
                    ),
                    stable_id("preempted", d.job_id, d.generation),
                )
            )
            out.append(
                (
                    JobSuspended(job_id=d.job_id, at=now, reason=d.detail),
                    stable_id("suspended", d.job_id, d.generation),
                )
            )
        elif isinstance(d, PlanLayout):
            e = d.event
            out.append((e, stable_id("mig-planned", e.cluster, e.node, e.gpu_index, e.at)))
        else:
            out.append(
                (
                    JobRequeued(job_id=d.job_id, at=now, reason=d.reason, node=d.node, fault_ids=list(d.fault_ids)),
                    stable_id("requeued", d.job_id, d.generation),
                )
            )
    return out
