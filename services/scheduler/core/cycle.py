"""One scheduling cycle: `schedule(state, now, since) -> Cycle` (pure: the state is left unchanged).

Phases (after Kueue's scheduler loop), each a function over one `CycleContext`:
  1. heads      jobs holding a GPU or node that went out of service give it back and rejoin the
                queue; then the queue in order (priority class, fair share, age, submit time, job
                id). A full cycle looks at every queued job, an incremental one (nothing freed, no
                rule changed since the last cycle's mark) only at the jobs that joined the queue since
  2. nominate   per job: pool, budget, critical permission, backfill check against its pool's
                reservation, quota check; a `Wait` ends its turn
  3. admit      placement on the scratch view (later jobs see it); a job that does not fit may
                preempt (same team by priority, reclaim of borrowed capacity, critical across
                classes) when `preemption.select` finds a set that makes it fit and that loses at most
                `policy.preemption_worth` x the GPU-time its wait would cost
  4. requeue    a job still waiting records why; the first job of a pool blocked for capacity gets
                an EASY-backfill reservation, and its shape's answer serves the same shapes after it
The cycle works on the live capacity index with a journal and rolls it back at the end; the
decisions only take effect when their events are folded back by `evolve`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

from events import JobSpec, PreemptionReason, PriorityClass
from services.scheduler.core import backfill, hostres, idle, mig_live, placement, preemption, quota, shares
from services.scheduler.core.budget import held as budget_held
from services.scheduler.core.decisions import Admit, Cycle, CycleMark, Decision, Preempt, Requeue, Reservation
from services.scheduler.core.degraded import only_degraded, out_of_service, stay_note
from services.scheduler.core.policy import (
    CHAMBER,
    ORDERINGS,
    Order,
    OrderKey,
    Policy,
    QueueKey,
    ordered_rows,
    sorted_queue,
)
from services.scheduler.core.pools import DEFAULT_POOL
from services.scheduler.core.preemption import Victims, lost_work_gpu_s
from services.scheduler.core.state import QUEUED, REQUEUED, Job, JobState, SchedulerState, derived, estimate_s
from services.scheduler.core.waits import Wait, WaitKind
from services.scheduler.core.work import Spot, Work
from services.timefmt import distinct, when

__all__ = ["PREEMPTION_SEARCHES", "estimate_s", "lost_work_gpu_s", "schedule", "select_victims"]

PREEMPTION_SEARCHES = CHAMBER.preemption_searches


def schedule(state: SchedulerState, now: float, since: CycleMark | None = None, *, policy: Policy = CHAMBER) -> Cycle:
    """Run one cycle. `since` is the previous cycle's mark: without it, or when capacity or rules
    changed since, every queued job is considered (full); else only newly queued ones.

    Victim searches are the costly part of a cycle on a full fleet, so, as Kueue nominates one head
    per queue, only the first waiting job of each (pool, team, priority) searches per cycle, and at
    most `policy.preemption_searches` searches run per cycle (in queue order)."""
    full = (
        since is None
        or since.capacity_epoch != state.capacity_epoch
        or _displaced_changed(state, since)
        or now >= since.guard_at  # a queued job became protected by the starvation guard
        or bool(policy.head_of_line)  # a blocked head holds back everything behind it, new or not
    )
    work = Work(state, now, policy)
    state.capacity.begin()
    try:
        ctx = CycleContext(state, work, now, policy, full, since)
        if since is not None:
            work.drains = {p: d for p, d in since.draining if (j := state.jobs.get(d.job_id)) and j.state in QUEUED}
        _turns(ctx, phase1_heads(ctx))
        if state.mig_nodes:  # MIG-managed nodes: change layouts for what no instance could take
            ctx.decisions += mig_live.plan_layouts(work, ctx.waiting, full)
        return ctx.result()
    finally:
        state.capacity.end()


def _turns(ctx: CycleContext, keys: Iterable[QueueKey]) -> None:
    """Each queued job's turn, in order: phases 2 to 4. Phase 2's first check is made here, as
    most jobs of a long queue end at it: a job of the same shape already found no room this cycle
    (it passed the pool and budget checks, which depend only on the shape's pool and team)."""
    state = ctx.state
    look = bool(state.idle_reclaim) or ctx.guard_per_key  # a job's own checks come before its shape's answer
    if not look and isinstance(keys, Ordered):
        _turns_in_columns(ctx, keys)
        return
    jobs, entries, shape_id = state.jobs, state.queued_entries(), derived(state).shape_id
    considered = 0
    for key in keys:
        considered += 1
        jid = key[3]
        # the shape's number: kept with the queue (a job requeued in this cycle is not in it yet)
        sid = entry[1] if (entry := entries.get(jid)) is not None else shape_id(jobs[jid])
        if look and _own_wait(ctx, jobs[jid]):
            continue
        _turn(ctx, key, sid)
    ctx.considered = considered


def _turn(ctx: CycleContext, key: QueueKey, sid: int) -> None:
    """One job's turn (after its own checks): its shape's answer so far, else phases 2 to 4."""
    jid = key[3]
    if (same := ctx.failed.get(sid)) is not None:
        ctx.waiting[jid] = same.text
        return
    job = ctx.state.jobs[jid]
    if (text := _held_back(ctx, job, sid)) is not None:
        ctx.waiting[jid] = text
        return
    found = phase2_nominate(ctx, key, job, sid)
    if isinstance(found, Wait):
        ctx.waiting[jid] = found.text
        if found.kind == WaitKind.BACKFILL:
            ctx.held_back[(sid, estimate_s(job))] = (ctx.reservations[job.pool], found.text)
    elif not phase3_admit(ctx, found):
        phase4_requeue(ctx, found)
        _hold_a_node(ctx, found)


class Ordered(list[QueueKey]):
    """A full cycle's queue in order, read from the queue's columns (`queue_table.py`): the keys, and
    in the same order each job's shape number (numpy) and id."""

    def __init__(self, keys: list[QueueKey], sids: Any, ids: list[str]) -> None:
        super().__init__(keys)
        self.sids, self.ids = sids, ids


def _turns_in_columns(ctx: CycleContext, keys: Ordered) -> None:
    """`_turns` over a full cycle's queue, the same turns: a job whose shape already failed this
    cycle only gets that answer, so the runs of such jobs between the others get theirs in bulk (found
    column-wise). A shape's answer stands until a preemption clears them all (`ctx.clears`), so a
    position found failed stays failed until then; the positions found open each take their turn
    (`_turn` looks again), and are found again once many of them turned out failed meanwhile."""
    failed, waiting, n, i = ctx.failed, ctx.waiting, len(keys), 0
    sids, jids = keys.sids, keys.ids
    sid_list: list[int] = sids.tolist()
    while i < n:
        clears, stale = ctx.clears, 0
        open_, texts = _open_from(sids, i, failed)
        for p in open_:
            if p > i:  # shapes that failed, all: each job gets its shape's answer, in order
                waiting.update(zip(jids[i:p], texts[sids[i:p]].tolist(), strict=True))
            stale += sid_list[p] in failed
            _turn(ctx, keys[p], sid_list[p])
            i = p + 1
            if ctx.clears != clears or (stale >= 16 and stale * 256 >= n - i):
                break  # the answers were cleared, or many open positions failed since: look again
        else:
            if i < n:
                waiting.update(zip(jids[i:], texts[sids[i:]].tolist(), strict=True))
            i = n
    ctx.considered = n


def _open_from(sids: Any, start: int, failed: dict[int, Wait]) -> tuple[Iterable[int], Any]:
    """The positions from `start` on whose shape has not failed (yet), and each failed shape's answer
    by shape number."""
    import numpy as np

    size = int(sids.max()) + 1 if len(sids) else 0
    texts = np.empty(size, dtype=object)
    if not failed:
        return range(start, len(sids)), texts
    shut = np.zeros(size, dtype=bool)
    for sid, wait in failed.items():
        if sid < size:
            shut[sid], texts[sid] = True, wait.text
    return (np.flatnonzero(~shut[sids[start:]]) + start).tolist(), texts


def _held_back(ctx: CycleContext, job: Job, sid: int) -> str | None:
    """What an earlier job of the same shape and runtime estimate was told by its pool's reservation,
    while that reservation stands: in a full cycle every reservation is made by a job earlier in the
    queue order than the jobs after it (the cycle walks the queue in order and starts with none), so it
    is ahead of them all, and the rest of phase 2 up to the backfill check depends on the shape only
    (pool, budget, critical permission) and the check on the estimate, the GPUs and the reservation.
    Most jobs of a long queue behind a reservation end here."""
    if not ctx.full or ctx.guard_per_key or not ctx.held_back:
        return None
    found = ctx.held_back.get((sid, estimate_s(job)))
    if found is None or ctx.reservations.get(job.pool) is not found[0]:
        return None
    return found[1]


def _own_wait(ctx: CycleContext, job: Job) -> bool:
    """The starvation guard's key-by-key watch (head-of-line policies), and a job's own idle hold
    (recorded: it waits for that, whatever its shape's answer)."""
    if ctx.guard_per_key:
        _note_protected(ctx, job)
    if ctx.state.idle_reclaim and (idle_hold := idle.held(ctx.state, job)) is not None:
        ctx.waiting[job.id] = idle_hold
        return True
    return False


def _displaced_changed(state: SchedulerState, since: CycleMark) -> bool:
    """Some job runs on out-of-service hardware that the last cycle did not leave there as it is."""
    if not state.displaced:
        return False
    staying = dict(since.staying)
    return any(staying.get(jid) != out_of_service(state, state.jobs[jid])[1] for jid in state.displaced)


@dataclass
class CycleContext:
    """Everything one cycle reads and builds, handed from phase to phase."""

    state: SchedulerState
    work: Work
    now: float
    policy: Policy
    full: bool
    since: CycleMark | None
    decisions: list[Decision] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # job id -> why it waits (Cycle.waiting)
    requeued: dict[str, Job] = field(default_factory=dict)  # displaced this cycle, back in the queue
    staying: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)  # on degraded hardware: why, faults
    reservations: dict[str, Reservation] = field(default_factory=dict)  # pool -> its EASY reservation
    starving: dict[str, str] = field(default_factory=dict)  # pool -> its first protected job waiting for capacity
    failed: dict[int, Wait] = field(default_factory=dict)  # shapes (by number) that found no room this cycle
    clears: int = 0  # times `failed` was cleared (a preemption freed capacity)
    # (shape number, runtime estimate) -> the reservation that held such a job back, and what it said
    held_back: dict[tuple[int, float | None], tuple[Reservation, str]] = field(default_factory=dict)
    searched: set[tuple[str, str, int]] = field(default_factory=set)  # (pool, team, priority) heads that searched
    guard_at: float = math.inf  # when the next queued job becomes protected
    considered: int = 0
    guard_per_key: bool = False  # phase 2 follows guard_at key by key (a cycle that may stop early)
    bound: float | None = field(init=False)  # policy.starvation_bound_s
    # Set by phase 1 once the displaced jobs are back in the queue (they count as queued now).
    queued_since: Callable[[str], float] = field(init=False)
    order: Order = field(init=False)
    reserved_order: dict[QueueKey, OrderKey] = field(default_factory=dict)  # reserved jobs' places in the order

    def __post_init__(self) -> None:
        self.bound = self.policy.starvation_bound_s
        if self.since is not None and not self.full:
            self.guard_at = self.since.guard_at

    def ahead(self, res: Reservation, key: QueueKey) -> bool:
        """The reserved job comes before `key` in the queue (its order computed once per cycle)."""
        return self._reserved_order(res) < self.order(key)

    def behind(self, res: Reservation, key: QueueKey) -> bool:
        """`key` comes before the reserved job in the queue."""
        return self.order(key) < self._reserved_order(res)

    def _reserved_order(self, res: Reservation) -> OrderKey:
        found = self.reserved_order.get(res.key)
        if found is None:
            found = self.reserved_order[res.key] = self.order(res.key)
        return found

    def wait(self, jid: str, wait: Wait) -> None:
        self.waiting[jid] = wait.text

    def result(self) -> Cycle:
        mark = CycleMark(
            self.state.capacity_epoch,
            len(self.state.pending_log),
            tuple(sorted(self.reservations.items())),
            self.guard_at,
            tuple(sorted(self.starving.items())),
            tuple(sorted((jid, faults) for jid, (_, faults) in self.staying.items())),
            tuple(sorted(self.work.drains.items())),
        )
        staying = {jid: why for jid, (why, _) in self.staying.items()}
        return Cycle(self.decisions, self.waiting, mark, self.full, self.considered, self.reservations, staying)


