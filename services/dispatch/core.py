"""Multi-cluster dispatch, the decision only: which one cluster runs a workload, and what happens to
its copy when that cluster stops answering. Pure (time passed in); run live by the dispatcher
(services/dispatch/dispatcher.py) and the simulation bench/multicluster.py.

- A workload names the clusters it may run in with the `chamber.io/clusters` annotation (a comma list,
  in order of preference; absent or `*`: any). It runs in exactly one of them, never spanning.
- Each candidate is scored by the expected wait of the workload there (its own queue model: the GPUs
  queued ahead of it beyond what is free, drained at the cluster's capacity per mean runtime), the
  price of its GPU-hours and the preference order; a cluster where its team has no quota left, or
  that has not answered within `lost_after_s`, is no candidate.
- Dispatch creates exactly one remote copy, in the best cluster, and records it with a generation.
  A cluster silent for `lost_after_s` is declared lost: each of its copies is fenced (its generation
  retired: a copy that comes back with an old generation is deleted, never run) and the workload is
  dispatched again elsewhere. A workload never has two live copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

CLUSTERS_ANNOTATION = "chamber.io/clusters"
LOST_AFTER_S = 120.0  # a cluster silent this long is lost: its workloads go elsewhere


class DispatchError(ValueError):
    """A workload's `chamber.io/clusters` names no usable cluster (a clear error at the door)."""


@dataclass(frozen=True)
class ClusterView:
    name: str
    capacity_gpus: int
    free_gpus: int
    queued_gpus: int  # GPUs of the work already waiting there
    mean_runtime_s: float  # of the work it ran lately: the queue drains capacity GPUs per this time
    price_per_gpu_hour: float
    last_seen: float  # the last heartbeat of its agents and actuator
    quota_left: dict[str, int] = field(default_factory=dict)  # team -> GPUs it may still use there

    def expected_wait_s(self, gpus: int) -> float:
        """The queue model: the GPUs ahead of it (and its own) beyond what is free now, drained at
        `capacity_gpus` per `mean_runtime_s`."""
        short = self.queued_gpus + gpus - self.free_gpus
        if short <= 0:
            return 0.0
        return short / max(1, self.capacity_gpus) * self.mean_runtime_s


@dataclass(frozen=True)
class Workload:
    id: str
    team: str
    gpus: int
    origin: str  # the cluster it was created in: its object there stays the user's one handle
    clusters: tuple[str, ...] = ()  # allow-list in order of preference; empty: any cluster


@dataclass(frozen=True)
class Weights:
    price_s_per_unit: float = 600.0  # one currency unit per GPU-hour is worth this many seconds of wait
    preference_s: float = 300.0  # each step down the preference list costs this much


def parse_clusters(value: str | None) -> tuple[str, ...]:
    """`chamber.io/clusters: "b, a"` -> ("b", "a"); absent, empty or `*` -> () (any)."""
    if value is None or value.strip() in ("", "*"):
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    if not names:
        raise DispatchError(f"{CLUSTERS_ANNOTATION}: {value!r} names no cluster (a comma list, or * for any)")
    return names


def score(
    w: Workload, c: ClusterView, now: float, weights: Weights = Weights(), lost_after_s: float = LOST_AFTER_S
) -> float | None:
    """Lower is better; None: the cluster may not run it now."""
    if w.clusters and c.name not in w.clusters:
        return None
    if now - c.last_seen > lost_after_s or w.gpus > c.capacity_gpus:
        return None
    if c.quota_left.get(w.team, 0) < w.gpus:
        return None
    rank = w.clusters.index(c.name) if w.clusters else 0
    cost_s = c.price_per_gpu_hour * weights.price_s_per_unit
    return c.expected_wait_s(w.gpus) + cost_s + rank * weights.preference_s


def choose(
    w: Workload,
    clusters: list[ClusterView],
    now: float,
    weights: Weights = Weights(),
    lost_after_s: float = LOST_AFTER_S,
) -> str | None:
    """The best cluster (ties: the origin, then by name), or None when none may run it now."""
    best: tuple[float, int, str] | None = None
    for c in clusters:
        s = score(w, c, now, weights, lost_after_s)
        if s is None or math.isnan(s):
            continue
        key = (s, 0 if c.name == w.origin else 1, c.name)
        best = key if best is None or key < best else best
    return None if best is None else best[2]


@dataclass(frozen=True)
class Copy:
    cluster: str
    generation: int


@dataclass
class DispatchState:
    copies: dict[str, Copy] = field(default_factory=dict)  # workload -> its one live remote copy
    generations: dict[str, int] = field(default_factory=dict)  # workload -> the last generation used
    waiting: dict[str, Workload] = field(default_factory=dict)  # dispatched nowhere yet (no candidate)


@dataclass(frozen=True)
class CreateCopy:
    workload: str
    cluster: str
    generation: int


@dataclass(frozen=True)
class DeleteCopy:
    workload: str
    cluster: str
    generation: int
    reason: str


Action = CreateCopy | DeleteCopy


def dispatch(
    s: DispatchState, w: Workload, clusters: list[ClusterView], now: float, lost_after_s: float = LOST_AFTER_S
) -> list[Action]:
    """One remote copy for a workload that has none (none if it already has one)."""
    if w.id in s.copies:
        return []
    target = choose(w, clusters, now, lost_after_s=lost_after_s)
    if target is None:
        s.waiting[w.id] = w
        return []
    s.waiting.pop(w.id, None)
    gen = s.generations.get(w.id, 0) + 1
    s.generations[w.id] = gen
    s.copies[w.id] = Copy(target, gen)
    return [CreateCopy(w.id, target, gen)]


def finished(s: DispatchState, workload: str, reason: str) -> list[Action]:
    """Completion or preemption: the copy is deleted; the origin object keeps the status."""
    copy = s.copies.pop(workload, None)
    s.waiting.pop(workload, None)
    return [] if copy is None else [DeleteCopy(workload, copy.cluster, copy.generation, reason)]


def cluster_lost(
    s: DispatchState,
    workloads: dict[str, Workload],
    clusters: list[ClusterView],
    now: float,
    lost_after_s: float = LOST_AFTER_S,
) -> list[Action]:
    """Clusters silent past `lost_after_s`: their copies are fenced and their workloads dispatched
    again among the clusters still answering (or left waiting)."""
    lost = {c.name for c in clusters if now - c.last_seen > lost_after_s}
    out: list[Action] = []
    for wid, copy in sorted(s.copies.items()):
        if copy.cluster not in lost:
            continue
        del s.copies[wid]
        out.append(DeleteCopy(wid, copy.cluster, copy.generation, f"cluster {copy.cluster} lost"))
        out += dispatch(s, workloads[wid], clusters, now, lost_after_s)
    return out


def stale(s: DispatchState, workload: str, cluster: str, generation: int) -> bool:
    """A copy reported by a cluster that is not the workload's live copy (it was fenced while the
    cluster was away): delete it, never let it run."""
    live = s.copies.get(workload)
    return live is None or (live.cluster, live.generation) != (cluster, generation)
