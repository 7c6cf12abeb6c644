"""Cycle phase 3a: may the team's quota hold this job now? (Guarantees, borrow limits, lend limits.)"""

from __future__ import annotations

from services.scheduler.core.state import Job
from services.scheduler.core.work import Usage, Work


def block(work: Work, job: Job, usage: Usage | None = None) -> str | None:
    """Why the team's quota does not allow this job now, or None if it does."""
    if not work.policy.quotas:
        return None
    s = work.s
    usage = work.usage if usage is None else usage
    pool, team, n = job.pool, job.spec.team, job.gpus
    q = s.quotas.get((pool, team))
    g = q.guaranteed if q else 0
    u = usage.get((pool, team), 0)
    if not work.policy.borrowing and u + n > g:
        return f"static quota: team {team} would hold {u + n} GPUs in pool {pool}, above its guarantee {g}"
    if q is not None and q.borrow_limit is not None and u + n > g + q.borrow_limit:
        return (
            f"quota: team {team} would hold {u + n} GPUs in pool {pool}, above its guarantee {g}"
            f" + borrow limit {q.borrow_limit}"
        )
    if q is not None and not job.spec.preemptible and u + n > g:
        return (
            f"quota: non-preemptible jobs run within the guarantee (team {team} holds {u} of {g} "
            f"in pool {pool}, needs {n})"
        )
    held = 0  # what other teams hold or keep back (unlendable guarantee) in the pool
    teams = {t for (p, t) in s.quotas if p == pool} | {t for (p, t) in usage if p == pool}
    for other in teams:
        if other != team:
            oq = s.quotas.get((pool, other))
            held += max(usage.get((pool, other), 0), oq.locked if oq else 0)
    room = work.pool_capacity(pool) - held - u
    if held and n > room:  # with nothing held by others, placement itself says what is missing
        return (
            f"quota: pool {pool} has {max(room, 0)} GPUs team {team} may use now "
            f"(others hold or keep back {held}); needs {n}"
        )
    return None


def borrowed(work: Work, job: Job) -> int:
    """GPUs beyond the team's guarantee that admitting the job now would add."""
    g = work.guarantee(job.pool, job.spec.team)
    u = work.usage.get((job.pool, job.spec.team), 0)
    return max(0, u + job.gpus - g) - max(0, u - g)
