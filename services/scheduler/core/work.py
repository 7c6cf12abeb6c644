"""The cycle's scratch view: the live capacity index (journaled) plus copies of small tables.

Every phase module (quota, placement, preemption, backfill) reads and changes the cycle's view
through this one object; `schedule` rolls the index back at the end of the cycle, so the state is
left exactly as found.
"""

from __future__ import annotations

from events import Placement
from services.pools import model_vendor
from services.scheduler.core.links import degraded
from services.scheduler.core.policy import CHAMBER, Policy
from services.scheduler.core.state import Job, SchedulerState

Spot = list[tuple[int, list[int]]]  # (node id, GPU indices) per node
Usage = dict[tuple[str, str], int]  # (pool, team) -> GPUs held


class Work:
    def __init__(self, state: SchedulerState, now: float, policy: Policy = CHAMBER) -> None:
        self.s = state
        self.now = now
        self.policy = policy
        self.cap = state.capacity
        self.usage: Usage = dict(state.usage)
        self.preemptible = dict(state.preemptible)
        self.gone: set[str] = set()  # running jobs preempted or requeued in this cycle
        self.fresh: dict[str, Spot] = {}  # admitted in this cycle: never victims in the same cycle
        self._classes: dict[tuple[str, str | None, str | None, str | None], list[int]] = {}
        self._pool_classes: dict[str, list[int]] = {}
        # per-cycle caches of the preemption phase (see preemption.py)
        self.groups: dict[tuple[str, str], list[list[Job]]] = {}
        self.lost: dict[str, float] = {}  # preemption.victim_cost per job
        self.sorted: set[tuple[str, str, int]] = set()
        # link health (placement.py): nodes gangs should avoid now, and what placement says about it
        self._avoid: dict[int, str] | None = None
        self.link_notes: dict[str, str] = {}
        self._smallest_waiting: dict[tuple[str, str], int] | None = None

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
        cls = self._pool_classes.get(pool)
        if cls is None:
            cls = self._pool_classes[pool] = [c for c, k in enumerate(self.cap.class_keys) if k[0] == pool]
        return sum(self.cap.class_total[c] for c in cls)

    def guarantee(self, pool: str, team: str) -> int:
        q = self.s.quotas.get((pool, team))
        return q.guaranteed if q else 0

    def borrowing(self, pool: str, team: str, usage: Usage | None = None) -> bool:
        """Whether the team holds more than its guarantee in the pool (by `usage`, else the scratch view)."""
        usage = self.usage if usage is None else usage
        return usage.get((pool, team), 0) > self.guarantee(pool, team)

    def smallest_waiting(self, pool: str, team: str) -> int | None:
        """GPUs of the team's smallest queued job in the pool (at the start of the cycle), or None."""
        if self._smallest_waiting is None:
            found: dict[tuple[str, str], int] = {}
            jobs = self.s.jobs
            for t, line in self.s.fifo_lines.items():
                for _, jid in line:
                    j = jobs[jid]
                    k = (j.pool, t)
                    if j.gpus < found.get(k, 1 << 30):
                        found[k] = j.gpus
            self._smallest_waiting = found
        return self._smallest_waiting.get((pool, team))

    def lends_to_nonpreemptible(self, pool: str, team: str) -> int:
        """Guaranteed GPUs of `team` that other teams' non-preemptible work may use now: its
        `np_lend_limit` while it has no queued work in the pool that would fit its idle guarantee
        (a team that wants its guarantee back lends nothing new; what it lent drains)."""
        q = self.s.quotas.get((pool, team))
        if q is None or q.np_lendable <= 0:
            return 0
        smallest = self.smallest_waiting(pool, team)
        if smallest is not None and smallest <= q.guaranteed - self.usage.get((pool, team), 0):
            return 0
        return q.np_lendable

    # -- scratch changes -----------------------------------------------------------------------
    def count(self, job: Job, sign: int, usage: Usage | None = None) -> None:
        """Add (+1) or remove (-1) the job's GPUs to a usage table (the scratch view's by default)."""
        usage = self.usage if usage is None else usage
        key = (job.pool, job.spec.team)
        usage[key] = usage.get(key, 0) + sign * job.gpus
        if usage is self.usage and job.spec.preemptible:
            pkey = (job.pool, job.spec.team, job.spec.priority.rank)
            self.preemptible[pkey] = self.preemptible.get(pkey, 0) + sign * job.gpus

    def held(self, job: Job) -> Spot:
        """The healthy GPUs a running job holds, per node id (not those of a held isolation: freed, they
        are not offered to new work)."""
        out = []
        for p in job.placements:
            node = self.s.nodes.get((p.cluster, p.node))
            if node is not None:
                out.append((node.nid, [i for i in p.gpu_indices if node.owners.get(i) == job.id and node.offers(i)]))
        return out

    def release(self, job: Job) -> None:
        for nid, gpus in self.held(job):
            self.cap.give(nid, gpus)
        self.count(job, -1)
        self.gone.add(job.id)

    def admit(self, job: Job, spot: Spot) -> tuple[Placement, ...]:
        self.count(job, +1)
        self.fresh[job.id] = spot
        nodes = self.s.node_by_id
        return tuple(Placement(cluster=nodes[nid].cluster, node=nodes[nid].name, gpu_indices=g) for nid, g in spot)

    def describe(self, spot: Spot) -> str:
        nodes = self.s.node_by_id
        return ", ".join(f"{nodes[nid].name}[{','.join(map(str, g))}]" for nid, g in spot)