@dataclass
class Candidate:
    """A job that passed nomination's checks, and what they found out about it."""

    job: Job
    key: QueueKey
    shape: int  # its shape's number (`Derived.shape_id`)
    res: Reservation | None  # its pool's reservation when it was nominated
    exempt: bool  # critical work: never held back by a reservation
    via_extra: bool  # may start only on the reserved job's leftover GPUs
    block: Wait | None  # what its team's quota says
    protected_at: float | None
    starved_by: str | None  # a protected job waiting for capacity in its pool holds its free GPUs
    declined: str | None = None  # why it did not preempt the victims it found


# -- 1. heads ---------------------------------------------------------------------------------
def phase1_heads(ctx: CycleContext) -> Iterable[QueueKey]:
    """Work on a GPU or node out of service goes back to the queue (keeping its place); then the
    queue keys to consider, in order."""
    _requeue_displaced(ctx)
    if ctx.state.idle_reclaim:
        _suspend_idle(ctx)
    state, since = ctx.state, ctx.since
    ctx.queued_since = _queued_since(state, ctx.requeued, ctx.now)
    ctx.order = ORDERINGS[ctx.policy.order](ctx.policy, ctx.queued_since, ctx.now)
    if ctx.policy.head_of_line:
        ctx.guard_per_key = True  # the cycle stops at a blocked head: only the keys it reaches count
        return _first_come_first_served(state, ctx.requeued, ctx.policy, ctx.waiting)
    if ctx.full or since is None:
        if (ordered := _in_columns(ctx)) is not None:
            return ordered
        entries = state.queued_entries().values()
        keys = [*map(itemgetter(0), entries), *(state.queue_key(j) for j in ctx.requeued.values())]
        return _in_order(ctx, keys, [*map(itemgetter(2), entries), *(ctx.now for _ in ctx.requeued)])
    jobs = state.jobs
    new = set(state.pending_log[since.pending_seq :])
    ctx.reservations = dict(since.reservations)
    ctx.starving = {pool: j for pool, j in since.starving if j in jobs and jobs[j].state in QUEUED}
    # a job that joined and finished since may have left memory already (state.retention_s)
    keys = [state.queue_key(job) for j in new if (job := jobs.get(j)) is not None and job.state in QUEUED]
    return _in_order(ctx, keys)


