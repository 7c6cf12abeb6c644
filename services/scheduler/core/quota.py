"""Cycle phase 3a: may the team's quota hold this job now? (Guarantees, borrow limits, lend limits.)

Non-preemptible work and reclaim (issue 19, refining issue 16's "non-preemptible jobs never borrow"):
every GPU a team holds beyond its guarantee must come back to the teams it belongs to: at once, by
preemption, if preemptible work holds it; or by draining, as the jobs end, if it is an idle
guarantee its owner lends to non-preemptible work (at most the owner's `np_lend_limit`, by default
half of what it lends). That holds while, in every pool,

    sum over teams of max(guarantee - np_lend_limit, non-preemptible GPUs held) <= the pool's capacity

A non-preemptible job starts if, with it, its team's term plus every other team's term stays within
the pool, where a team lends (its term drops by its np_lend_limit) only while it has no queued job
in the pool that fits its idle guarantee: a team that wants its guarantee back lends nothing new,
and its jobs wait for the drain ("waits for a drain") holding the EASY reservation (cycle.py). With
np_lend_limit 0 everywhere this is the strict rule: non-preemptible work beyond a guarantee runs
only on capacity nobody is guaranteed. To make room such work may also preempt preemptible borrowers
of a lower class (preemption.eligible: `urgent`). A job runs in one pool (its own), so the rule is
kept per pool.

Fair-share borrowing (`Policy.np_fair_share`, on by default): beyond that rule, a team's
non-preemptible work of each class may grow up to the team's fair share of the pool for that class
(`Work.fair_share`: the pool water-filled over the teams' demand of that class or more urgent, held
plus queued, by quota weight; a team never counts for less than the part of its guarantee it does
not lend). The team's more urgent non-preemptible work does not count against a less urgent class's
share, but all its classes together stay within its guarantee or its aggregate fair share
(`Work.fair_share` over every class's demand): the aggregate shares fit the pool, so what it holds
of other teams' guarantees can always drain back (per class alone, serving 9 GPUs plus normal 1
against an aggregate share of 9 held a lender's GPU for as long as serving ran). Without fair-share
borrowing, on a trace whose every team always has work queued nobody lends, and the idle GPUs of a
team's guarantee went to other teams' preemptible low work while their high work waited
(docs/fairness.md). What such work holds of
another team's guarantee comes back by draining: that team's jobs wait for it ("waits for a drain")
holding the reservation, and nobody borrows more of it while its own demand wants it (its fair share
rises back to its guarantee). The share does not hold critical work, the pool's first protected job,
or each team's first protected job that fits on one node (`_not_held_to_the_share`); what they hold
of others' guarantees drains back the same way.
"""

from __future__ import annotations

from events import PriorityClass
from services.scheduler.core.policy import CRITICAL_RANK, LOWEST_RANK, RANKS
from services.scheduler.core.state import Job, SchedulerState
from services.scheduler.core.waits import Wait, WaitKind
from services.scheduler.core.work import Usage, Work


# -- a team's standing in a pool (the cycle's scratch view) ---------------------------------------
def guarantee(work: Work, pool: str, team: str) -> int:
    return work.guarantee(pool, team)


def borrowing(work: Work, pool: str, team: str, usage: Usage | None = None) -> bool:
    """Whether the team holds more than its guarantee in the pool (by `usage`, else the scratch view)."""
    return work.borrowing(pool, team, usage)


def smallest_waiting(work: Work, pool: str, team: str, rank: int = LOWEST_RANK) -> float | None:
    """GPUs of the team's smallest queued job in the pool at priority `rank` or more urgent, or None."""
    return work.smallest_waiting(pool, team, rank)


def lends_to_nonpreemptible(work: Work, pool: str, team: str, rank: int = LOWEST_RANK) -> int:
    """Guaranteed GPUs of `team` that other teams' non-preemptible work at priority `rank` may use now
    (`Work.lends_to_nonpreemptible`)."""
    return work.lends_to_nonpreemptible(pool, team, rank)


