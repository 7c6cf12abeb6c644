"""Cycle phase 4: which running jobs a waiting job may preempt, and the cheapest set that makes it fit.

Who may preempt whom is one pure rule, `eligible`; every search below asks it. The search only
computes (Kueue's `GetTargets`): it leaves the scratch view as it found it, and the cycle turns
its answer into `Preempt` decisions.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable, Iterator
from itertools import islice, tee
from typing import TYPE_CHECKING

from events import PreemptionReason, PriorityClass
from services.scheduler.core import placement, quota
from services.scheduler.core.policy import RANKS
from services.scheduler.core.state import Job, derived
from services.scheduler.core.work import Usage, Work

if TYPE_CHECKING:
    import numpy as np

CRITICAL_RANK = PriorityClass.CRITICAL.rank

Victims = list[tuple[Job, PreemptionReason]]


def eligible(
    team: str,
    rank: int,
    victim_team: str,
    victim_rank: int,
    *,
    reclaim: bool,
    victim_borrowing: bool,
    urgent: bool = False,
) -> PreemptionReason | None:
    """May a job of `team` at priority `rank` preempt a preemptible job of `victim_team` at
    `victim_rank`, and why? (Lower rank is more urgent.)

    - PRIORITY: a more urgent job of the same team;
    - RECLAIM: the preemptor's team is within its guarantee (`reclaim`) and the victim's team is
      borrowing; never a more urgent job than the reclaimer (Kueue's reclaimWithinCohort
      LowerOrNewerEqualPriority): else reclaim and critical preemption could undo each other
      forever (a critical borrower reclaimed by low work, then preempting it back);
    - RECLAIM too: the preemptor is non-preemptible (`urgent`) and the victim is of a lower class
      and its team is borrowing: urgent work that may not borrow is not held back by preemptible
      borrowers of lower classes (no priority inversion). It takes only borrowed capacity, and
      the quota rule keeps its team's non-preemptible GPUs within what nobody else is promised
      or lent to such work (returned by draining), so every guarantee comes back (quota.py);
    - PRIORITY too: the preemptor is non-preemptible and the victim is of a lower class, of any
      team, borrowing or not: preemptible work was promised nothing, so a waiting more urgent job
      does not stand behind it (strict priority). The quota rule still bounds what the preemptor's
      team holds (its fair share), and what it holds of another team's guarantee drains back;
    - CRITICAL: critical work preempts less urgent work of any team.
    """
    if victim_team == team:
        return PreemptionReason.PRIORITY if victim_rank > rank else None
    if victim_borrowing and ((reclaim and victim_rank >= rank) or (urgent and victim_rank > rank)):
        return PreemptionReason.RECLAIM
    if urgent and victim_rank > rank:
        return PreemptionReason.PRIORITY
    if rank == CRITICAL_RANK and victim_rank > rank:
        return PreemptionReason.CRITICAL
    return None


def lost_work_gpu_s(job: Job, now: float) -> float:
    """Work lost if preempted now: time since the last checkpoint (or start) x GPUs."""
    since = job.started_at if job.started_at is not None else job.running_since
    elapsed = max(0.0, now - since) if since is not None else 0.0
    interval = job.spec.checkpoint_interval_s
    if interval:
        elapsed = elapsed % interval
    return elapsed * job.gpus


def wait_again_gpu_s(job: Job, bound_s: float | None) -> float:
    """What throwing a running job back into the queue costs besides its lost work, if it waited at
    least `bound_s` (the starvation bound) before this run: its GPUs x that wait, the wait it is
    likely to face again (a job that started at once is cheap to requeue; one that starved is not).
    0 without a bound, or for a job that started sooner."""
    if bound_s is None or job.running_since is None:
        return 0.0
    waited = job.running_since - job.queued_since  # queued_since: when it last joined the queue
    return waited * job.gpus if waited >= bound_s else 0.0


def victim_cost(job: Job, now: float) -> float:
    """The victim order's cost: work lost if preempted now, times one more than the times the job
    was preempted before. A job without checkpoints re-runs from the start after each preemption, so
    taking the same long job again and again (cheap each time, just after its restart) delays its
    end most: on the ITP trace the unweighted order set the makespan (README, issue 19)."""
    return lost_work_gpu_s(job, now) * (1 + job.preemptions)


def _reclaims(work: Work, job: Job) -> bool:
    """The job's team would stay within its guarantee with it: it may reclaim borrowed GPUs."""
    q = work.s.quotas.get((job.pool, job.spec.team))
    return q is not None and work.usage.get((job.pool, job.spec.team), 0) + job.gpus <= q.guaranteed


