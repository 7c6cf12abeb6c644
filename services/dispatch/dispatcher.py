"""The dispatcher's core, run live on the decider host (`chamber service dispatch`): `evolve` folds
DISPATCH (offers, heartbeats, copy reports, its own decisions once they come back from the log) and
QUOTA (team quotas); `decide(state, now)` returns the decisions. Pure: no I/O, time passed in.

One cycle, in numbered phases:
1. views (`Board`): each cluster that ever beat, with its capacity, price and own load (its own
   workloads running and waiting) from its last heartbeat, plus the copies dispatched there (running
   ones hold GPUs, the others wait);
2. recall: a copy whose workload completed, failed or was withdrawn is recalled for good; one that
   was suspended there (preempted) or went missing is recalled and its workload goes back to 4;
3. lost clusters: a cluster silent for `lost_after_s` has each of its copies recalled (fenced: the
   generation is retired) and its workloads go back to 4, among the clusters still answering;
4. dispatch: each offered workload without a live copy, oldest offer first (then by id), goes to
   the one best cluster that serves its kind (services/dispatch/core.py `choose`), or waits.

Quota: a team may hold at most the sum over its pools of guaranteed + borrow limit GPUs in live copies
(pools may span clusters: the quota is the team's, wherever its copies run); a team without a quota
dispatches nothing, as the scheduler's door refuses its jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from events import Event, TeamQuotaSet
from events.codec import stable_id
from events.dispatch import (
    FINAL_PHASES,
    ClusterHeartbeat,
    CopyPhase,
    CopyRecalled,
    CopyReported,
    WorkloadDispatched,
    WorkloadOffered,
    WorkloadWithdrawn,
)
from services.dispatch import core
from services.dispatch.core import LOST_AFTER_S

UNLIMITED = 1 << 40  # a team quota with no borrow limit
DEFAULT_MEAN_RUNTIME_S = 3600.0  # the queue model's runtime before any copy has completed
STATE_VERSION = 1


@dataclass
class Seen:
    """A cluster as its actuator's last heartbeat described it."""

    last_seen: float
    capacity_gpus: int
    price_per_gpu_hour: float
    kinds: frozenset[str] = frozenset()  # the workload kinds it serves (empty: not said)
    running_gpus: int = 0  # of its own workloads (not copies)
    queued_gpus: int = 0


@dataclass
class DispatcherState:
    lost_after_s: float = LOST_AFTER_S
    offers: dict[str, core.Workload] = field(default_factory=dict)
    offered_at: dict[str, float] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)  # workload -> its kind (Job, JobSet, ...)
    done: dict[str, str] = field(default_factory=dict)  # workload -> why it is not dispatched again
    withdrawn: set[str] = field(default_factory=set)
    clusters: dict[str, Seen] = field(default_factory=dict)
    copies: core.DispatchState = field(default_factory=core.DispatchState)
    phases: dict[str, CopyPhase] = field(default_factory=dict)  # workload -> its live copy's last phase
    running_since: dict[str, float] = field(default_factory=dict)
    runtimes: list[float] = field(default_factory=list)  # of the last completed copies (the queue model)
    quotas: dict[tuple[str, str], int] = field(default_factory=dict)  # (team, pool) -> GPUs it may hold


def evolve(s: DispatcherState, event: Event) -> None:
    match event:
        case WorkloadOffered():
            if event.workload not in s.offers and event.workload not in s.done:
                s.offers[event.workload] = core.Workload(
                    event.workload, event.team, event.gpus, event.origin, tuple(event.clusters)
                )
                s.offered_at[event.workload] = event.at
                s.kinds[event.workload] = event.kind
        case WorkloadWithdrawn():
            if event.workload in s.offers and event.workload not in s.done:
                s.withdrawn.add(event.workload)
                if event.workload not in s.copies.copies:
                    _retire(s, event.workload, "withdrawn")
        case ClusterHeartbeat():
            seen = s.clusters.get(event.cluster)
            if seen is None or event.at >= seen.last_seen:
                s.clusters[event.cluster] = Seen(
                    event.at,
                    event.capacity_gpus,
                    event.price_per_gpu_hour,
                    frozenset(event.kinds),
                    event.running_gpus,
                    event.queued_gpus,
                )
        case WorkloadDispatched():
            w = event.workload
            if event.generation > s.copies.generations.get(w, 0) and w not in s.done:
                s.copies.generations[w] = event.generation
                s.copies.copies[w] = core.Copy(event.cluster, event.generation)
                s.copies.waiting.pop(w, None)
                s.phases.pop(w, None)
                s.running_since.pop(w, None)
        case CopyRecalled():
            live = s.copies.copies.get(event.workload)
            if live is not None and (live.cluster, live.generation) == (event.cluster, event.generation):
                del s.copies.copies[event.workload]
                s.phases.pop(event.workload, None)
                s.running_since.pop(event.workload, None)
            if event.final:
                _retire(s, event.workload, event.reason or "done")
        case CopyReported():
            live = s.copies.copies.get(event.workload)
            if live is None or (live.cluster, live.generation) != (event.cluster, event.generation):
                return  # a fenced copy: its actuator deletes it, it counts for nothing here
            s.phases[event.workload] = event.phase
            if event.phase == CopyPhase.RUNNING:
                s.running_since.setdefault(event.workload, event.at)
            elif event.phase == CopyPhase.COMPLETE and event.workload in s.running_since:
                s.runtimes = [*s.runtimes[-99:], max(0.0, event.at - s.running_since[event.workload])]
        case TeamQuotaSet():
            borrow = UNLIMITED if event.borrow_limit is None else event.borrow_limit
            s.quotas[(event.team, event.pool)] = event.guaranteed_gpus + borrow


