"""Baseline policies to measure Chamber against.

- fifo: one queue in submit order, head-of-line blocking, no preemption, no backfill — what a plain
  cluster without a quota-aware scheduler gives.
- static-quota: each team confined to its guarantee (hard partitions), FIFO within the team, no
  borrowing, no preemption.
Both place a job that fits on one node on the fullest node it fits (best fit), larger jobs on
whole free nodes first. A job on a node that fails is requeued at its old place.
"""

from __future__ import annotations

from bisect import insort

from services.tracesim.engine import FleetSpec
from services.tracesim.model import Action, SimJob, Start, Stop
from services.tracesim.quotas import TeamQuota


class _Placer:
    """Free GPUs per node, with best-fit placement."""

    def __init__(self, fleet: FleetSpec) -> None:
        self.fleet = fleet
        self.free = [fleet.node_size(n) for n in range(fleet.nodes)]
        self.down: set[int] = set()
        self.total_free = fleet.gpus

    def place(self, gpus: int) -> dict[int, int] | None:
        if gpus > self.total_free:
            return None
        if gpus <= self.fleet.gpus_per_node:
            best = None
            for node, free in enumerate(self.free):
                if free >= gpus and node not in self.down and (best is None or free < self.free[best]):
                    best = node
                    if free == gpus:
                        break
            return {best: gpus} if best is not None else None
        placement: dict[int, int] = {}
        need = gpus
        for node in sorted(
            (n for n in range(len(self.free)) if n not in self.down and self.free[n]),
            key=lambda n: (-self.free[n], n),
        ):
            take = min(self.free[node], need)
            placement[node] = take
            need -= take
            if need == 0:
                return placement
        return None

    def take(self, placement: dict[int, int]) -> None:
        for node, n in placement.items():
            self.free[node] -= n
            self.total_free -= n

    def give(self, placement: dict[int, int]) -> None:
        for node, n in placement.items():
            self.free[node] += n
            if node not in self.down:
                self.total_free += n

    def set_down(self, node: int, down: bool) -> None:
        if down and node not in self.down:
            self.down.add(node)
            self.total_free -= self.free[node]
        elif not down and node in self.down:
            self.down.discard(node)
            self.total_free += self.free[node]


class _QueuedPolicy:
    """Shared mechanics: queues ordered by (submit, id), running jobs and their placements."""

    name = "base"

    def setup(self, fleet: FleetSpec, quotas: dict[str, TeamQuota]) -> None:
        self.placer = _Placer(fleet)
        self.quotas = quotas
        self.running: dict[str, SimJob] = {}
        self.placements: dict[str, dict[int, int]] = {}
        self.on_node: dict[int, set[str]] = {}
        self.evicted: list[str] = []

    def _queue_for(self, job: SimJob) -> list[tuple[float, str, SimJob]]:
        raise NotImplementedError

    def submitted(self, job: SimJob, now: float) -> None:
        insort(self._queue_for(job), (job.t.submit_s, job.t.id, job))

    def finished(self, job: SimJob, now: float) -> None:
        self._forget(job)

    def _forget(self, job: SimJob) -> dict[int, int]:
        placement = self.placements.pop(job.t.id)
        self.placer.give(placement)
        self.running.pop(job.t.id, None)
        for node in placement:
            self.on_node[node].discard(job.t.id)
        self._released(job)
        return placement

    def _released(self, job: SimJob) -> None:
        pass

    def node_down(self, node: int, now: float) -> None:
        self.placer.set_down(node, True)
        self.evicted.extend(sorted(self.on_node.get(node, ())))

    def node_up(self, node: int, now: float) -> None:
        self.placer.set_down(node, False)

    def _evictions(self) -> list[Action]:
        actions: list[Action] = []
        for job_id in dict.fromkeys(self.evicted):
            job = self.running.get(job_id)
            if job is None:
                continue
            self._forget(job)
            self.submitted(job, 0.0)  # back at its old place (ordered by submit time)
            actions.append(Stop(job_id, "requeued"))
        self.evicted.clear()
        return actions

    def _admit(self, job: SimJob, placement: dict[int, int]) -> Start:
        self.placer.take(placement)
        self.running[job.t.id] = job
        for node in placement:
            self.on_node.setdefault(node, set()).add(job.t.id)
        self.placements[job.t.id] = placement
        return Start(job.t.id, placement)


class Fifo(_QueuedPolicy):
    name = "fifo"

    def setup(self, fleet: FleetSpec, quotas: dict[str, TeamQuota]) -> None:
        super().setup(fleet, quotas)
        self.queue: list[tuple[float, str, SimJob]] = []

    def _queue_for(self, job: SimJob) -> list[tuple[float, str, SimJob]]:
        return self.queue

    def decide(self, now: float) -> list[Action]:
        actions = self._evictions()
        while self.queue:
            job = self.queue[0][2]
            placement = self.placer.place(job.t.gpus)
            if placement is None:
                break  # head-of-line blocking: nothing behind it may start
            self.queue.pop(0)
            actions.append(self._admit(job, placement))
        return actions


class StaticQuota(_QueuedPolicy):
    name = "static-quota"

    def setup(self, fleet: FleetSpec, quotas: dict[str, TeamQuota]) -> None:
        super().setup(fleet, quotas)
        self.queues: dict[str, list[tuple[float, str, SimJob]]] = {}
        self.in_use: dict[str, int] = {}

    def _queue_for(self, job: SimJob) -> list[tuple[float, str, SimJob]]:
        return self.queues.setdefault(job.t.team, [])

    def _released(self, job: SimJob) -> None:
        self.in_use[job.t.team] -= job.t.gpus

    def decide(self, now: float) -> list[Action]:
        actions = self._evictions()
        for team in sorted(self.queues):
            queue = self.queues[team]
            limit = self.quotas[team].guaranteed if team in self.quotas else 0
            while queue:
                job = queue[0][2]
                if self.in_use.get(team, 0) + job.t.gpus > limit:
                    break  # the partition is full (a job larger than it never runs)
                placement = self.placer.place(job.t.gpus)
                if placement is None:
                    break
                queue.pop(0)
                self.in_use[team] = self.in_use.get(team, 0) + job.t.gpus
                actions.append(self._admit(job, placement))
        return actions