def may_preempt(work: Work, job: Job) -> bool:
    """A cheap test that some victim could exist, before the real search."""
    pool, team, rank = job.pool, job.spec.team, job.spec.priority.rank
    reclaim, urgent = _reclaims(work, job), not job.spec.preemptible
    return work.memo(("may", pool, team, rank, reclaim, urgent), _any_victim, work, pool, team, rank, reclaim, urgent)


def _any_victim(work: Work, pool: str, team: str, rank: int, reclaim: bool, urgent: bool) -> bool:
    for (p, t, r), gpus in work.preemptible.items():
        if p != pool or gpus <= 0:
            continue
        if eligible(team, rank, t, r, reclaim=reclaim, victim_borrowing=quota.borrowing(work, p, t), urgent=urgent):
            return True
    return False


def select(work: Work, job: Job, *, indexed: bool = True) -> Victims | None:
    """The victims that let `job` fit, losing the least; None if no set does. Leaves no trace.

    Victim order: borrowed capacity first, then lowest priority, then least `victim_cost`, then id.
    A job that fits on one node frees one node (the one whose victims lose least); a larger
    gang takes victims in order until it fits, then gives back the ones it did not need.
    `indexed`: the one-node search reads only the victims on the nodes that can first get room
    (`_first_to_fill`), and a gang's search stops reading a team none of whose jobs can be a victim
    any more (`_reasoned_short`): the same answers as walking every victim, which `indexed=False`
    does (the tests compare the two)."""
    cap, pool, team, rank = work.cap, job.pool, job.spec.team, job.spec.priority.rank
    reclaim, urgent = _reclaims(work, job), not job.spec.preemptible
    classes = set(work.classes(job))
    # Bounds first, from counters: even with every eligible GPU freed, would quota and free
    # GPUs allow the job? Most hopeless searches end here without looking at a single job.
    usage = dict(work.usage)
    freeable: float = 0
    for (p, t, r), gpus in work.preemptible.items():
        if (
            p == pool
            and gpus > 0
            and eligible(team, rank, t, r, reclaim=reclaim, victim_borrowing=quota.borrowing(work, p, t), urgent=urgent)
            is not None
        ):
            usage[(p, t)] = usage.get((p, t), 0) - gpus
            freeable += gpus
    if quota.block(work, job, usage) is not None:
        return None
    # With GPUs shared, preempting x GPU-equivalents may free more whole GPUs than x: no bound from counts.
    if not work.s.shared_nodes and cap.free_in(list(classes)) + freeable < job.gpus:
        return None
    groups = _groups(work, pool, team, rank, reclaim, urgent)
    candidates = _in_order(work, pool, groups)
    usage = dict(work.usage)
    mark = cap.mark()
    try:
        if job.gpus <= cap.max_gpus:
            early = _first_to_fill(work, job, classes, groups) if indexed else iter(())
            if early is None and job.spec.replicas == 1:
                return None  # no node can get room
            if early is not None:
                found = _free_one_node(work, job, early, classes, usage, reclaim)
                if found is None:  # not among the first to fill (or nothing read): the whole walk
                    # Read twice, each time only as far as needed: tee keeps what this reading took.
                    first, candidates = tee(candidates)
                    found = _free_one_node(work, job, first, classes, usage, reclaim)
                if found is not None or job.spec.replicas == 1:
                    return found
        if indexed:
            pairs = _reasoned_short(work, job, groups, usage, reclaim)
        else:
            pairs = _reasoned(work, job, candidates, usage, reclaim)
        return _free_nodes_for_gang(work, job, pairs, classes, usage)
    finally:
        cap.rollback(mark)