def block(work: Work, job: Job, usage: Usage | None = None) -> Wait | None:
    """Why the team's quota does not allow this job now, or None if it does."""
    return limits_block(work, job, usage) or room_block(work, job, usage)


def limits_block(work: Work, job: Job, usage: Usage | None = None) -> Wait | None:
    """The team's own limits: guarantee (static quota, non-preemptible work) and borrow limit."""
    if not work.policy.quotas:
        return None
    s = work.s
    usage = work.usage if usage is None else usage
    pool, team, n = job.pool, job.spec.team, job.gpus
    q = s.quotas.get((pool, team))
    g = q.guaranteed if q else 0
    u = usage.get((pool, team), 0)
    if not work.policy.borrowing and u + n > g:
        return Wait(
            WaitKind.QUOTA, f"static quota: team {team} would hold {u + n} GPUs in pool {pool}, above its guarantee {g}"
        )
    if q is not None and q.borrow_limit is not None and u + n > g + q.borrow_limit:
        return Wait(
            WaitKind.QUOTA,
            f"quota: team {team} would hold {u + n} GPUs in pool {pool}, above its guarantee {g}"
            f" + borrow limit {q.borrow_limit}",
        )
    if not job.spec.preemptible:
        return nonpreemptible_block(work, job)
    return None


def room_block(work: Work, job: Job, usage: Usage | None = None) -> Wait | None:
    """The pool's room: what other teams hold or keep back (their unlendable guarantee). Held GPUs
    free as work ends, so for the starvation guard this is a wait for capacity (it may reserve)."""
    if not work.policy.quotas:
        return None
    s = work.s
    usage = work.usage if usage is None else usage
    pool, team, n = job.pool, job.spec.team, job.gpus
    u = usage.get((pool, team), 0)
    if usage is work.usage:  # the same for every job of the team until the scratch usage changes
        teams = work.teams(pool)
        found = work.held_by_others(pool, team, teams)  # kept as a sum while whole GPUs
        if found is None:
            held = work.others_memo(pool, team, teams, _held_by_others, s, usage, pool, team, teams)
        else:
            held = found
    else:
        teams = {t for (p, t) in s.quotas if p == pool} | {t for (p, t) in usage if p == pool}
        held = _held_by_others(s, usage, pool, team, teams)
    room = work.pool_capacity(pool) - held - u
    if held and n > room:  # with nothing held by others, placement itself says what is missing
        lent = _lent_out(work, pool, team) if u + n <= guarantee(work, pool, team) else 0
        if lent:
            holders = sorted(t for t in teams if t != team and nonpreemptible(work, pool, t) > work.guarantee(pool, t))
            return Wait(
                WaitKind.DRAIN,
                f"{DRAIN}: {lent} GPUs of pool {pool} are held by non-preemptible work of {', '.join(holders)} on "
                f"idle guarantees lent to it (team {team}'s included), returned as it ends (never preempted); "
                f"needs {n}",
            )
        return Wait(
            WaitKind.ROOM,
            f"quota: pool {pool} has {max(room, 0)} GPUs team {team} may use now "
            f"(others hold or keep back {held}); needs {n}",
        )
    return None


def _held_by_others(s: SchedulerState, usage: Usage, pool: str, team: str, teams: set[str]) -> float:
    """What teams other than `team` hold or keep back (their unlendable guarantee) in the pool."""
    held: float = 0
    for other in teams:
        if other != team:
            oq = s.quotas.get((pool, other))
            held += max(usage.get((pool, other), 0), oq.locked if oq else 0)
    return held


DRAIN = "quota: waits for a drain"  # GPUs lent to others' non-preemptible work, freed as that work ends


def within_guarantee(work: Work, job: Job) -> bool:
    """The job's team would stay within its guarantee with it."""
    return work.usage.get((job.pool, job.spec.team), 0) + job.gpus <= guarantee(work, job.pool, job.spec.team)


def borrowed(work: Work, job: Job) -> float:
    """GPUs beyond the team's guarantee that admitting the job now would add."""
    g = guarantee(work, job.pool, job.spec.team)
    u = work.usage.get((job.pool, job.spec.team), 0)
    return max(0, u + job.gpus - g) - max(0, u - g)