def _in_order(ctx: CycleContext, keys: list[QueueKey], since: list[float] | None = None) -> list[QueueKey]:
    """The keys in the policy's order (`since`: when each joined the queue, if known). Every one of
    them is considered (nothing stops the cycle early), so when the next of them becomes protected is
    found here, for all at once."""
    if since is None:
        since = _since_column(ctx, keys)
    if ctx.bound is not None:
        ctx.guard_at = min(ctx.guard_at, _next_protected(since, ctx.bound, ctx.now))
    return sorted_queue(ctx.policy, keys, since, ctx.now)


def _in_columns(ctx: CycleContext) -> Ordered | None:
    """A full cycle's order read from the queue's columns (kept by the fold), as `_in_order` would
    sort the queued entries: for the multifactor order over a long queue with nobody requeued in the
    cycle (else None)."""
    state, policy = ctx.state, ctx.policy
    entries = state.queued_entries()
    if ctx.requeued or policy.order != "priority-fair-share" or len(entries) < _COLUMNS_FROM:
        return None
    index = derived(state)
    if index.table is None:
        from services.scheduler.core.queue_table import QueueTable  # numpy: only for long queues

        index.table = QueueTable(entries)
    table = index.table
    rows = table.rows()
    since = table.since[rows]
    if ctx.bound is not None:
        ctx.guard_at = min(ctx.guard_at, _next_protected(since, ctx.bound, ctx.now))
    columns = (table.rank[rows], table.share[rows], table.submitted[rows], since)
    order = rows[ordered_rows(policy, columns, ctx.now, lambda i: table.ids[rows[i]])]
    return Ordered(table.keys[order].tolist(), table.shape[order], table.ids[order].tolist())