Groups = dict[tuple[int, int], list[tuple[str, int]]]  # (borrowing first, -rank) -> [(team, rank)]


def _groups(work: Work, pool: str, team: str, rank: int, reclaim: bool, urgent: bool) -> Groups:
    """The (team, priority) groups a preemptor of `team` at `rank` may preempt, by their place in
    victim order: borrowed capacity first, then lowest priority (borrowing judged at the start of
    the cycle: reclaim takes only from teams borrowing then, and their borrowing only shrinks)."""
    s = work.s
    by_class: Groups = {}
    for p, t in s.running:
        if p != pool:
            continue
        borrowing = quota.borrowing(work, p, t, s.usage)
        for r in RANKS:
            if eligible(team, rank, t, r, reclaim=reclaim, victim_borrowing=borrowing, urgent=urgent):
                by_class.setdefault((0 if borrowing else 1, -r), []).append((t, r))
    return by_class


def _in_order(work: Work, pool: str, by_class: Groups) -> Iterator[Job]:
    """The jobs of the groups (not preempted or admitted in this cycle already), in victim order:
    by group (`_groups`), then least `victim_cost`, then id. A group is sorted only when the walk
    reaches it, once per cycle: a search usually stops in its first group."""
    gone, fresh = work.gone, work.fresh
    for key in sorted(by_class):
        walks = [_group(work, pool, t, r) for t, r in sorted(by_class[key])]
        # (cost, id, job): ids are unique, so jobs are never compared
        for _, jid, v in walks[0] if len(walks) == 1 else heapq.merge(*walks):
            if jid not in gone and jid not in fresh:
                yield v


def _first_to_fill(work: Work, job: Job, classes: set[int], by_class: Groups) -> Iterator[Job] | None:
    """The victims `_free_one_node` needs to read to find its answer, in its order, if they can be
    told from the state's per-node counts (`Derived.node_gpus`) without walking every victim: the
    jobs of the groups up to the first place in victim order (`_groups`' key) where some node's free
    GPUs and the GPUs those groups list there reach what the job needs, on the nodes that reach it
    there. The walk counts exactly those GPUs, so no other node can get room that early: the first
    node these jobs give room to is the walk's. None: no node can get room at all. Nothing to read
    (an empty iterator): walk them all, as cheap for a job of at most half a node where the groups
    before that place hold few jobs (the walk then reads few victims, one often frees enough, where
    this would order every victim on those nodes)."""
    s, pool, cap = work.s, job.pool, work.cap
    if not by_class:
        return None  # nothing to preempt (and no index to build for it)
    index = derived(s)
    groups = index.victim_groups(s.jobs)
    keys = [(pool, t, r) for v in by_class.values() for t, r in v]
    if (
        index.nodes is not s.nodes
        or any(k in index.partial for k in keys)
        or (2 * job.gpus <= cap.max_gpus and _FEW_NODES > 0)  # node by node, it may stop at the first with room
        or sum(len(index.node_gpus.get(k, ())) for k in keys) < _FEW_NODES
    ):
        return _first_to_fill_each(work, job, classes, by_class)
    # Column-wise over node ids: what each node has free (-1: the job may not use it), what the groups
    # so far list there, and whether they list anything there (the nodes `_first_to_fill_each` reads).
    import numpy as np  # here, not at import: `chamber up` and the CLI read this module without numpy

    n = len(cap.slots)
    free, cls_of = _ints(cap.free_col, n), _ints(cap.cls_col, n)
    may = cls_of == next(iter(classes)) if len(classes) == 1 else np.isin(cls_of, list(classes))
    free = np.where(may, free, -1)
    held, listed = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    before = 0  # jobs of the groups before the one read
    upto: Groups = {}
    for cls in sorted(by_class):
        upto[cls] = by_class[cls]
        for t, r in by_class[cls]:
            cols = index.on_nodes.get((pool, t, r))
            if cols is not None:
                m = min(n, len(cols[0]))
                held[:m] += _ints(cols[0], m)
                listed[:m] |= _ints(cols[1], m) > 0
        roomy = np.flatnonzero(listed & (free >= 0) & (held + free >= job.gpus))
        if len(roomy):
            if before < _FEW_BEFORE and 2 * job.gpus <= cap.max_gpus:
                return iter(())
            at = s.node_by_id
            return _victims_on(work, pool, upto, {(at[i].cluster, at[i].name) for i in roomy.tolist()})
        before += sum(len(groups.get((pool, t, r), ())) for t, r in by_class[cls])
    return None