def critical_block(state: SchedulerState, team: str, pool: str, priority: PriorityClass) -> str | None:
    """Why the team may not run critical work in the pool, or None. Who may is a per-team quota
    setting (`TeamQuotaSet.critical`); a pool where nobody has a quota has no rules to keep."""
    if priority != PriorityClass.CRITICAL or not any(p == pool for (p, _) in state.quotas):
        return None
    q = state.quotas.get((pool, team))
    if q is not None and q.critical:
        return None
    return (
        f"team {team} may not run critical work in pool {pool}: an operator allows it with "
        f"`chamber quota set {team} --pool {pool} --gpus N --critical`; or resubmit it as high"
    )


def nonpreemptible(work: Work, pool: str, team: str) -> float:
    """GPUs the team's non-preemptible jobs hold in the pool (scratch view; preemption never changes it)."""
    held = work.usage.get((pool, team), 0)
    for rank in RANKS:
        held -= work.preemptible.get((pool, team, rank), 0)
    return held


def promised(work: Work, pool: str, team: str, lending: bool = True, rank: int = RANKS[-1]) -> float:
    """What the rule keeps for `team` in the pool: max(guarantee - what it lends to non-preemptible
    work now, its non-preemptible GPUs); with `lending` False, its whole guarantee."""
    lent = lends_to_nonpreemptible(work, pool, team, rank) if lending else 0
    return max(guarantee(work, pool, team) - lent, nonpreemptible(work, pool, team))


def nonpreemptible_block(work: Work, job: Job) -> Wait | None:
    """Why a non-preemptible job may not start now (see the module's rule), or None."""
    s, pool, team, n = work.s, job.pool, job.spec.team, job.gpus
    mine = nonpreemptible(work, pool, team) + n
    q = s.quotas.get((pool, team))
    g = q.guaranteed if q else 0
    own = g - q.np_lendable if q else 0  # the part of its guarantee no one else's such work may hold
    teams = work.teams(pool)
    others = sum(promised(work, pool, t, rank=job.spec.priority.rank) for t in teams if t != team)
    spare = work.pool_capacity(pool) - others
    if max(own, mine) <= spare:
        return None
    if work.policy.np_fair_share and job.spec.priority.rank == CRITICAL_RANK:
        # Critical work is not held to the fair share: it may preempt across teams, and held to the
        # share it waited behind its own team's less urgent work (one critical 8-GPU job 22 h on an
        # ITP cluster). What it holds of other teams' guarantees drains back like any lent capacity.
        return None
    fair = work.fair_share(pool, team, job.spec.priority.rank)
    # The share is per class: the team's more urgent non-preemptible work does not use up the share
    # of its less urgent work (else a team's steady high work kept its normal work waiting while
    # other teams' preemptible low work borrowed the idle GPUs: docs/fairness.md).
    rank = job.spec.priority.rank
    in_class = mine - work.np_more_urgent(pool, team, rank)
    # ...but all its classes together stay within its guarantee or its aggregate share (all classes'
    # demand): those shares fit the pool, so every lender can reclaim its guarantee (module doc).
    if work.policy.np_fair_share and in_class <= fair and mine <= max(g, work.fair_share(pool, team)):
        return _keeps_room(work, job, in_class, fair)  # within its fair share of the pool
    if work.policy.np_fair_share and _not_held_to_the_share(work, job):
        return None
    if mine <= g:
        lent = sorted(t for t in teams if t != team and nonpreemptible(work, pool, t) > guarantee(work, pool, t))
        return Wait(
            WaitKind.DRAIN,
            f"{DRAIN}: {max(own, mine) - spare} GPUs of team {team}'s guarantee in pool {pool} are "
            f"lent to non-preemptible work of {', '.join(lent) or 'other teams'}, "
            "returned as it ends (never preempted)",
        )
    agg = work.fair_share(pool, team)
    share = f", fair share {fair:.0f}, all classes {agg:.0f}" if work.policy.np_fair_share else ""
    return Wait(
        WaitKind.QUOTA,
        f"quota: non-preemptible jobs borrow only unguaranteed GPUs, idle guarantees lent to them, or up to "
        f"their fair share (team {team} would run {mine} non-preemptible GPUs in pool {pool}, guarantee {g}{share}; "
        f"room for {max(spare - mine + n, 0)} now: teams with work waiting for their guarantee lend none)",
    )


