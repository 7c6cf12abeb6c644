"""One scheduling cycle: `schedule(state, now, since) -> Cycle` (pure: the state is left unchanged).

Phases (after Kueue's scheduler loop):
  1. requeue    jobs holding a GPU or node that went out of service give it back and rejoin the queue
  2. heads      the queue in order (priority class, fair share, submit time, job id); a full cycle
                looks at every queued job, an incremental one (nothing freed, no rule changed since
                the last cycle's mark) only at the jobs that joined the queue since
  3. nominate   per job: backfill check against its pool's reservation, quota check, placement
  4. preempt    a job that does not fit may preempt (same team by priority, reclaim of borrowed
                capacity, critical across classes) when `select_victims` finds a set that makes it fit
  5. admit      placements and victims are applied to the cycle's scratch view, so later jobs see
                them; a job still waiting records why, and the first job of a pool blocked for
                capacity gets an EASY-backfill reservation
The cycle works on the live capacity index with a journal and rolls it back at the end; the
decisions only take effect when their events are folded back by `evolve`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from events import Placement, PreemptionReason
from services.scheduler.core.decisions import Admit, Cycle, CycleMark, Decision, Preempt, Requeue, Reservation
from services.scheduler.core.policy import CHAMBER, ORDERINGS, Policy
from services.scheduler.core.pools import DEFAULT_POOL
from services.scheduler.core.state import QUEUED, Job, JobState, SchedulerState

Spot = list[tuple[int, list[int]]]  # (node id, GPU indices) per node


def estimate_s(job: Job) -> float | None:
    """The runtime estimate used for backfill: the user's estimate, else the simulated duration."""
    return job.spec.expected_duration_s or job.spec.sim_duration_s


def lost_work_gpu_s(job: Job, now: float) -> float:
    """Work lost if preempted now: time since the last checkpoint (or start) x GPUs."""
    since = job.started_at if job.started_at is not None else job.running_since
    elapsed = max(0.0, now - since) if since is not None else 0.0
    interval = job.spec.checkpoint_interval_s
    if interval:
        elapsed = elapsed % interval
    return elapsed * job.gpus