_COLUMNS_FROM = 64  # as policy.sorted_queue, which sorts shorter queues without numpy


def _next_protected(since: list[float], bound: float, now: float) -> float:
    """When the next of these jobs becomes protected (the same sums as policy.protected_since's)."""
    if len(since) < 64:
        return min((p for t in since if (p := t + bound) > now), default=math.inf)
    import numpy as np  # as policy.sorted_queue: only cycles over long queues need it

    at = np.array(since, dtype=np.float64) + bound
    later = at[at > now]
    return float(later.min()) if len(later) else math.inf


def _queued_since(state: SchedulerState, requeued: dict[str, Job], now: float) -> Callable[[str], float]:
    """When a job last joined the queue (a displaced one: now). Called for every queued job of a
    full cycle by the sort, hence the plain closure."""
    jobs = state.jobs
    if not requeued:
        return lambda jid: jobs[jid].queued_since
    return lambda jid: now if jid in requeued else jobs[jid].queued_since


def _since_column(ctx: CycleContext, keys: list[QueueKey]) -> list[float]:
    """When each job last joined the queue, in the keys' order (C-level maps: a full cycle asks
    for every queued job)."""
    jobs = ctx.state.jobs
    since = list(map(attrgetter("queued_since"), map(jobs.__getitem__, [k[3] for k in keys])))
    if ctx.requeued:
        since = [ctx.now if k[3] in ctx.requeued else t for k, t in zip(keys, since, strict=True)]
    return since


def _requeue_displaced(ctx: CycleContext) -> None:
    """Jobs on failing hardware rejoin the queue; a job on degraded hardware (degraded.py) moves
    only where it lands now, else stays, flagged."""
    state = ctx.state
    for jid in sorted(state.displaced):
        job = state.jobs[jid]
        if job.state != JobState.RUNNING:
            continue
        nodes = sorted({p.node for p in job.placements})
        out, faults = out_of_service(state, job)
        if ctx.policy.move_only_where_it_lands and only_degraded(state, job):
            _move_or_stay(ctx, job, out, faults)
            continue
        ctx.work.release(job)
        ctx.requeued[jid] = job
        why = f"a GPU or node it ran on went out of service ({'; '.join(out) or ', '.join(nodes)})"
        ctx.decisions.append(Requeue(jid, why, nodes[0] if nodes else None, job.generation, faults))


