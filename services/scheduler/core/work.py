"""The cycle's scratch view: the live capacity index (journaled) plus copies of small tables.

Every phase module (quota, placement, preemption, backfill) reads and changes the cycle's view
through this one object (the quota rules themselves, guarantees and borrowing, live in quota.py);
`schedule` rolls the index back at the end of the cycle, so the state is left exactly as found.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from events import Placement
from services.pools import model_vendor
from services.scheduler.core.decisions import Drain
from services.scheduler.core.hostres import HostLeft, given
from services.scheduler.core.links import degraded
from services.scheduler.core.policy import CHAMBER, LOWEST_RANK, RANKS, Policy, guard_band, protected_tier
from services.scheduler.core.shares import give as give_shares
from services.scheduler.core.shares import mode_of, plus
from services.scheduler.core.shares import part as share_part
from services.scheduler.core.shares import request as share_request
from services.scheduler.core.state import Job, SchedulerState

if TYPE_CHECKING:
    from services.scheduler.core.preemption import Walk
    from services.scheduler.core.sharing import Mix

Spot = list[tuple[int, list[int]]]  # (node id, GPU indices) per node
# A spot as kept for the rest of the cycle (`Work.fresh`): of atoms only, so the collector soon stops
# tracking it (a full cycle keeps one per admission; lists would be walked by every full collection).
Taken = tuple[tuple[int, tuple[int, ...]], ...]
Usage = dict[tuple[str, str], float]  # (pool, team) -> GPUs held (GPU-equivalents with shares)
T = TypeVar("T")


class Work:
    def __init__(self, state: SchedulerState, now: float, policy: Policy = CHAMBER) -> None:
        self.s = state
        self.now = now
        self.policy = policy
        self.cap = state.capacity
        self.usage: Usage = dict(state.usage)
        self.preemptible = dict(state.preemptible)
        self.gone: set[str] = set()  # running jobs preempted or requeued in this cycle
        self.fresh: dict[str, Taken] = {}  # admitted in this cycle: never victims in the same cycle
        self._classes: dict[tuple[str, str | None, str | None, str | None], list[int]] = {}
        self._pool_capacity: dict[str, int] = {}
        self._teams: dict[str, set[str]] = {}
        # per-cycle caches of the preemption phase (see preemption.py)
        self.walks: dict[tuple[str, str, int], Walk] = {}  # per (pool, team, priority), see preemption.py
        # link health (placement.py): nodes gangs should avoid now, and what placement says about it
        self._avoid: dict[int, str] | None = None
        self.link_notes: dict[str, str] = {}
        self._smallest_waiting: dict[tuple[str, str, int], float] | None = None
        self._fair: dict[int, dict[tuple[str, str], float]] | None = None
        self._oldest: dict[str, tuple[int, float, float, str]] | None = None
        self._protected_np: dict[tuple[str, str], Job] | None = None
        self._np_ranks: dict[tuple[str, str, int], float] | None = None
        self.drains: dict[str, Drain] = {}  # pool -> the node held for its protected whole-node job
        self.share_starts: dict[str, list[int | None]] = {}  # job -> MIG start per replica (shares.place)
        self._share_mix: dict[str, Mix] = {}  # share mode -> the queued shares' request mix
        self.host: HostLeft | None = None  # nodes' CPU and memory left (hostres.py), built on first use
        # answers computed from the scratch usage (and preemptible) tables, valid while `version`
        # (bumped by every change to them, `count`) stays the same
        self.version = 0
        self._memo: dict[tuple[object, ...], tuple[int, Any]] = {}
        # changes to the scratch usage per pool and per (pool, team): what other teams hold in a pool
        # is unchanged while their difference is (`others_memo`)
        self._pool_changes: dict[str, int] = {}
        self._team_changes: dict[tuple[str, str], int] = {}
        self._others_memo: dict[tuple[str, str], tuple[int, object, Any]] = {}
        # pool -> (its teams, the sum over them of max(usage, locked)), or None there while a term is
        # not a whole number (shares): kept by `count` (`held_by_others`)
        self._held_sums: dict[str, tuple[set[str], int | None]] = {}

    # -- lookups -------------------------------------------------------------------------------
    def classes(self, job: Job) -> list[int]:
        """The capacity classes (pool, cluster, model) the job may run in."""
        model, cluster, vendor = job.spec.gpu_model, job.spec.cluster, job.spec.gpu_vendor
        key = (job.pool, model.lower() if model else None, cluster, vendor)
        found = self._classes.get(key)
        if found is None:
            found = self._classes[key] = [
                cid
                for cid, (pool, cl, m) in enumerate(self.cap.class_keys)
                if pool == job.pool
                and (model is None or m.lower() == key[1])
                and (cluster is None or cl == cluster)
                and (vendor is None or model_vendor(m) == vendor)
            ]
        return found

    def avoid(self) -> dict[int, str]:
        """Node id -> why multi-node gangs should keep off it now (computed once per cycle)."""
        if self._avoid is None:
            s, policy = self.s, self.policy
            off = not policy.avoid_degraded_links or s.links.empty
            self._avoid = {} if off else degraded(s.links, s.nodes, s.node_by_id, self.now, policy.link_fault_memory_s)
        return self._avoid

    def pool_capacity(self, pool: str) -> int:
        """The pool's GPUs in service: fixed while a cycle runs (only the fold redefines a node), so
        kept per cycle (quota asks on every job's turn)."""
        found = self._pool_capacity.get(pool)
        if found is None:
            classes = [c for c, k in enumerate(self.cap.class_keys) if k[0] == pool]
            found = self._pool_capacity[pool] = sum(self.cap.class_total[c] for c in classes)
        return found

    def teams(self, pool: str) -> set[str]:
        """The teams with a quota or GPUs held in the pool (by the scratch view), kept per cycle."""
        found = self._teams.get(pool)
        if found is None:
            s = self.s
            found = self._teams[pool] = {t for (p, t) in s.quotas if p == pool} | {
                t for (p, t) in self.usage if p == pool
            }
        return found

    def guarantee(self, pool: str, team: str) -> int:
        q = self.s.quotas.get((pool, team))
        return q.guaranteed if q else 0

    def borrowing(self, pool: str, team: str, usage: Usage | None = None) -> bool:
        """Whether the team holds more than its guarantee in the pool (by `usage`, else the scratch view)."""
        usage = self.usage if usage is None else usage
        return usage.get((pool, team), 0) > self.guarantee(pool, team)

    def smallest_waiting(self, pool: str, team: str, rank: int = LOWEST_RANK) -> float | None:
        """GPUs of the team's smallest queued job in the pool at priority `rank` or more urgent (at
        the start of the cycle), or None."""
        if self._smallest_waiting is None:
            found: dict[tuple[str, str, int], float] = {}
            jobs = self.s.jobs
            for t, line in self.s.fifo_lines.items():
                for _, jid in line:
                    j = jobs[jid]
                    k = (j.pool, t, j.spec.priority.rank)
                    if j.gpus < found.get(k, 1 << 30):
                        found[k] = j.gpus
            self._smallest_waiting = found
        sizes = [g for r in RANKS if r <= rank if (g := self._smallest_waiting.get((pool, team, r))) is not None]
        return min(sizes) if sizes else None

    def fair_share(self, pool: str, team: str, rank: int = LOWEST_RANK) -> float:
        """The team's fair share of the pool now (at the start of the cycle) for work of priority `rank`:
        the pool's capacity water-filled over the teams' demand of that class or more urgent (GPUs held
        plus GPUs queued), in proportion to their quota weights. A team that wants less than its share
        gets what it wants; the rest is split among the others. With every team wanting more than its
        guarantee, the shares are the guarantees' proportions (equal shares: the guarantees). Less
        urgent work does not count: another team's queued low work does not keep high work out."""
        if self._fair is None:
            self._fair = {}
        found = self._fair.get(rank)
        if found is None:
            found = self._fair[rank] = _water_fill(self.s, self.pool_capacity, rank)
        return found.get((pool, team), 0.0)

    def longest_protected(self, pool: str) -> str | None:
        """The pool's first protected job in queue order (of the most urgent class the guard queues
        it with, then the longest waiting) at the start of the cycle; None if none is protected."""
        if self._oldest is None:
            first: dict[str, tuple[int, float, float, str]] = {}
            jobs = self.s.jobs
            for line in self.s.fifo_lines.values():
                for _, jid in line:
                    j = jobs[jid]
                    at = self.policy.protected_since(j.queued_since)
                    if at is None or at > self.now:
                        continue
                    mine = self._guard_key(j)
                    if mine < first.get(j.pool, (1 << 30, 0.0, math.inf, "")):
                        first[j.pool] = mine
            self._oldest = first
        found = self._oldest.get(pool)
        return None if found is None else found[3]

    def _guard_band(self, job: Job) -> int:
        """The class a protected job queues with (`policy.guard_band`)."""
        return guard_band(job.spec.priority.rank, self.policy.lift(job.queued_since, self.now))

    def _guard_key(self, job: Job) -> tuple[int, float, float, str]:
        """Where a protected job stands in queue order among the protected: its band, then its tier
        (`policy.protected_tier`), then the longest waiting first."""
        return (self._guard_band(job), protected_tier(job.spec.priority.rank), job.queued_since, job.id)

    def protected_np(self, pool: str, team: str) -> Job | None:
        """The team's first protected non-preemptible job of the pool in queue order (most urgent
        class first, then longest waiting), at the start of the cycle; None if none is protected."""
        if self._protected_np is None:
            found: dict[tuple[str, str], Job] = {}
            jobs = self.s.jobs
            for t, line in self.s.fifo_lines.items():
                for _, jid in line:
                    j = jobs[jid]
                    at = self.policy.protected_since(j.queued_since)
                    if j.spec.preemptible or at is None or at > self.now:
                        continue
                    old = found.get((j.pool, t))
                    if old is None or self._guard_key(j) < self._guard_key(old):
                        found[(j.pool, t)] = j
            self._protected_np = found
        return self._protected_np.get((pool, team))

    def np_more_urgent(self, pool: str, team: str, rank: int) -> float:
        """GPUs the team's non-preemptible jobs of classes more urgent than `rank` hold in the pool
        (scratch view): what its fair share does not count against less urgent work."""
        if self._np_ranks is None:
            held: dict[tuple[str, str, int], float] = {}
            jobs = self.s.jobs
            for ids in self.s.running.values():
                for jid in ids:
                    j = jobs[jid]
                    if not j.spec.preemptible and jid not in self.gone:
                        k = (j.pool, j.spec.team, j.spec.priority.rank)
                        held[k] = plus(held.get(k, 0), j.gpus)
            for jid in self.fresh:
                j = jobs[jid]
                if not j.spec.preemptible:
                    k = (j.pool, j.spec.team, j.spec.priority.rank)
                    held[k] = plus(held.get(k, 0), j.gpus)
            self._np_ranks = held
        ranks = self._np_ranks
        return sum(ranks.get((pool, team, r), 0) for r in RANKS if r < rank)

    def lends_to_nonpreemptible(self, pool: str, team: str, rank: int = LOWEST_RANK) -> int:
        """Guaranteed GPUs of `team` that other teams' non-preemptible work at priority `rank` may
        use now: its `np_lend_limit` while it has no queued work in the pool as urgent as that
        (or more) that would fit its idle guarantee (a team that wants its guarantee back for such
        work lends nothing new to it; what it lent drains). Its queued work of lower classes does
        not stop it lending to more urgent work: that would stand lower-class work in front of it."""
        q = self.s.quotas.get((pool, team))
        if q is None or q.np_lendable <= 0:
            return 0
        smallest = self.smallest_waiting(pool, team, rank)
        if smallest is not None and smallest <= q.guaranteed - self.usage.get((pool, team), 0):
            return 0
        return q.np_lendable

    def memo(self, key: tuple[object, ...], compute: Callable[..., T], *args: object) -> T:
        """`compute(*args)`, kept under `key` until the scratch usage changes (`version`)."""
        found = self._memo.get(key)
        if found is not None and found[0] == self.version:
            return cast(T, found[1])
        value = compute(*args)
        self._memo[key] = (self.version, value)
        return value

    def others_memo(self, pool: str, team: str, teams: set[str], compute: Callable[..., T], *args: object) -> T:
        """`compute(*args)`, a value of what teams other than `team` hold in `pool` (of the scratch
        usage) over `teams`: kept until another team's usage in the pool changes, or `teams` does. In
        a full cycle a team's jobs come one after another (its fair-share factor orders the queue
        within a class), so this answers most of them without reading every team again."""
        others = self._pool_changes.get(pool, 0) - self._team_changes.get((pool, team), 0)
        found = self._others_memo.get((pool, team))
        if found is not None and found[0] == others and found[1] is teams:
            return cast(T, found[2])
        value = compute(*args)
        self._others_memo[(pool, team)] = (others, teams, value)
        return value

    def held_by_others(self, pool: str, team: str, teams: set[str]) -> float | None:
        """What teams other than `team` hold or keep back (their unlendable guarantee) in `pool` of
        the scratch usage, over `teams`: the pool's sum less the team's own term. The sum is kept
        (`count` updates it by the one term that changed) while every term is a whole number, so it
        is exactly `quota._held_by_others`' in any order; None while one is not (GPU shares: float
        sums depend on their order), for the caller to sum them as before."""
        quotas, usage = self.s.quotas, self.usage
        found = self._held_sums.get(pool)
        if found is not None and found[0] is teams:
            total = found[1]
        else:
            total = 0
            for t in teams:
                q = quotas.get((pool, t))
                term = max(usage.get((pool, t), 0), q.locked if q else 0)
                if term.__class__ is not int:
                    total = None
                    break
                total += term
            self._held_sums[pool] = (teams, total)
        if total is None or team not in teams:
            return total
        q = quotas.get((pool, team))
        own = max(usage.get((pool, team), 0), q.locked if q else 0)
        return total - own

    # -- scratch changes -----------------------------------------------------------------------
    def count(self, job: Job, sign: int, usage: Usage | None = None, gpus: float | None = None) -> None:
        """Add (+1) or remove (-1) the job's GPUs (or `gpus`) to a usage table (the scratch view's by default)."""
        usage = self.usage if usage is None else usage
        key = (job.pool, job.spec.team)
        if usage is self.usage and key not in usage:
            self._teams.pop(job.pool, None)  # a team new to the pool
        n = sign * (job.gpus if gpus is None else gpus)
        before = usage.get(key, 0)
        held = before + n
        # with shares, GPU-equivalents: sums rounded (shares.plus), whole GPUs stay ints
        usage[key] = held = round(held, 6) if held.__class__ is float else held
        if usage is self.usage:
            if (sums := self._held_sums.get(job.pool)) is not None:  # the pool's sum, by this one term
                teams, total = sums
                if total is not None and held.__class__ is int and before.__class__ is int and key[1] in teams:
                    q = self.s.quotas.get(key)
                    locked = q.locked if q else 0
                    self._held_sums[job.pool] = (teams, total + max(held, locked) - max(before, locked))
                else:
                    del self._held_sums[job.pool]
            self.version += 1
            self._pool_changes[job.pool] = self._pool_changes.get(job.pool, 0) + 1
            self._team_changes[key] = self._team_changes.get(key, 0) + 1
            pkey = (job.pool, job.spec.team, job.spec.priority.rank)
            if job.spec.preemptible:
                self.preemptible[pkey] = plus(self.preemptible.get(pkey, 0), n)
            elif self._np_ranks is not None:
                self._np_ranks[pkey] = plus(self._np_ranks.get(pkey, 0), n)

    def held(self, job: Job) -> Spot:
        """The healthy GPUs a running job holds, per node id (not those of a held isolation: freed, they
        are not offered to new work)."""
        out = []
        for p in job.placements:
            node = self.s.nodes.get((p.cluster, p.node))
            if node is not None:
                out.append((node.nid, [i for i in p.gpu_indices if node.owners.get(i) == job.id and node.offers(i)]))
        return out

    def give_back(self, job: Job) -> None:
        """What a running job holds, whole GPUs and shares, free again on the scratch view."""
        if job.spec.share is not None:
            give_shares(self, job)
        for nid, gpus in self.held(job):
            self.cap.give(nid, gpus)
        given(self, job)

    def release(self, job: Job) -> None:
        self.give_back(job)
        self.count(job, -1)
        self.gone.add(job.id)

    def admit(self, job: Job, spot: Spot) -> tuple[Placement, ...]:
        self.fresh[job.id] = tuple([(nid, tuple(gpus)) for nid, gpus in spot])
        if job.spec.share is not None:
            placements = self._shared_placements(job, spot)
            # counted as the fold will count it: the placed shares (a MIG share is the placed model's)
            self.count(job, +1, gpus=round(sum(p.gpu_equivalents for p in placements), 6))
            return placements
        self.count(job, +1)
        nodes = self.s.node_by_id
        return tuple(Placement(cluster=nodes[nid].cluster, node=nodes[nid].name, gpu_indices=g) for nid, g in spot)

    def _shared_placements(self, job: Job, spot: Spot) -> tuple[Placement, ...]:
        """One placement per replica: its GPU, its share, and for a MIG instance the profile and start."""
        share = job.spec.share
        assert share is not None
        nodes = self.s.node_by_id
        out = []
        for (nid, g), start in zip(spot, self.share_starts[job.id], strict=True):
            node = nodes[nid]
            held = share_part(share, node.gpus[g[0]], start)
            assert held is not None
            milli = held[0]
            out.append(
                Placement(
                    cluster=node.cluster,
                    node=node.name,
                    gpu_indices=g,
                    share_milli=milli,
                    mig_profile=share.mig_profile,
                    mig_start=start,
                )
            )
        return tuple(out)

    def share_mix(self, mode: str) -> Mix:
        """The request mix the sharing scorer expects next in a share mode: the queued jobs' shares of
        that mode, at the start of the cycle (built once per cycle, when a share is first placed)."""
        found = self._share_mix.get(mode)
        if found is None:
            from services.scheduler.core.sharing import Mix

            jobs = self.s.jobs
            asked = [
                share_request(share, jobs[jid].spec.cpu_milli or 0)
                for line in self.s.fifo_lines.values()
                for _, jid in line
                if (share := jobs[jid].spec.share) is not None and mode_of(share) == mode
            ]
            found = self._share_mix[mode] = Mix.of(asked)
        return found

    def describe(self, spot: Spot, job: Job | None = None) -> str:
        nodes = self.s.node_by_id
        where = ", ".join(f"{nodes[nid].name}[{','.join(map(str, g))}]" for nid, g in spot)
        share = None if job is None else job.spec.share
        if share is None:
            return where
        if share.mig_profile:
            starts = self.share_starts.get(job.id, []) if job is not None else []
            at = ", ".join(f"slice {s}" for s in starts if s is not None)
            return f"{where} ({share.mig_profile} MIG instance{'s' if len(spot) > 1 else ''} at {at})"
        memory = f", {share.memory_mib} MiB" if share.memory_mib else ""
        return f"{where} ({share.gpu_milli} milli-GPU each, {share.mode.value}{memory})"


def _water_fill(
    state: SchedulerState, capacity: Callable[[str], int], rank: int = LOWEST_RANK
) -> dict[tuple[str, str], float]:
    """(pool, team) -> fair share, for the teams with a quota in the pool (others have none).

    A team's demand is what it holds plus what it has queued; a team with any demand counts for at
    least the part of its guarantee it does not lend to non-preemptible work (guarantee -
    np_lend_limit), as under the lending rule, and so does a team whose np_lend_limit an operator
    set. A team that wants nothing (under the default limit) counts for nothing, so a job
    larger than a team's share can start while the others are idle (under the lending rule alone it
    never could: with equal shares and the default np_lend_limit it waited for good on the ITP
    clusters); an owner that comes back waits for the drain, holding the reservation."""
    held = _held_as_urgent(state, rank)
    queued = dict.fromkeys(state.quotas, 0.0)
    jobs = state.jobs
    for t, line in state.fifo_lines.items():
        for _, jid in line:
            j = jobs[jid]
            if (j.pool, t) in queued and j.spec.priority.rank <= rank:
                queued[(j.pool, t)] += j.gpus
    demand: dict[tuple[str, str], float] = {}
    for k, q in state.quotas.items():
        wants = held[k] + queued[k]
        keeps = wants > 0 or q.np_lend_limit is not None  # a limit set by an operator always holds
        demand[k] = max(held[k], q.guaranteed - q.np_lendable) + queued[k] if keeps else 0.0
    fair: dict[tuple[str, str], float] = {}
    for pool in sorted({p for p, _ in demand}):
        left = float(capacity(pool))
        weight = {k: state.quotas[k].weight for k in demand if k[0] == pool}
        open_ = sorted(weight, key=lambda k: (demand[k] / weight[k], k))
        while open_:
            per_weight = left / sum(weight[k] for k in open_)
            first = open_[0]
            if demand[first] > per_weight * weight[first]:  # everyone left wants more than an even split
                fair.update((k, per_weight * weight[k]) for k in open_)
                break
            fair[first] = demand[first]  # wants less than an even split: gets what it wants
            left -= demand[first]
            open_.pop(0)
    return fair


def _held_as_urgent(state: SchedulerState, rank: int) -> dict[tuple[str, str], float]:
    """(pool, team) -> GPUs its jobs of priority `rank` or more urgent hold, for the teams with a quota."""
    held = {k: float(state.usage.get(k, 0)) for k in state.quotas}
    if rank == LOWEST_RANK:
        return held
    for k in held:
        held[k] -= sum(state.preemptible.get((k[0], k[1], r), 0) for r in RANKS if r > rank)
    jobs = state.jobs
    for k, ids in state.running.items():
        if k in held:
            held[k] -= sum(
                j.gpus for j in map(jobs.__getitem__, ids) if not j.spec.preemptible and j.spec.priority.rank > rank
            )
    return held