def _first_to_fill_each(work: Work, job: Job, classes: set[int], by_class: Groups) -> Iterator[Job] | None:
    """`_first_to_fill` node by node, from the groups' per-node entries (for groups not kept as columns)."""
    s, pool, cap = work.s, job.pool, work.cap
    if not by_class:
        return None  # nothing to preempt (and no index to build for it)
    index = derived(s)
    groups = index.victim_groups(s.jobs)
    before = 0  # jobs of the groups before the one read
    # the most GPUs free on a node of the job's classes (the index buckets nodes by free GPUs):
    # a node's own free GPUs are looked up only where they could make the difference
    top = max((k for c in classes for k in range(len(cap.buckets[c]) - 1, 0, -1) if cap.buckets[c][k]), default=0)
    free: dict[tuple[str, str], int] = {}  # node -> its free GPUs, -1 if the job may not use it
    slots, nodes, need = cap.slots, s.nodes, job.gpus
    held: dict[tuple[str, str], int] = {}  # node -> GPUs the groups so far list there
    upto: Groups = {}
    for cls in sorted(by_class):
        upto[cls] = by_class[cls]
        roomy: set[tuple[str, str]] = set()
        for t, r in by_class[cls]:
            for key, n in index.node_gpus.get((pool, t, r), {}).items():
                got = held[key] = held.get(key, 0) + n
                if got + top < need:
                    continue
                f = free.get(key)
                if f is None:
                    node = nodes.get(key)  # _free_for, inlined: read for most of the fleet's nodes
                    slot = None if node is None else slots[node.nid]
                    f = free[key] = len(slot.free) if slot is not None and slot.cls in classes and slot.usable else -1
                if f >= 0 and got + f >= need:
                    if before < _FEW_BEFORE and 2 * need <= cap.max_gpus:
                        return iter(())
                    roomy.add(key)
        if roomy:
            return _victims_on(work, pool, upto, roomy)
        before += sum(len(groups.get((pool, t, r), ())) for t, r in by_class[cls])
    return None


_FEW_BEFORE = 64
# Below this many node entries in the groups, reading them one by one is cheaper; so it is for a job of
# at most half a node, which usually stops at the first node with room (0, for tests: always columns).
_FEW_NODES = 512


def _ints(column: array[int], n: int) -> np.ndarray:
    """The first `n` rows of an int64 `array` column, as numpy (no copy; a short column reads as is)."""
    import numpy as np

    return np.frombuffer(column, dtype=np.int64, count=min(n, len(column)))