def _suspend_idle(ctx: CycleContext) -> None:
    """Jobs an idle verdict says to suspend give their GPUs back now, as a preemption (idle.py)."""
    for job, mark in idle.due(ctx.state):
        lost = lost_work_gpu_s(job, ctx.now)
        ctx.decisions.append(
            Preempt(job.id, job.spec.team, PreemptionReason.IDLE, "", lost, mark.detail, job.generation)
        )
        ctx.work.release(job)


def _move_or_stay(ctx: CycleContext, job: Job, out: list[str], faults: tuple[str, ...]) -> None:
    """Off degraded hardware: a move (requeue and resume in this cycle, before the queue: the job did
    not ask to wait) when a healthy place takes it now; else it stays where it is, flagged."""
    work = ctx.work
    mark = work.cap.mark()
    work.release(job)
    spot = placement.place(work, job) if quota.block(work, job) is None else None
    if spot is None:
        work.cap.rollback(mark)
        work.count(job, +1)
        work.gone.discard(job.id)
        ctx.staying[job.id] = (stay_note(job, out), faults)
        return
    was = ", ".join(f"{p.node}[{','.join(map(str, p.gpu_indices))}]" for p in job.placements)
    causes = "; ".join(out) or "degraded hardware"
    node = min((p.node for p in job.placements), default=None)
    ctx.decisions.append(Requeue(job.id, f"moved off degraded hardware ({causes})", node, job.generation, faults))
    borrowed = quota.borrowed(work, job)
    placements = work.admit(job, spot)
    why = f"moved from {was} (degraded: {causes}) to {work.describe(spot, job)}"
    ctx.decisions.append(Admit(job.id, job.spec.team, placements, borrowed, why, True, job.generation + 1, job.pool))


# -- 2. nominate ------------------------------------------------------------------------------
def phase2_nominate(ctx: CycleContext, key: QueueKey, job: Job, shape: int) -> Candidate | Wait:
    """The checks before placement (after the answer for its shape so far this cycle, `_turns`):
    pool, budget, critical permission, the pool's backfill reservation, then the team's quota."""
    state, now, policy, spec = ctx.state, ctx.now, ctx.policy, job.spec
    protected_at = _protected_at(ctx, job)
    if job.pool != DEFAULT_POOL and job.pool not in state.pools:
        return Wait(WaitKind.POOL, f"pool {job.pool} is not defined (define it with `chamber quota pool set`)")
    if state.budgets and (hold := budget_held(state, job, now)) is not None:
        return Wait(WaitKind.BUDGET, hold)
    if policy.quotas and (refused := quota.critical_block(state, spec.team, job.pool, spec.priority)) is not None:
        return Wait(WaitKind.CRITICAL, refused)
    res = ctx.reservations.get(job.pool)
    # Critical work (rare, and a per-team permission) is never held back by a reservation.
    exempt = spec.priority == PriorityClass.CRITICAL
    if res is None or exempt or not ctx.ahead(res, key):
        behind, via_extra = None, False
    else:
        behind, via_extra = backfill.check(res, job, now)
    if behind is not None:
        return Wait(WaitKind.BACKFILL, behind)
    protected = protected_at is not None and protected_at <= now
    # The starvation guard's second half: while a protected job waits for capacity in its pool,
    # jobs not yet protected do not take that pool's free GPUs (they may still preempt), so the
    # GPUs that free up go to the protected jobs, and whole nodes can free for whole-node jobs
    # (issue 19: low's tail on the ITP trace).
    starved_by = None if protected or exempt else ctx.starving.get(job.pool)
    block = quota.block(ctx.work, job)
    return Candidate(job, key, shape, res, exempt, via_extra, block, protected_at, starved_by)


def _protected_at(ctx: CycleContext, job: Job) -> float | None:
    """policy.protected_since, inlined: when the job is (or will be) protected by the starvation guard."""
    if ctx.bound is None:
        return None
    return (ctx.now if job.id in ctx.requeued else job.queued_since) + ctx.bound


def _note_protected(ctx: CycleContext, job: Job) -> None:
    protected_at = _protected_at(ctx, job)
    if protected_at is not None and ctx.now < protected_at < ctx.guard_at:
        ctx.guard_at = protected_at


# -- 3. admit ---------------------------------------------------------------------------------
# why a victim could be preempted, in the words `chamber explain` shows
_ELIGIBLE = {
    PreemptionReason.PRIORITY: "lower priority (same team, or preemptible work of a lower class)",
    PreemptionReason.RECLAIM: "on borrowed GPUs their owner takes back",
    PreemptionReason.CRITICAL: "preemptible by critical work of any team",
    PreemptionReason.OPERATOR: "by an operator",
    PreemptionReason.IDLE: "idle past its team's policy",
}