def _retire(s: DispatcherState, workload: str, why: str) -> None:
    s.done[workload] = why
    s.offers.pop(workload, None)
    s.offered_at.pop(workload, None)
    s.kinds.pop(workload, None)
    s.withdrawn.discard(workload)
    s.copies.waiting.pop(workload, None)


# -- deciding ----------------------------------------------------------------------------------


@dataclass
class Board:
    """The queue model of one cycle: GPUs running and queued per cluster, GPUs each team holds in live
    copies; built once from the copies, then updated with each dispatch of the cycle."""

    running: dict[str, int] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def of(s: DispatcherState, copies: core.DispatchState) -> Board:
        board = Board()
        for wid, copy in copies.copies.items():
            w = s.offers.get(wid)
            if w is not None:
                board.add(w, copy.cluster, running=s.phases.get(wid) == CopyPhase.RUNNING)
        return board

    def add(self, w: core.Workload, cluster: str, *, running: bool = False) -> None:
        target = self.running if running else self.queued
        target[cluster] = target.get(cluster, 0) + w.gpus
        self.held[w.team] = self.held.get(w.team, 0) + w.gpus

    def views(self, s: DispatcherState) -> list[core.ClusterView]:
        """Each cluster that ever beat, as the scoring sees it."""
        limits: dict[str, int] = {}
        for (team, _), gpus in s.quotas.items():
            limits[team] = min(UNLIMITED, limits.get(team, 0) + gpus)
        quota_left = {team: limit - self.held.get(team, 0) for team, limit in limits.items()}
        mean = sum(s.runtimes) / len(s.runtimes) if s.runtimes else DEFAULT_MEAN_RUNTIME_S
        return [
            core.ClusterView(
                name=name,
                capacity_gpus=c.capacity_gpus,
                free_gpus=max(0, c.capacity_gpus - c.running_gpus - self.running.get(name, 0)),
                queued_gpus=c.queued_gpus + self.queued.get(name, 0),
                mean_runtime_s=max(1.0, mean),
                price_per_gpu_hour=c.price_per_gpu_hour,
                last_seen=c.last_seen,
                quota_left=quota_left,
            )
            for name, c in sorted(s.clusters.items())
        ]


def _events(actions: list[core.Action], now: float, final: bool = False) -> list[tuple[Event, str]]:
    out: list[tuple[Event, str]] = []
    for a in actions:
        if isinstance(a, core.CreateCopy):
            event: Event = WorkloadDispatched(workload=a.workload, cluster=a.cluster, generation=a.generation, at=now)
            out.append((event, stable_id("dispatched", a.workload, a.cluster, a.generation)))
        else:
            event = CopyRecalled(
                workload=a.workload, cluster=a.cluster, generation=a.generation, at=now, reason=a.reason, final=final
            )
            out.append((event, stable_id("recalled", a.workload, a.cluster, a.generation)))
    return out


def decide(s: DispatcherState, now: float) -> list[tuple[Event, str]]:
    """The cycle's decisions (the state is only read: the cycle works on a scratch copy of the copies)."""
    scratch = core.DispatchState(dict(s.copies.copies), dict(s.copies.generations), dict(s.copies.waiting))
    out: list[tuple[Event, str]] = []
    again: list[str] = []
    closing: set[str] = set()  # recalled for good in this cycle: never dispatched again
    # 2. recall: finished, withdrawn, preempted or missing copies
    for wid in sorted(scratch.copies):
        phase = s.phases.get(wid)
        if phase in FINAL_PHASES or wid in s.withdrawn:
            closing.add(wid)
            why = str(phase) if phase in FINAL_PHASES else "withdrawn"
            out += _events(core.finished(scratch, wid, why), now, final=True)
        elif phase in (CopyPhase.SUSPENDED, CopyPhase.GONE):
            reason = "preempted there" if phase == CopyPhase.SUSPENDED else "the copy went missing"
            out += _events(core.finished(scratch, wid, reason), now)
            again.append(wid)
    # 3. lost clusters: fence their copies; their workloads are dispatched again in 4
    lost = {name for name, c in s.clusters.items() if now - c.last_seen > s.lost_after_s}
    for wid, copy in sorted(scratch.copies.items()):
        if copy.cluster in lost:
            out += _events(core.finished(scratch, wid, f"cluster {copy.cluster} lost"), now)
            again.append(wid)
    # 4. dispatch what has no copy, oldest offer first, among the clusters that serve its kind
    pending = [wid for wid in s.offers if wid not in scratch.copies and wid not in s.withdrawn | closing]
    board = Board.of(s, scratch)
    for wid in sorted(set(pending) | set(again), key=lambda w: (s.offered_at.get(w, 0.0), w)):
        if wid in scratch.copies or wid not in s.offers:
            continue
        kind = s.kinds.get(wid, "")
        serving = [v for v in board.views(s) if not s.clusters[v.name].kinds or kind in s.clusters[v.name].kinds]
        actions = core.dispatch(scratch, s.offers[wid], serving, now, s.lost_after_s)
        for a in actions:
            if isinstance(a, core.CreateCopy):
                board.add(s.offers[wid], a.cluster)
        out += _events(actions, now)
    return out