class Work:
    """The cycle's scratch view: the live capacity index (journaled) plus copies of small tables."""

    def __init__(self, state: SchedulerState, now: float, policy: Policy = CHAMBER) -> None:
        self.s = state
        self.now = now
        self.policy = policy
        self.cap = state.capacity
        self.usage = dict(state.usage)
        self.preemptible = dict(state.preemptible)
        self.gone: set[str] = set()  # running jobs preempted or requeued in this cycle
        self.fresh: dict[str, Spot] = {}  # admitted in this cycle: never victims in the same cycle
        self._classes: dict[tuple[str, str | None, str | None], list[int]] = {}
        self._pool_classes: dict[str, list[int]] = {}
        self._groups: dict[tuple[str, str], list[list[Job]]] = {}
        self._lost: dict[str, float] = {}
        self._sorted: set[tuple[str, str, int]] = set()

    # -- lookups -------------------------------------------------------------------------------
    def classes(self, job: Job) -> list[int]:
        model, cluster = job.spec.gpu_model, job.spec.cluster
        key = (job.pool, model.lower() if model else None, cluster)
        found = self._classes.get(key)
        if found is None:
            found = self._classes[key] = [
                cid
                for cid, (pool, cl, m) in enumerate(self.cap.class_keys)
                if pool == job.pool and (model is None or m.lower() == key[1]) and (cluster is None or cl == cluster)
            ]
        return found

    def pool_capacity(self, pool: str) -> int:
        cls = self._pool_classes.get(pool)
        if cls is None:
            cls = self._pool_classes[pool] = [c for c, k in enumerate(self.cap.class_keys) if k[0] == pool]
        return sum(self.cap.class_total[c] for c in cls)

    def guarantee(self, pool: str, team: str) -> int:
        q = self.s.quotas.get((pool, team))
        return q.guaranteed if q else 0

    # -- quota ---------------------------------------------------------------------------------
    def quota_block(self, job: Job, usage: dict[tuple[str, str], int] | None = None) -> str | None:
        """Why the team's quota does not allow this job now, or None if it does."""
        if not self.policy.quotas:
            return None
        usage = self.usage if usage is None else usage
        pool, team, n = job.pool, job.spec.team, job.gpus
        q = self.s.quotas.get((pool, team))
        g = q.guaranteed if q else 0
        u = usage.get((pool, team), 0)
        if not self.policy.borrowing and u + n > g:
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
        teams = {t for (p, t) in self.s.quotas if p == pool} | {t for (p, t) in usage if p == pool}
        for other in teams:
            if other != team:
                oq = self.s.quotas.get((pool, other))
                held += max(usage.get((pool, other), 0), oq.locked if oq else 0)
        room = self.pool_capacity(pool) - held - u
        if held and n > room:  # with nothing held by others, placement itself says what is missing
            return (
                f"quota: pool {pool} has {max(room, 0)} GPUs team {team} may use now "
                f"(others hold or keep back {held}); needs {n}"
            )
        return None

    def borrowed(self, job: Job) -> int:
        g = self.guarantee(job.pool, job.spec.team)
        u = self.usage.get((job.pool, job.spec.team), 0)
        return max(0, u + job.gpus - g) - max(0, u - g)

    # -- scratch changes -----------------------------------------------------------------------
    def _count(self, job: Job, sign: int, usage: dict[tuple[str, str], int] | None = None) -> None:
        usage = self.usage if usage is None else usage
        key = (job.pool, job.spec.team)
        usage[key] = usage.get(key, 0) + sign * job.gpus
        if usage is self.usage and job.spec.preemptible:
            pkey = (job.pool, job.spec.team, job.spec.priority.rank)
            self.preemptible[pkey] = self.preemptible.get(pkey, 0) + sign * job.gpus

    def _held(self, job: Job) -> list[tuple[int, list[int]]]:
        """The healthy GPUs a running job holds, per node id."""
        out = []
        for p in job.placements:
            node = self.s.nodes.get((p.cluster, p.node))
            if node is not None:
                out.append(
                    (node.nid, [i for i in p.gpu_indices if node.owners.get(i) == job.id and i not in node.bad_gpus])
                )
        return out

    def release(self, job: Job) -> None:
        for nid, gpus in self._held(job):
            self.cap.give(nid, gpus)
        self._count(job, -1)
        self.gone.add(job.id)

    def admit(self, job: Job, spot: Spot) -> tuple[Placement, ...]:
        self._count(job, +1)
        self.fresh[job.id] = spot
        nodes = self.s.node_by_id
        return tuple(Placement(cluster=nodes[nid].cluster, node=nodes[nid].name, gpu_indices=g) for nid, g in spot)

    # -- placement -----------------------------------------------------------------------------
    def could_fit(self, job: Job) -> bool:
        classes = self.classes(job)
        n = job.gpus
        if self.cap.free_in(classes) < n:
            return False
        if job.spec.replicas == 1:
            return self.cap.max_free(classes) >= n
        return self.cap.replicas_fit(classes, job.spec.gpus_per_replica) >= job.spec.replicas

    def place(self, job: Job) -> Spot | None:
        """Take GPUs for the job on the scratch index (the caller rolls back if it does not keep them).

        A job that fits on one node stays on one node (best fit); a larger gang is placed replica
        by replica, preferring one topology domain, then one cluster (a job never spans clusters)."""
        cap = self.cap
        classes = self.classes(job)
        if not classes:
            return None
        per, replicas = job.spec.gpus_per_replica, job.spec.replicas
        n = per * replicas
        if n <= cap.max_gpus:
            nid = cap.best_fit(classes, n)
            if nid is not None:
                return [(nid, cap.take(nid, n))]
            if replicas == 1:
                return None
        if per > cap.max_gpus or cap.free_in(classes) < n:
            return None
        clusters: dict[str, list[int]] = {}
        for c in classes:
            clusters.setdefault(cap.class_keys[c][1], []).append(c)
        key = job.spec.topology_key
        if key and key != self.s.topology_key:
            spot = self._fill_by_label(job, clusters, key)
            if spot is not None:
                return spot
        # Best fit among groups too: the emptiest-but-sufficient rack keeps big ones whole.
        in_domain = []
        dom_free = cap.dom_free
        for cluster, cls in clusters.items():
            if len(cls) == 1:
                c = cls[0]
                in_domain.extend((f, cluster, d, cls) for d in cap.class_domains[c] if (f := dom_free[(c, d)]) >= n)
                continue
            for domain in set().union(*(cap.class_domains[c] for c in cls)):
                free = sum(dom_free.get((c, domain), 0) for c in cls)
                if free >= n:
                    in_domain.append((free, cluster, domain, cls))
        for _, _, domain, cls in sorted(in_domain):
            spot = cap.fill(cls, per, replicas, domain)
            if spot is not None:
                return spot
        for free, _, cls in sorted((cap.free_in(cls), cluster, cls) for cluster, cls in clusters.items()):
            if free >= n:
                spot = cap.fill(cls, per, replicas)
                if spot is not None:
                    return spot
        return None

    def _fill_by_label(self, job: Job, clusters: dict[str, list[int]], key: str) -> Spot | None:
        """A gang naming a topology label the index does not bucket by: group free nodes by that
        label's value (a scan of the free nodes, for such gangs only), best-fit domain first."""
        cap, nodes = self.cap, self.s.node_by_id
        per, replicas = job.spec.gpus_per_replica, job.spec.replicas
        for _, cls in sorted(clusters.items()):
            groups: dict[str, tuple[int, set[int]]] = {}
            for c in cls:
                for k in range(per, cap.max_gpus + 1):
                    for nid in cap.buckets[c][k]:
                        value = nodes[nid].labels.get(key)
                        if value is not None:
                            free, members = groups.get(value, (0, set()))
                            members.add(nid)
                            groups[value] = (free + (k // per) * per, members)
            for free, _, members in sorted((f, v, m) for v, (f, m) in groups.items()):
                if free >= job.gpus:
                    spot = cap.fill(cls, per, replicas, only=members)
                    if spot is not None:
                        return spot
        return None

    def fits(self, job: Job, usage: dict[tuple[str, str], int]) -> bool:
        if self.quota_block(job, usage) is not None:
            return False
        mark = self.cap.mark()
        spot = self.place(job)
        self.cap.rollback(mark)
        return spot is not None

    # -- preemption ----------------------------------------------------------------------------
    def may_preempt(self, job: Job) -> bool:
        """A cheap test that some victim could exist, before the real search."""
        pool, team, rank = job.pool, job.spec.team, job.spec.priority.rank
        q = self.s.quotas.get((pool, team))
        reclaim = q is not None and self.usage.get((pool, team), 0) + job.gpus <= q.guaranteed
        for (p, t, r), gpus in self.preemptible.items():
            if p != pool or gpus <= 0:
                continue
            if t == team and r > rank:
                return True
            if t != team and (
                (rank == 0 and r > 0) or (reclaim and r >= rank and self.usage.get((p, t), 0) > self.guarantee(p, t))
            ):
                return True
        return False

    def victims(self, job: Job) -> list[tuple[Job, PreemptionReason]] | None:
        """The victims that let `job` fit, losing the least; None if no set does. Leaves no trace.

        Victim order: borrowed capacity first, then lowest priority, then least work lost, then id.
        A job that fits on one node frees one node (the one whose victims lose least); a larger
        gang takes victims in order until it fits, then gives back the ones it did not need."""
        s, pool, team, rank = self.s, job.pool, job.spec.team, job.spec.priority.rank
        q = s.quotas.get((pool, team))
        reclaim = q is not None and self.usage.get((pool, team), 0) + job.gpus <= q.guaranteed
        classes = set(self.classes(job))
        # Bounds first, from counters: even with every eligible GPU freed, would quota and free
        # GPUs allow the job? Most hopeless searches end here without looking at a single job.
        usage = dict(self.usage)
        freeable = 0
        for (p, t, r), gpus in self.preemptible.items():
            borrowing = self.usage.get((p, t), 0) > self.guarantee(p, t)
            if (
                p == pool
                and gpus > 0
                and (
                    (t == team and r > rank)
                    or (t != team and ((reclaim and borrowing and r >= rank) or (rank == 0 and r > 0)))
                )
            ):
                usage[(p, t)] = usage.get((p, t), 0) - gpus
                freeable += gpus
        if self.quota_block(job, usage) is not None or self.cap.free_in(list(classes)) + freeable < job.gpus:
            return None
        gone, fresh = self.gone, self.fresh
        candidates = (
            v for v in self._victims_in_order(pool, team, rank, reclaim) if v.id not in gone and v.id not in fresh
        )
        usage = dict(self.usage)
        mark = self.cap.mark()
        try:
            if job.spec.replicas == 1 and job.gpus <= self.cap.max_gpus:
                return self._free_one_node(job, candidates, classes, usage, reclaim)
            ordered = list(candidates)
            if job.gpus <= self.cap.max_gpus:
                found = self._free_one_node(job, ordered, classes, usage, reclaim)
                if found is not None:
                    return found
            return self._free_nodes_for_gang(job, ordered, classes, usage, reclaim)
        finally:
            self.cap.rollback(mark)

    def _victims_in_order(self, pool: str, team: str, rank: int, reclaim: bool) -> Iterator[Job]:
        """The jobs a preemptor of `team` at `rank` may preempt, in victim order: borrowed
        capacity first, then lowest priority, then least work lost, then id (borrowing judged at
        the start of the cycle). Jobs are grouped by (team, priority) and a group is sorted only
        when the walk reaches it, once per cycle: a search usually stops in its first group."""
        s = self.s
        by_class: dict[tuple[int, int], list[tuple[str, int]]] = {}
        for p, t in s.running:
            if p != pool:
                continue
            flag = 0 if s.usage.get((p, t), 0) > self.guarantee(p, t) else 1
            for r in range(4):
                # reclaim takes only from teams borrowing now (and their borrowing only shrinks)
                # Reclaim never takes a more urgent job than the reclaimer (Kueue's reclaimWithinCohort
                # LowerOrNewerEqualPriority): else reclaim and critical preemption could undo each
                # other forever (a critical borrower reclaimed by low work, then preempting it back).
                if (t == team and r > rank) or (
                    t != team and ((reclaim and flag == 0 and r >= rank) or (rank == 0 and r > 0))
                ):
                    by_class.setdefault((flag, -r), []).append((t, r))
        for key in sorted(by_class):
            lists = [self._group(pool, t, r) for t, r in sorted(by_class[key])]
            if len(lists) == 1:
                yield from lists[0]
            else:
                lost = self._lost
                yield from heapq.merge(*lists, key=lambda v: (lost[v.id], v.id))

    def _group(self, pool: str, team: str, rank: int) -> list[Job]:
        """Running preemptible jobs of one team and priority, least work lost first. A team's jobs
        are split by priority once per cycle; a group is sorted when a walk first reaches it."""
        key = (pool, team)
        groups = self._groups.get(key)
        if groups is None:
            groups = self._groups[key] = [[], [], [], []]
            jobs = self.s.jobs
            for jid in self.s.running.get(key, ()):
                v = jobs[jid]
                if v.spec.preemptible:
                    groups[v.spec.priority.rank].append(v)
        group = groups[rank]
        if (pool, team, rank) not in self._sorted:
            now, lost = self.now, self._lost
            for v in group:
                lost[v.id] = lost_work_gpu_s(v, now)
            group.sort(key=lambda v: (lost[v.id], v.id))
            self._sorted.add((pool, team, rank))
        return group

    def _free_one_node(
        self,
        job: Job,
        candidates: Iterable[Job],
        classes: set[int],
        usage: dict[tuple[str, str], int],
        reclaim: bool,
    ) -> list[tuple[Job, PreemptionReason]] | None:
        """Walk victims in order, counting what each node would free; the first node with room
        (and quota) wins: its victims are the cheapest that make the job fit on one node."""
        slots, nodes = self.cap.slots, self.s.nodes
        freed: dict[int, int] = {}
        chosen: dict[int, list[tuple[Job, PreemptionReason]]] = {}
        delta: dict[int, dict[tuple[str, str], int]] = {}
        for v in candidates:
            for p in v.placements:
                nid = nodes[(p.cluster, p.node)].nid
                slot = slots[nid]
                if slot.cls not in classes or not slot.usable:
                    continue
                local = delta.setdefault(nid, {})
                vkey = (v.pool, v.spec.team)
                seen = usage.get(vkey, 0) + local.get(vkey, 0)
                reason = self._reason(job, v, {vkey: seen}, reclaim)
                if reason is None:
                    continue
                local[vkey] = local.get(vkey, 0) - v.gpus
                chosen.setdefault(nid, []).append((v, reason))
                freed[nid] = freed.get(nid, len(slot.free)) + len(p.gpu_indices)
                if freed[nid] >= job.gpus and self._fits_without(job, chosen[nid], usage):
                    return chosen[nid]
        return None

    def _fits_without(
        self, job: Job, chosen: list[tuple[Job, PreemptionReason]], usage: dict[tuple[str, str], int]
    ) -> bool:
        local = dict(usage)
        for v, _ in chosen:
            self._count(v, -1, local)
        if self.quota_block(job, local) is not None:  # cheap, before touching the index
            return False
        mark = self.cap.mark()
        for v, _ in chosen:
            for nid, gpus in self._held(v):
                self.cap.give(nid, gpus)
        ok = self.fits(job, local)
        self.cap.rollback(mark)
        return ok

    def _free_nodes_for_gang(
        self,
        job: Job,
        candidates: Iterable[Job],
        classes: set[int],
        usage: dict[tuple[str, str], int],
        reclaim: bool,
    ) -> list[tuple[Job, PreemptionReason]] | None:
        """Walk victims in order, counting the replicas each node could then hold; once the gang
        has room, keep only the victims on nodes that gained a replica."""
        per, replicas = job.spec.gpus_per_replica, job.spec.replicas
        slots, nodes = self.cap.slots, self.s.nodes
        need = replicas - self.cap.replicas_fit(list(classes), per)
        start: dict[int, int] = {}
        freed: dict[int, int] = {}
        on_node: dict[int, list[Job]] = {}
        reasons: dict[str, PreemptionReason] = {}
        local = dict(usage)
        got = 0
        for v in candidates:
            reason = self._reason(job, v, local, reclaim)
            if reason is None:
                continue
            reasons[v.id] = reason
            self._count(v, -1, local)
            for p in v.placements:
                nid = nodes[(p.cluster, p.node)].nid
                slot = slots[nid]
                if slot.cls not in classes or not slot.usable:
                    continue
                before = freed.setdefault(nid, start.setdefault(nid, len(slot.free)))
                freed[nid] = before + len(p.gpu_indices)
                on_node.setdefault(nid, []).append(v)
                got += freed[nid] // per - before // per
            if got >= need:
                chosen: dict[str, Job] = {}
                for nid, vs in on_node.items():
                    if freed[nid] // per > start[nid] // per:
                        chosen.update((x.id, x) for x in vs)
                picked = [(x, reasons[x.id]) for x in chosen.values()]
                if self._fits_without(job, picked, usage):
                    return picked
        return None

    def _reason(
        self, job: Job, victim: Job, usage: dict[tuple[str, str], int], reclaim: bool
    ) -> PreemptionReason | None:
        if victim.spec.team == job.spec.team:
            return PreemptionReason.PRIORITY
        vt = victim.spec.team
        if (
            reclaim
            and victim.spec.priority.rank >= job.spec.priority.rank
            and usage.get((job.pool, vt), 0) > self.guarantee(job.pool, vt)
        ):
            return PreemptionReason.RECLAIM  # only while the victim's team is still borrowing
        if job.spec.priority.rank == 0 and victim.spec.priority.rank > 0:
            return PreemptionReason.CRITICAL
        return None

    def reservation(self, job: Job, key: tuple[int, float, float, str]) -> Reservation | None:
        """EASY backfill: when will enough GPUs be free for `job`, judging by runtime estimates?"""
        free = self.cap.free_in(self.classes(job))
        ends: list[tuple[float, int]] = []
        for (p, _), ids in self.s.running.items():
            if p != job.pool:
                continue
            for jid in ids:
                if jid in self.gone:
                    continue
                r = self.s.jobs[jid]
                est = estimate_s(r)
                if est is not None and r.running_since is not None:
                    ends.append((max(self.now, r.running_since + est), r.gpus))
        for jid in self.fresh:
            r = self.s.jobs[jid]
            est = estimate_s(r)
            if est is not None and r.pool == job.pool:
                ends.append((self.now + est, r.gpus))
        ends.sort()
        for end, gpus in ends:
            free += gpus
            if free >= job.gpus:
                return Reservation(job.id, key, job.gpus, end, free - job.gpus)
        return None  # running work has no estimates: nothing to reserve against


def _describe(spot: Spot, state: SchedulerState) -> str:
    nodes = state.node_by_id
    return ", ".join(f"{nodes[nid].name}[{','.join(map(str, g))}]" for nid, g in spot)


PREEMPTION_SEARCHES = CHAMBER.preemption_searches


def schedule(state: SchedulerState, now: float, since: CycleMark | None = None, *, policy: Policy = CHAMBER) -> Cycle:
    """Run one cycle. `since` is the previous cycle's mark: without it, or when capacity or rules
    changed since, every queued job is considered (full); else only newly queued ones.

    Victim searches are the costly part of a cycle on a full fleet, so, as Kueue nominates one head
    per queue, only the first waiting job of each (pool, team, priority) searches per cycle, and at
    most `policy.preemption_searches` searches run per cycle (in queue order)."""
    full = since is None or since.capacity_epoch != state.capacity_epoch or bool(state.displaced)
    work = Work(state, now, policy)
    state.capacity.begin()
    try:
        return _cycle(state, work, now, full, since, policy)
    finally:
        state.capacity.end()


def _cycle(state: SchedulerState, work: Work, now: float, full: bool, since: CycleMark | None, policy: Policy) -> Cycle:
    order = ORDERINGS[policy.order]
    decisions: list[Decision] = []
    waiting: dict[str, str] = {}
    jobs = state.jobs

    # 1. requeue: work on a GPU or node out of service goes back to the queue, keeping its place
    requeued: dict[str, Job] = {}
    for jid in sorted(state.displaced):
        job = jobs[jid]
        if job.state != JobState.RUNNING:
            continue
        nodes = sorted({p.node for p in job.placements})
        why, faults = _out_of_service(state, job)
        work.release(job)
        requeued[jid] = job
        decisions.append(
            Requeue(
                jid,
                f"a GPU or node it ran on went out of service ({'; '.join(why) or ', '.join(nodes)})",
                nodes[0] if nodes else None,
                job.generation,
                faults,
            )
        )

    # 2. heads, in queue order
    keys: Iterable[tuple[int, float, float, str]]
    reservations: dict[str, Reservation]
    if full or since is None:
        keys = sorted([*state.queue(), *(state.queue_key(j) for j in requeued.values())], key=order)
        reservations = {}
    else:
        new = set(state.pending_log[since.pending_seq :])
        keys = sorted((state.queue_key(jobs[j]) for j in new if jobs[j].state in QUEUED), key=order)
        reservations = dict(since.reservations)

    # 3-5. nominate, preempt, admit
    failed: dict[tuple[object, ...], str] = {}  # shapes that found no room this cycle: same answer
    considered = 0
    searched: set[tuple[str, str, int]] = set()  # (pool, team, priority) heads that searched for victims
    for key in keys:
        jid = key[3]
        job = jobs[jid]
        considered += 1
        spec = job.spec
        if job.pool != DEFAULT_POOL and job.pool not in state.pools:
            waiting[jid] = f"pool {job.pool} is not defined (define it with `chamber quota pool set`)"
            continue
        shape = (
            job.pool,
            spec.team,
            spec.priority,
            spec.gpu_model,
            spec.cluster,
            spec.gpus_per_replica,
            spec.replicas,
            spec.preemptible,
        )
        if shape in failed:
            waiting[jid] = failed[shape]
            continue
        res = reservations.get(job.pool)
        via_extra = False
        if res is not None and order(res.key) < order(key):
            est = estimate_s(job)
            if est is None or now + est > res.shadow_at:
                if job.gpus > res.extra_gpus:
                    waiting[jid] = (
                        f"backfill: would delay {res.job_id}, which has the GPUs reserved from about "
                        f"t={res.shadow_at:.0f} ({res.shadow_at - now:.0f}s from now)"
                    )
                    continue
                via_extra = True
        generation = job.generation + (1 if jid in requeued else 0)
        resume = job.ran_before
        block = work.quota_block(job)
        spot = work.place(job) if block is None and work.could_fit(job) else None
        if spot is not None:
            borrowed = work.borrowed(job)
            placements = work.admit(job, spot)
            why = f"placed on {_describe(spot, state)}"
            if borrowed:
                why += f", borrowing {borrowed} idle GPUs of pool {job.pool}"
            if res is not None and order(res.key) < order(key):
                why += f"; backfilled ahead of {res.job_id} without delaying it"
                if via_extra:
                    reservations[job.pool] = Reservation(
                        res.job_id, res.key, res.gpus, res.shadow_at, res.extra_gpus - job.gpus
                    )
            decisions.append(Admit(jid, spec.team, placements, borrowed, why, resume, generation, job.pool))
            continue
        head = (job.pool, spec.team, spec.priority.rank)
        if (
            policy.preemption
            and head not in searched
            and len(searched) < policy.preemption_searches
            and work.may_preempt(job)
        ):
            searched.add(head)
            victims = work.victims(job)
            if victims:
                kinds = sorted({r.value for _, r in victims})
                for v, reason in victims:
                    lost = lost_work_gpu_s(v, now)
                    decisions.append(
                        Preempt(
                            v.id,
                            v.spec.team,
                            reason,
                            jid,
                            lost,
                            f"preempted by {jid} ({reason.value}, {spec.priority.value} priority, team {spec.team})",
                            v.generation,
                        )
                    )
                    work.release(v)
                spot = work.place(job)
                assert spot is not None, "select_victims promised a fit"
                borrowed = work.borrowed(job)
                placements = work.admit(job, spot)
                names = ", ".join(v.id for v, _ in victims)
                why = f"placed on {_describe(spot, state)} after preempting {names} ({', '.join(kinds)})"
                decisions.append(Admit(jid, spec.team, placements, borrowed, why, resume, generation, job.pool))
                failed.clear()  # freed capacity may fit shapes that failed before
                continue
        if block is not None:
            why = block
        else:
            classes = work.classes(job)
            model = f" of model {spec.gpu_model}" if spec.gpu_model else ""
            why = (
                f"waiting for capacity: needs {spec.replicas}x{spec.gpus_per_replica} GPUs{model} in pool {job.pool}; "
                f"{work.cap.free_in(classes)} free, at most {work.cap.max_free(classes)} on one node"
            )
            if spec.gpus_per_replica > work.cap.max_gpus:
                why += f"; no node has {spec.gpus_per_replica} GPUs (the largest has {work.cap.max_gpus})"
            fits_ever = spec.gpus_per_replica <= work.cap.max_gpus and job.gpus <= sum(
                work.cap.class_total[c] for c in classes
            )
            if (
                policy.backfill and fits_ever and (res is None or order(key) < order(res.key))
            ):  # never reserve for what cannot fit
                new_res = work.reservation(job, key)
                if new_res is not None:
                    reservations[job.pool] = new_res
                    why += f"; GPUs reserved for it from about t={new_res.shadow_at:.0f}"
                    waiting[jid] = why
                    continue
        failed[shape] = why
        waiting[jid] = why

    mark = CycleMark(state.capacity_epoch, len(state.pending_log), tuple(sorted(reservations.items())))
    return Cycle(decisions, waiting, mark, full, considered, reservations)


def select_victims(state: SchedulerState, job_id: str, now: float) -> list[tuple[str, PreemptionReason]] | None:
    """Which running jobs would be preempted to fit `job_id` now (computed only; nothing changes)."""
    job = state.jobs[job_id]
    work = Work(state, now)
    state.capacity.begin()
    try:
        found = work.victims(job)
    finally:
        state.capacity.end()
    return None if found is None else [(v.id, r) for v, r in found]


def _out_of_service(state: SchedulerState, job: Job) -> tuple[list[str], tuple[str, ...]]:
    """What took the job's nodes or GPUs out of service ("node: reason"), and the fault ids behind it."""
    why: list[str] = []
    faults: list[str] = []
    for p in sorted(job.placements, key=lambda p: (p.cluster, p.node)):
        node = state.nodes.get((p.cluster, p.node))
        if node is None:
            continue
        if node.isolated or node.lost:
            if node.out_reason:
                why.append(f"{node.name}: {node.out_reason}")
            faults.extend(node.out_faults)
            continue
        for i in sorted(set(p.gpu_indices) & set(node.gpu_out)):
            reason, ids = node.gpu_out[i]
            why.append(f"{node.name} GPU {i}: {reason}")
            faults.extend(ids)
    return why, tuple(dict.fromkeys(faults))