def _victims_on(work: Work, pool: str, by_class: Groups, roomy: set[tuple[str, str]]) -> Iterator[Job]:
    """The groups' jobs placed on the `roomy` nodes, in `_in_order`'s order (the same costs), each
    class ordered only as far as read (`Walk`): with many roomy nodes the first few victims decide."""
    gone, fresh, jobs_on = work.gone, work.fresh, derived(work.s).node_jobs
    for cls in sorted(by_class):
        members: dict[str, Job] = {}
        for t, r in by_class[cls]:
            on = jobs_on.get((pool, t, r), {})
            if len(roomy) < len(on):  # the order of `members` does not matter: the walk sorts them
                for key in roomy:
                    if (jobs := on.get(key)) is not None:
                        members.update(jobs)
                continue
            for key, jobs in on.items():
                if key in roomy:
                    members.update(jobs)
        for _, jid, v in Walk(_costs(members, work.now)):
            if jid not in gone and jid not in fresh:
                yield v


class Walk:
    """Running jobs as (victim cost, id, job), in that order, ordered only as far as the walks have
    read: a heap (built in linear time) popped into `done` on demand. A search usually stops after a
    few jobs of its first group, so most of a large group is never sorted."""

    def __init__(self, items: list[tuple[float, str, Job]]) -> None:
        heapq.heapify(items)
        self.heap = items
        self.done: list[tuple[float, str, Job]] = []

    def __iter__(self) -> Iterator[tuple[float, str, Job]]:
        done, heap = self.done, self.heap
        i = 0
        while heap:
            if i == len(done):
                if i >= _POPS_BEFORE_SORT:
                    self.finish()  # a long walk: one sort in C beats a pop per job
                    break
                done.append(heapq.heappop(heap))
            yield done[i]
            i += 1
        yield from islice(done, i, None)  # all in order now: no more pops

    def finish(self) -> list[tuple[float, str, Job]]:
        """Every job, in order (the rest of the heap sorted at once)."""
        if self.heap:
            self.done.extend(sorted(self.heap))
            self.heap.clear()
        return self.done


_POPS_BEFORE_SORT = 32


def _group(work: Work, pool: str, team: str, rank: int) -> Walk:
    """Running preemptible jobs of one team and priority, least `victim_cost` first (the state keeps
    them grouped; a group's costs are computed when a walk first reaches it in a cycle)."""
    walk = work.walks.get((pool, team, rank))
    if walk is None:
        index = derived(work.s)
        members = index.victim_groups(work.s.jobs).get((pool, team, rank), {})
        columns = index.costs.get((pool, team, rank))
        if columns is not None and len(members) >= _FEW_FOR_COLUMNS:
            items = columns.costs(work.now)  # the same jobs (kept together by the fold), the same costs
        else:
            items = _costs(members, work.now)
        walk = work.walks[(pool, team, rank)] = Walk(items)
    return walk


_FEW_FOR_COLUMNS = 64  # below this many jobs in a group, its costs are computed job by job


def _costs(members: dict[str, Job], now: float) -> list[tuple[float, str, Job]]:
    """(victim_cost, id, job) of each job, `victim_cost` inlined (the same float operations in
    the same order): a search reads every member of the groups it reaches."""
    items: list[tuple[float, str, Job]] = []
    append = items.append
    for jid, v in members.items():
        since = v.started_at
        if since is None:
            since = v.running_since
        elapsed = 0.0
        if since is not None and (d := now - since) > 0.0:  # max(0.0, now - since), without the call
            elapsed = d
        interval = v.spec.checkpoint_interval_s
        if interval:
            elapsed = elapsed % interval
        append((elapsed * v.gpus * (1 + v.preemptions), jid, v))
    return items


