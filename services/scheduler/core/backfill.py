"""Cycle phases 3 and 5 (EASY backfill): a pool's first job blocked for capacity reserves the GPUs
it will get when running work ends (by runtime estimates); later jobs start only if they do not
delay it (they end before the reservation, or use only GPUs it leaves over)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from services.scheduler.core.decisions import Reservation
from services.scheduler.core.policy import Order, QueueKey
from services.scheduler.core.state import Job, estimate_s
from services.scheduler.core.work import Work
from services.timefmt import when


def check(res: Reservation | None, job: Job, key: QueueKey, now: float, order: Order) -> tuple[str | None, bool]:
    """May `job` start now next to the pool's reservation? (why not, or None; and whether it
    may only use the reserved job's leftover GPUs)."""
    if res is None or not order(res.key) < order(key):
        return None, False
    est = estimate_s(job)
    if est is not None and now + est <= res.shadow_at:
        return None, False  # ends before the reserved job starts
    if job.gpus > res.extra_gpus:
        return (
            f"backfill: would delay {res.job_id}, which has the GPUs reserved from about {when(res.shadow_at, now)}",
            False,
        )
    return None, True


def reservation(work: Work, job: Job, key: QueueKey) -> Reservation | None:
    """EASY backfill: when will enough GPUs be free for `job`, judging by runtime estimates?"""
    found = _enough(work, job, sorted(_ends(work, job.pool)))
    if found is None:
        return None  # running work has no estimates: nothing to reserve against
    shadow_at, extra = found
    return Reservation(job.id, key, job.gpus, shadow_at, extra)


def free_by(work: Work, job: Job, horizon: float) -> float | None:
    """When enough GPUs are free for `job` by runtime estimates, if that is at `horizon` or sooner;
    else None. Keeps only the ends before the horizon (no sort of all running work)."""
    found = _enough(work, job, sorted(end for end in _ends(work, job.pool, horizon) if end[0] <= horizon))
    return None if found is None else found[0]


def _enough(work: Work, job: Job, ends: list[tuple[float, int]]) -> tuple[float, int] | None:
    """The first of the (sorted) ends by which enough GPUs are free for `job`, and the GPUs left over."""
    free = work.cap.free_in(work.classes(job))
    for end, gpus in ends:
        free += gpus
        if free >= job.gpus:
            return end, free - job.gpus
    return None


def _ends(work: Work, pool: str, horizon: float = math.inf) -> Iterator[tuple[float, int]]:
    """(estimated end, GPUs) of the pool's running work with runtime estimates, in no order (an
    end already past counts as now); of what ran before this cycle, only ends up to `horizon`."""
    s, now, gone = work.s, work.now, work.gone
    for end, gpus, jid in s.running_ends(pool):
        if end > horizon:
            break  # sorted by end: the rest end later
        if jid not in gone:
            yield (max(now, end), gpus)
    for jid in work.fresh:
        r = s.jobs[jid]
        est = estimate_s(r)
        if est is not None and r.pool == pool:
            yield (now + est, r.gpus)