def _victims_why(victims: Victims) -> str:
    """`a, b (lower priority, same team); c (on borrowed GPUs ...)`: the victims grouped by why."""
    by_reason: dict[PreemptionReason, list[str]] = {}
    for v, reason in victims:
        by_reason.setdefault(reason, []).append(v.id)
    return "; ".join(f"{', '.join(ids)} ({_ELIGIBLE.get(r, r.value)})" for r, ids in by_reason.items())


def phase3_admit(ctx: CycleContext, c: Candidate) -> bool:
    """Place the job on free GPUs, else on what the victims it may preempt would free. Admitted
    (and any victims preempted) on the scratch view at once, so later jobs see it."""
    work, job = ctx.work, c.job
    if c.block is None and c.starved_by is None and placement.could_fit(work, job):
        spot = placement.place(work, job)
        if spot is not None:
            _admit(ctx, c, spot, _placed_why(ctx, c, spot))
            return True
    victims = _victims(ctx, c)
    if not victims:
        return False
    names = _victims_why(victims)
    for v, reason in victims:
        detail = f"preempted by {job.id} ({reason.value}, {job.spec.priority.value} priority, team {job.spec.team})"
        ctx.decisions.append(
            Preempt(v.id, v.spec.team, reason, job.id, lost_work_gpu_s(v, ctx.now), detail, v.generation)
        )
        work.release(v)
    spot = placement.place(work, job)
    assert spot is not None, "select_victims promised a fit"
    why = f"placed on {work.describe(spot, job)} after preempting {names}"
    if moved := _moved_because(ctx, job):  # it ran elsewhere before: say from where and why it moved
        why += f"; moved here: {moved}"
    if job.id in work.link_notes:
        why += f"; {work.link_notes[job.id]}"
    if lent := quota.lent_to(work, job):
        why += f"; {lent} GPUs on idle guarantees lent to non-preemptible work (returned by draining)"
    _admit(ctx, c, spot, why)
    ctx.failed.clear()  # freed capacity may fit shapes that failed before
    ctx.clears += 1
    return True


def _admit(ctx: CycleContext, c: Candidate, spot: Spot, why: str) -> None:
    job, work = c.job, ctx.work
    if (d := work.drains.get(job.pool)) is not None and d.job_id == job.id:
        del work.drains[job.pool]
    borrowed = quota.borrowed(work, job)  # before the admission counts the job
    placements = work.admit(job, spot)
    generation = job.generation + (1 if job.id in ctx.requeued else 0)
    ctx.decisions.append(Admit(job.id, job.spec.team, placements, borrowed, why, job.ran_before, generation, job.pool))


def _moved_because(ctx: CycleContext, job: Job) -> str | None:
    """Why a job being placed left where it ran: requeued in this cycle, or in an earlier one."""
    if job.id in ctx.requeued:
        return next((d.reason for d in ctx.decisions if isinstance(d, Requeue) and d.job_id == job.id), None)
    return job.reason.removeprefix(REQUEUED) if job.reason.startswith(REQUEUED) else None


def _placed_why(ctx: CycleContext, c: Candidate, spot: Spot) -> str:
    """The reason an admission on free GPUs gives (measured before the admission counts the job)."""
    work, job, res = ctx.work, c.job, c.res
    why = f"placed on {work.describe(spot, job)}"
    if moved := _moved_because(ctx, job):  # it ran elsewhere before: say from where and why it moved
        why += f"; moved here: {moved}"
    if job.id in work.link_notes:
        why += f"; {work.link_notes[job.id]}"
    if borrowed := quota.borrowed(work, job):
        why += f", borrowing {borrowed} idle GPUs of pool {job.pool}"
    if lent := quota.lent_to(work, job):
        why += f" ({lent} on idle guarantees lent to non-preemptible work: returned by draining, not preemption)"
    if res is not None and ctx.ahead(res, c.key):
        why += (
            f"; critical: started ahead of {res.job_id}, which has GPUs reserved"
            if c.exempt
            else f"; backfilled ahead of {res.job_id} without delaying it"
        )
        if c.via_extra:
            left = res.extra_gpus - backfill.extra_taken(job)
            ctx.reservations[job.pool] = Reservation(res.job_id, res.key, res.gpus, res.shadow_at, left)
    return why


def _victims(ctx: CycleContext, c: Candidate) -> Victims | None:
    """The first waiting job of each (pool, team, priority) may search for victims; the search's
    answer stands unless preempting them is not worth the wait it saves (`c.declined` says so)."""
    work, job, policy = ctx.work, c.job, ctx.policy
    head = (job.pool, job.spec.team, job.spec.priority.rank)
    if (
        not policy.preemption
        or head in ctx.searched
        or len(ctx.searched) >= policy.preemption_searches
        or not preemption.may_preempt(work, job)
    ):
        return None
    ctx.searched.add(head)
    victims = preemption.select(work, job)
    if victims and not c.exempt and policy.preemption_worth is not None:
        c.declined = _not_worth(work, job, victims, policy.preemption_worth)
        if c.declined is not None:
            return None
    return victims


