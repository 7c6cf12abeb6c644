"""GPU-hours given back by idle reclaim, per team: from the moment a job suspended as idle released its
GPUs (JobPreempted, reason `idle`) until its owner had it back (JobResumed / JobScheduled) or it ended,
its GPUs times that time. Counted in the month the interval started (UTC); an open interval counts up
to `now`. Pure: folded by the billing core, answered by `chamber.cmd.billing.reclaimed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from events import (
    Event,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobResumed,
    JobScheduled,
    PreemptionReason,
)
from events.idle import JobIdleDetected


@dataclass
class Reclaimed:
    gpus: dict[str, tuple[str, int]] = field(default_factory=dict)  # job -> (team, GPUs) from its idle verdict
    open: dict[str, tuple[str, int, float]] = field(default_factory=dict)  # job -> (team, GPUs, since)
    hours: dict[tuple[str, str], float] = field(default_factory=dict)  # (team, month) -> closed GPU-hours


def month_of(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m")


def fold(r: Reclaimed, event: Event) -> None:
    match event:
        case JobIdleDetected():
            r.gpus[event.job_id] = (event.team, event.gpus)
        case JobPreempted() if event.reason is PreemptionReason.IDLE:
            team, gpus = r.gpus.pop(event.job_id, (event.team, 0))
            if gpus:
                r.open[event.job_id] = (team, gpus, event.at)
        case JobResumed() | JobScheduled() | JobCompleted() | JobFailed() | JobCancelled():
            r.gpus.pop(event.job_id, None)
            if (held := r.open.pop(event.job_id, None)) is not None:
                team, gpus, since = held
                key = (team, month_of(since))
                r.hours[key] = r.hours.get(key, 0.0) + gpus * max(0.0, event.at - since) / 3600.0


def by_team(r: Reclaimed, now: float, month: str | None = None) -> dict[str, float]:
    """GPU-hours reclaimed per team (in `month`, "YYYY-MM", or ever), open intervals up to `now`."""
    out: dict[str, float] = {}
    for (team, m), hours in r.hours.items():
        if month is None or m == month:
            out[team] = out.get(team, 0.0) + hours
    for team, gpus, since in r.open.values():
        if month is None or month_of(since) == month:
            out[team] = out.get(team, 0.0) + gpus * max(0.0, now - since) / 3600.0
    return {team: round(hours, 3) for team, hours in sorted(out.items())}