class _Reasons:
    """Why a victim may be preempted by `job`, judging its team's borrowing by `held` (the search's
    running count of what the team holds: reclaim stops once it is back within its guarantee).
    A search asks for every job it walks, so the answers are kept per (team, priority, borrowing)."""

    def __init__(self, work: Work, job: Job, reclaim: bool) -> None:
        self.work, self.job, self.reclaim = work, job, reclaim
        self.known: dict[tuple[str, int, bool], PreemptionReason | None] = {}
        self.guarantees: dict[str, int] = {}  # team -> its guarantee in the job's pool

    def guarantee(self, team: str) -> int:
        """The team's guarantee in the job's pool."""
        g = self.guarantees.get(team)
        if g is None:
            g = self.guarantees[team] = self.work.guarantee(self.job.pool, team)
        return g

    def __call__(self, victim: Job, held: float) -> PreemptionReason | None:
        job, spec = self.job, victim.spec
        vt = spec.team
        g = self.guarantee(vt)
        key = (vt, spec.priority.rank, held > g)
        if key in self.known:
            return self.known[key]
        found = self.known[key] = eligible(
            job.spec.team,
            job.spec.priority.rank,
            vt,
            key[1],
            reclaim=self.reclaim,
            victim_borrowing=key[2],
            urgent=not job.spec.preemptible,
        )
        return found


def _free_one_node(
    work: Work, job: Job, candidates: Iterable[Job], classes: set[int], usage: Usage, reclaim: bool
) -> Victims | None:
    """Walk victims in order, counting what each node would free; the first node with room
    (and quota) wins: its victims are the cheapest that make the job fit on one node."""
    slots, nodes, need, nids_of = work.cap.slots, work.s.nodes, job.gpus, derived(work.s).nids_of
    reasons = _Reasons(work, job, reclaim)
    freed: dict[int, int] = {}
    chosen: dict[int, Victims] = {}
    delta: dict[int, Usage] = {}
    for v in candidates:
        vkey = (v.pool, v.spec.team)
        for nid, n in nids_of(v, nodes):
            slot = slots[nid]
            if slot.cls not in classes or not slot.usable:
                continue
            local = delta.get(nid)
            if local is None:  # first seen: what is free there counts (the walk changes nothing)
                local, chosen[nid], freed[nid] = delta.setdefault(nid, {}), [], len(slot.free)
            reason = reasons(v, usage.get(vkey, 0) + local.get(vkey, 0))
            if reason is None:
                continue
            local[vkey] = local.get(vkey, 0) - v.gpus
            mine = chosen[nid]
            mine.append((v, reason))
            got = freed[nid] = freed[nid] + n
            if got >= need and _fits_without(work, job, mine, usage):
                return mine
    return None


def _fits_without(work: Work, job: Job, chosen: Victims, usage: Usage) -> bool:
    local = dict(usage)
    for v, _ in chosen:
        work.count(v, -1, local)
    if quota.block(work, job, local) is not None:  # cheap, before touching the index
        return False
    mark = work.cap.mark()
    for v, _ in chosen:
        work.give_back(v)  # whole GPUs and shares (a share frees room only where it is)
    ok = placement.fits(work, job, local)
    work.cap.rollback(mark)
    return ok


def _reasoned(work: Work, job: Job, candidates: Iterable[Job], usage: Usage, reclaim: bool) -> Iterator[Reasoned]:
    """The candidates a gang's search counts, and why: each team's borrowing judged by what the
    search has counted so far (`_Reasons`: reclaim stops once the team is back within its guarantee)."""
    may, local, pool = _Reasons(work, job, reclaim), dict(usage), job.pool
    for v in candidates:
        reason = may(v, local.get((pool, v.spec.team), 0))
        if reason is not None:
            work.count(v, -1, local)
            yield v, reason


