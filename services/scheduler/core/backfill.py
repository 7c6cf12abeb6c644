"""Cycle phases 3 and 5 (EASY backfill): a pool's first job blocked for capacity reserves the GPUs
it will get when running work ends (by runtime estimates); later jobs start only if they do not
delay it (they end before the reservation, or use only GPUs it leaves over)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from functools import lru_cache
from itertools import islice, takewhile

from events import PriorityClass
from services.scheduler.core.decisions import Drain, Reservation
from services.scheduler.core.policy import QueueKey
from services.scheduler.core.state import Job, estimate_s
from services.scheduler.core.work import Work
from services.timefmt import when


def check(res: Reservation, job: Job, now: float) -> tuple[str | None, bool]:
    """May `job` start now next to the pool's reservation, which is ahead of it in the queue? (why
    not, or None; and whether it may only use the reserved job's leftover GPUs)."""
    est = estimate_s(job)
    if est is not None and now + est <= res.shadow_at:
        return None, False  # ends before the reserved job starts
    if job.gpus > res.extra_gpus:
        return _would_delay(res.job_id, res.shadow_at, now), False
    return None, True


@lru_cache(maxsize=64)
def _would_delay(job_id: str, shadow_at: float, now: float) -> str:
    """The same text for every job a reservation holds back in a cycle: formatted once."""
    return f"backfill: would delay {job_id}, which has the GPUs reserved from about {when(shadow_at, now)}"


def reservation(work: Work, job: Job, key: QueueKey) -> Reservation | None:
    """EASY backfill: when will enough GPUs be free for `job`, judging by runtime estimates?"""
    found = _enough(work, job, _ends(work, job.pool))
    if found is None:
        return None  # running work has no estimates: nothing to reserve against
    shadow_at, extra = found
    return Reservation(job.id, key, job.gpus, shadow_at, extra)


def free_by(work: Work, job: Job, horizon: float) -> float | None:
    """When enough GPUs are free for `job` by runtime estimates, if that is at `horizon` or sooner;
    else None."""
    found = _enough(work, job, takewhile(lambda end: end[0] <= horizon, _ends(work, job.pool)))
    return None if found is None else found[0]


def _enough(work: Work, job: Job, ends: Iterable[tuple[float, float]]) -> tuple[float, float] | None:
    """The first of the (sorted) ends by which enough GPUs are free for `job`, and the GPUs left over."""
    free: float = work.cap.free_in(work.classes(job))
    for end, gpus in ends:
        free += gpus
        if free >= job.gpus:
            return end, free - job.gpus
    return None


def _ends(work: Work, pool: str) -> Iterator[tuple[float, float]]:
    """(estimated end, GPUs) of the pool's running work with runtime estimates, sorted (an end
    already past counts as now), read only as far as the caller goes: the state keeps the ends of
    what ran before this cycle sorted, so only the overdue ones (all "now") and this cycle's
    admissions are sorted here."""
    s, now, gone = work.s, work.now, work.gone
    ends = s.running_ends(pool)
    due = ends.bisect_right((now, math.inf, ""))  # those with an end at or before now
    overdue = sorted((now, gpus) for _, gpus, jid in islice(ends, due) if jid not in gone)
    later = ((end, gpus) for end, gpus, jid in ends.iter_from(due) if jid not in gone)
    fresh = []
    for jid in work.fresh:
        r = s.jobs[jid]
        est = estimate_s(r)
        if est is not None and r.pool == pool:
            fresh.append((now + est, r.gpus))
    return heapq.merge(overdue, later, sorted(fresh))


def drain(work: Work, job: Job, keep: int | None = None) -> Drain | None:
    """The node to hold for `job` (one replica, larger than any node's free GPUs): `keep` while it
    still could take the job, else the node of its classes that frees enough for it soonest by
    runtime estimates (work without an estimate never ends). None if no node ever could."""
    classes, slots = set(work.classes(job)), work.cap.slots
    best: tuple[float, int] | None = None
    for nid in [keep] if keep is not None else range(len(slots)):
        slot = slots[nid]
        if slot.cls in classes and slot.usable and slot.total >= job.gpus:
            at = (_node_ready(work, nid, job.spec.total_gpus), nid)
            best = at if best is None or at < best else best
    if best is None or best[0] == math.inf:  # a node whose work never ends is not worth holding
        return None if keep is None else drain(work, job)
    return Drain(job.id, best[1], best[0])


def _node_ready(work: Work, nid: int, gpus: int) -> float:
    """When `gpus` GPUs of the node are free, by the estimated ends of the work on it."""
    s, now = work.s, work.now
    node = s.node_by_id[nid]
    on_node: dict[str, int] = {}
    for jid in node.owners.values():
        if jid not in work.gone:
            on_node[jid] = on_node.get(jid, 0) + 1
    ends = []
    for jid, n in on_node.items():
        r = s.jobs[jid]
        est = estimate_s(r)
        since = r.running_since
        ends.append((math.inf if est is None or since is None else max(now, since + est), n))
    for jid, spot in work.fresh.items():
        est = estimate_s(s.jobs[jid])
        for at, taken in spot:
            if at == nid:
                ends.append((math.inf if est is None else now + est, len(taken)))
    free = len(work.cap.slots[nid].free)
    for end, n in sorted(ends):
        if free >= gpus:
            break
        free += n
        if free >= gpus:
            return end
    return now if free >= gpus else math.inf


def held_from(work: Work, job: Job) -> int | None:
    """The node `job` may not take GPUs on now: its pool's drain node, when the job is of the drain
    job's class or lower, or would run beyond its team's guarantee; unless it is the drain job,
    critical work, or ends (by estimates) before the node is ready. Higher classes within their
    guarantee still go first: the hold keeps the drain from lower-class and borrowed work."""
    d = work.drains.get(job.pool)
    if d is None or d.job_id == job.id or job.spec.priority == PriorityClass.CRITICAL:
        return None
    if job.spec.priority.rank < work.s.jobs[d.job_id].spec.priority.rank and not _beyond_guarantee(work, job):
        return None
    est = estimate_s(job)
    if est is not None and work.now + est <= d.ready_at:
        return None
    return d.node


def _beyond_guarantee(work: Work, job: Job) -> bool:
    q = work.s.quotas.get((job.pool, job.spec.team))
    return q is not None and work.usage.get((job.pool, job.spec.team), 0) + job.gpus > q.guaranteed