def _keeps_room(work: Work, job: Job, in_class: float, fair: float) -> Wait | None:
    """Within its fair share (what it holds of others' guarantees drains back) a job starts, except
    that the team's protected non-preemptible job keeps room: else the team's own smaller jobs refill
    the share and a large job waits for good (openb's 8-GPU jobs). Against a job of its class, room
    in the class's share; against a less urgent job (`room_against_less_urgent`), room in what all
    the team's classes may hold together (its guarantee or its aggregate share): the less urgent job
    does not take what the more urgent one waits for."""
    pool, team = job.pool, job.spec.team
    held_for = work.protected_np(pool, team)
    if held_for is None or held_for.id == job.id:
        return None
    urgent, rank = held_for.spec.priority.rank, job.spec.priority.rank
    if urgent < rank and work.policy.room_against_less_urgent:
        left = (
            max(guarantee(work, pool, team), work.fair_share(pool, team)) - nonpreemptible(work, pool, team) - job.gpus
        )
        if left >= held_for.gpus:
            return None
        return Wait(
            WaitKind.QUOTA,
            f"quota: team {team}'s share of pool {pool} keeps room for {held_for.id} "
            f"({held_for.gpus} GPUs, {held_for.spec.priority.value}), protected by the starvation guard; "
            f"with this job {max(left, 0):.0f} left",
        )
    if urgent != rank or in_class + held_for.gpus <= fair:
        return None
    return Wait(
        WaitKind.QUOTA,
        f"quota: team {team}'s fair share of pool {pool} ({fair:.0f} GPUs) keeps room for {held_for.id} "
        f"({held_for.gpus} GPUs), protected by the starvation guard; "
        f"with this job {max(fair - in_class, 0):.0f} left",
    )


def _not_held_to_the_share(work: Work, job: Job) -> bool:
    """The starvation guard's oldest job in the pool is not held to the share: with every team
    wanting more than its share, jobs larger than any share (64 GPUs of 80 with four teams) waited
    for good. One job at a time, and it drains back like any lent capacity. Nor is each team's first
    protected job that fits on one node: where a share is about a node (8 GPUs of 32 with four
    teams), an 8-GPU job fits only while its team runs nothing else non-preemptible, which a team's
    long-running work never allows (openb's normal jobs waited up to 880 h, fifo's p99 804 h). At
    most a node per team, and it drains back too."""
    if work.longest_protected(job.pool) == job.id:
        return True
    if job.gpus > work.cap.max_gpus:
        return False
    first = work.protected_np(job.pool, job.spec.team)
    return first is not None and first.id == job.id


def _lent_out(work: Work, pool: str, team: str) -> float:
    """Non-preemptible GPUs other teams hold beyond their guarantees in the pool."""
    return work.memo(("lent", pool, team), _lent_by_others, work, pool, team)


def _lent_by_others(work: Work, pool: str, team: str) -> float:
    teams = work.teams(pool)
    return sum(max(0, nonpreemptible(work, pool, t) - guarantee(work, pool, t)) for t in teams if t != team)


def lent_to(work: Work, job: Job) -> float:
    """GPUs of other teams' idle guarantees a non-preemptible job admitted now runs on (beyond its
    guarantee and the pool's unguaranteed capacity): returned by draining, never preempted."""
    if job.spec.preemptible or not work.policy.quotas:
        return 0
    pool, team = job.pool, job.spec.team
    mine = nonpreemptible(work, pool, team) + job.gpus
    g = guarantee(work, pool, team)
    if mine <= g:
        return 0
    teams = work.teams(pool)
    strict = work.pool_capacity(pool) - sum(promised(work, pool, t, lending=False) for t in teams if t != team)
    return min(job.gpus, max(0, mine - max(g, strict)))