def _reasoned_short(work: Work, job: Job, by_class: Groups, usage: Usage, reclaim: bool) -> Iterator[Reasoned]:
    """What `_reasoned` yields from `_in_order`, without reading on through a team once none of its
    jobs can be a victim: it no longer borrows (what it holds only shrinks as the search counts
    its jobs) and none of its groups may be preempted from a team that does not borrow. Its later
    groups are then never ordered (a reclaim usually takes a few jobs of a borrower, not all).
    A group's jobs share its team and priority (a running job's class never changes), so each is
    judged from those and its team's count, and counted (`Work.count`, inlined) by its GPUs only."""
    may, local, pool = _Reasons(work, job, reclaim), dict(usage), job.pool
    quiet = _quiet(job, by_class, reclaim)
    done: set[str] = set()
    gone, fresh, known = work.gone, work.fresh, may.known
    for key in sorted(by_class):
        rank = -key[1]
        walks = {t: _group(work, pool, t, r) for t, r in sorted(by_class[key]) if t not in done}
        for jid, v, t in _merged(walks, done):
            if jid in gone or jid in fresh:
                continue
            vkey = (pool, t)
            held = local.get(vkey, 0)
            g = may.guarantee(t)
            k = (t, rank, held > g)
            reason = known[k] if k in known else may(v, held)
            if reason is None:
                if t in quiet and held <= g:
                    done.add(t)  # every later job of the team would be refused the same
                continue
            left = held - v.gpus
            local[vkey] = round(left, 6) if left.__class__ is float else left
            yield v, reason


def _quiet(job: Job, by_class: Groups, reclaim: bool) -> set[str]:
    """The teams none of whose groups may be preempted once the team does not borrow."""
    team, rank, urgent = job.spec.team, job.spec.priority.rank, not job.spec.preemptible
    quiet = {t for pairs in by_class.values() for t, _ in pairs}
    for pairs in by_class.values():
        for t, r in pairs:
            if eligible(team, rank, t, r, reclaim=reclaim, victim_borrowing=False, urgent=urgent):
                quiet.discard(t)
    return quiet


Reasoned = tuple[Job, PreemptionReason]


def _merged(walks: dict[str, Walk], done: set[str]) -> Iterator[tuple[str, Job, str]]:
    """The walks' jobs in order (as `heapq.merge`), a team's no further once it is in `done`: each
    as (id, job, team)."""
    if len(walks) == 1:
        ((t, walk),) = walks.items()
        for _, jid, v in walk:
            if t in done:
                return
            yield jid, v, t
        return
    heap = []
    for i, (t, walk) in enumerate(walks.items()):
        it = iter(walk)
        first = next(it, None)
        if first is not None:
            heap.append((first, i, t, it))
    heapq.heapify(heap)  # (cost, id, job) first: ids are unique, so nothing after them is compared
    while heap:
        item, i, t, it = heap[0]
        if t in done:
            heapq.heappop(heap)
            continue
        yield item[1], item[2], t
        following = next(it, None)
        if following is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (following, i, t, it))


def _free_nodes_for_gang(
    work: Work, job: Job, candidates: Iterable[Reasoned], classes: set[int], usage: Usage
) -> Victims | None:
    """Walk victims in order, counting the replicas each node could then hold; once the gang
    has room, keep only the victims on nodes that gained a replica."""
    per, replicas = job.spec.gpus_per_replica, job.spec.replicas
    slots, nodes, nids_of = work.cap.slots, work.s.nodes, derived(work.s).nids_of
    need = replicas - work.cap.replicas_fit(list(classes), per)
    start: dict[int, int] = {}
    freed: dict[int, int] = {}
    on_node: dict[int, list[Job]] = {}
    reasons: dict[str, PreemptionReason] = {}
    got = 0
    for v, reason in candidates:
        reasons[v.id] = reason
        for nid, n in nids_of(v, nodes):
            before = freed.get(nid)
            if before is None:  # a node first seen: whether the job may use it, and what is free there
                slot = slots[nid]
                if slot.cls not in classes or not slot.usable:
                    continue
                before = start[nid] = len(slot.free)
                on_node[nid] = []
            after = freed[nid] = before + n
            on_node[nid].append(v)
            got += after // per - before // per
        if got >= need:
            chosen: dict[str, Job] = {}
            for nid, vs in on_node.items():
                if freed[nid] // per > start[nid] // per:
                    chosen.update((x.id, x) for x in vs)
            picked = [(x, reasons[x.id]) for x in chosen.values()]
            if _fits_without(work, job, picked, usage):
                return picked
    return None