# -- 4. requeue -------------------------------------------------------------------------------
def phase4_requeue(ctx: CycleContext, c: Candidate) -> None:
    """The job stays queued: record why. The first job of a pool blocked for capacity reserves
    (EASY backfill); otherwise the answer serves every later job of the same shape this cycle."""
    job = c.job
    if c.starved_by is not None:
        ctx.wait(
            job.id,
            Wait(
                WaitKind.HELD_BACK,
                f"held back: {c.starved_by} is protected by the starvation guard and waits for capacity in pool "
                f"{job.pool}; until it starts, jobs not yet protected start there only by preemption",
            ),
        )
        return
    guard = _guard_text(ctx, c)
    # A lender's job waiting within its guarantee for lent GPUs to drain reserves them (so later
    # arrivals cannot take what drains). Other quota waits do not reserve: measured on the ITP
    # trace with classes, protected jobs reserving GPUs other teams hold raised high's p99 wait
    # from about 3 h to 49 h (README, issue 19).
    block = c.block
    may_reserve = block is None or (block.kind == WaitKind.DRAIN and quota.within_guarantee(ctx.work, job))
    wait = block if block is not None and not may_reserve else _capacity_wait(ctx, c, guard)
    if wait is None:
        return  # it reserved (and said so)
    if c.declined is not None:
        wait = Wait(wait.kind, f"{wait.text}; {c.declined}")
    ctx.failed[c.shape] = wait  # the same answer for the same shape, not the same guard
    ctx.wait(job.id, wait.prefixed(guard))


def _hold_a_node(ctx: CycleContext, c: Candidate) -> None:
    """A protected non-preemptible job on one node that its quota allows (or that waits only for
    room in the pool or a drain) but no node has room for holds the node that frees for it soonest
    (`backfill.drain`), one job per pool: else other work takes each GPU that frees there and the
    job waits for a whole node for good (openb's 8-GPU jobs). The hold ends when it starts, or once
    its quota holds it back otherwise (the node would idle for nothing)."""
    work, job = ctx.work, c.job
    held = work.drains.get(job.pool)
    if held is not None and held.job_id != job.id:
        return
    protected = c.protected_at is not None and c.protected_at <= ctx.now
    # Waits for room in the pool (others hold it) or for lent GPUs to drain back end as work ends,
    # like a wait for capacity: the node stays held through them (else on openb at 32 GPUs the
    # hold came and went, and whatever freed on the node went to other work).
    blocked = c.block is not None and c.block.kind not in (WaitKind.ROOM, WaitKind.DRAIN)
    if not protected or blocked or c.starved_by is not None or job.spec.preemptible:
        work.drains.pop(job.pool, None) if held is not None else None
        return
    if job.spec.replicas != 1 or job.gpus > work.cap.max_gpus:
        return
    if held is None and job.gpus <= work.cap.max_free(work.classes(job)):
        return  # it fits on a node now: it waits for something else
    found = backfill.drain(work, job, None if held is None else held.node)
    if found is None:
        work.drains.pop(job.pool, None)
    else:
        work.drains[job.pool] = found


def _guard_text(ctx: CycleContext, c: Candidate) -> str:
    """What a protected job's wait starts with ("" for one not protected)."""
    if c.protected_at is None or c.protected_at > ctx.now:
        return ""
    return (
        f"protected by the starvation guard since {when(c.protected_at, ctx.now)} "
        f"(queued since {when(ctx.queued_since(c.job.id), ctx.now)}); "
    )


