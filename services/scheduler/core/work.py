"""The cycle's scratch view: the live capacity index (journaled) plus copies of small tables.

Every phase module (quota, placement, preemption, backfill) reads and changes the cycle's view
through this one object (the quota rules themselves, guarantees and borrowing, live in quota.py);
`schedule` rolls the index back at the end of the cycle, so the state is left exactly as found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from events import Placement
from services.scheduler.core.links import degraded
from services.scheduler.core.policy import CHAMBER, Policy
from services.scheduler.core.state import Job, SchedulerState

if TYPE_CHECKING:
    from services.scheduler.core.preemption import Walk

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
        self._classes: dict[tuple[str, str | None, str | None], list[int]] = {}
        self._pool_classes: dict[str, list[int]] = {}
        # per-cycle caches of the preemption phase (see preemption.py)
        self.groups: dict[tuple[str, str], list[list[Job]]] = {}
        self.lost: dict[str, float] = {}  # preemption.victim_cost per job
        self.walks: dict[tuple[str, str, int], Walk] = {}  # per (pool, team, priority), see preemption.py
        # link health (placement.py): nodes gangs should avoid now, and what placement says about it
        self._avoid: dict[int, str] | None = None
        self.link_notes: dict[str, str] = {}
        self.smallest_waiting: dict[tuple[str, str], int] | None = None  # quota.smallest_waiting's cache

    # -- lookups -------------------------------------------------------------------------------
    def classes(self, job: Job) -> list[int]:
        """The capacity classes (pool, cluster, model) the job may run in."""
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