def _capacity_wait(ctx: CycleContext, c: Candidate, guard: str) -> Wait | None:
    """What the job waits for (capacity, or a drain it may reserve for), with what is free where;
    None when it took its pool's reservation (its wait is recorded then, not shared by its shape)."""
    work, job, spec = ctx.work, c.job, c.job.spec
    classes = work.classes(job)
    model = f" of model {spec.gpu_model}" if spec.gpu_model else ""
    why = (
        c.block.text
        if c.block is not None
        else f"waiting for capacity: needs {spec.replicas}x{_asked(spec)}{model} "
        f"in pool {job.pool}; {work.cap.free_in(classes)} free, at most {work.cap.max_free(classes)} on one node"
    )
    if spec.gpus_per_replica > work.cap.max_gpus:
        why += f"; no node has {spec.gpus_per_replica} GPUs (the largest has {work.cap.max_gpus})"
    elif c.block is None:
        why += hostres.short_text(work, job, classes)
    fits_ever = spec.gpus_per_replica <= work.cap.max_gpus and job.gpus <= sum(work.cap.class_total[k] for k in classes)
    policy = ctx.policy
    if guard and c.block is None and fits_ever and policy.guard_holds_free_gpus and not policy.head_of_line:
        ctx.starving.setdefault(job.pool, job.id)
    kind = c.block.kind if c.block is not None else WaitKind.CAPACITY
    res = c.res
    if policy.backfill and fits_ever and (res is None or ctx.behind(res, c.key)):
        new_res = backfill.reservation(work, job, c.key)  # never reserved for what cannot fit
        if new_res is not None:
            ctx.reservations[job.pool] = new_res
            why += f"; GPUs reserved for it from about {when(new_res.shadow_at, ctx.now)}"
            ctx.waiting[job.id] = guard + why
            return None
    return Wait(kind, why)


def _asked(spec: JobSpec) -> str:
    """`2 GPUs` / `a 1g.10gb MIG instance` / `250 milli-GPU (mps)`: what one replica asks for."""
    return f"{spec.gpus_per_replica} GPUs" if spec.share is None else shares.describe(spec.share)


def _not_worth(work: Work, job: Job, victims: list[tuple[Job, PreemptionReason]], worth: float) -> str | None:
    """Why preempting `victims` for `job` is not worth it (they would lose more than `worth` x the
    GPU-time of its wait, by runtime estimates), or None if it is (or the wait has no estimate).
    What they lose: their work since the last checkpoint, and with `worth_counts_wait_again` the
    wait again of each less urgent victim that had starved before it started
    (`preemption.wait_again_gpu_s`)."""
    lost = sum(lost_work_gpu_s(v, work.now) for v, _ in victims)
    bound = work.policy.starvation_bound_s if work.policy.worth_counts_wait_again else None
    # Only against more urgent work: among jobs of one class (a team taking back its guarantee) it
    # would only move the wait from one starved job to the other (on the ITP trace, low's p99 rose).
    rank = job.spec.priority.rank
    again = sum(preemption.wait_again_gpu_s(v, bound) for v, _ in victims if v.spec.priority.rank > rank)
    cost = lost + again
    if cost <= 0:
        return None
    # Worth it unless enough GPUs free (by estimates) within the wait that would cost cost / worth.
    at = backfill.free_by(work, job, work.now + cost / (worth * job.gpus))
    saved = 0.0 if at is None else job.gpus * (at - work.now)
    if at is None or cost <= worth * saved:
        return None
    cost_h, saved_h = distinct(cost / 3600, saved / 3600)  # never "0.0, more than ... 0.0"
    what = (
        f"{cost_h} GPU-hours ({again / 3600:.1f} of them queued again: they waited past the starvation "
        "bound before they started)"
        if again
        else f"{cost_h} GPU-hours"
    )
    return (
        f"not preempting {', '.join(v.id for v, _ in victims)}: they would lose {what}, "
        f"more than waiting for GPUs that free from about {when(at, work.now)} costs ({saved_h} GPU-hours)"
    )


def _first_come_first_served(
    state: SchedulerState, requeued: dict[str, Job], policy: Policy, waiting: dict[str, str]
) -> Iterator[QueueKey]:
    """Head-of-line blocking (the fifo and static-quota baselines): jobs in submit order, in one
    line ("all") or one per team, each line ending at its first job that waits (the cycle has put
    it in `waiting` by the time the next key is asked for). Reads only the heads of the state's
    per-team lines, so a long queue costs nothing per cycle."""
    extra: dict[str, list[tuple[float, str]]] = {}
    for job in requeued.values():  # still running in the state: not in its lines yet
        extra.setdefault(job.spec.team, []).append((job.submitted_at, job.id))
    teams = sorted(set(state.fifo_lines) | set(extra))

    def line(team: str) -> Iterator[tuple[float, str]]:
        return heapq.merge(state.fifo_lines.get(team, []), sorted(extra.get(team, [])))

    lines = [heapq.merge(*(line(t) for t in teams))] if policy.head_of_line == "all" else [line(t) for t in teams]
    jobs = state.jobs
    for entries in lines:
        for _, jid in entries:
            yield state.queue_key(jobs[jid])
            if jid in waiting:
                break


def select_victims(state: SchedulerState, job_id: str, now: float) -> list[tuple[str, PreemptionReason]] | None:
    """Which running jobs would be preempted to fit `job_id` now (computed only; nothing changes)."""
    job = state.jobs[job_id]
    work = Work(state, now)
    state.capacity.begin()
    try:
        found = preemption.select(work, job)
    finally:
        state.capacity.end()
    return None if found is None else [(v.id, r) for v, r in found]
