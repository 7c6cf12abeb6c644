"""Every simulated policy is the scheduler's own pure core (not a copy), driven on the virtual clock
with a `Policy` from the core's registry: `chamber` (the live scheduler's), `fifo` and `static-quota`.

The simulator plays the rest of the system: it emits the events discovery, health, quota and the
executor would (NodeDiscovered, NodeIsolated/NodeRestored, TeamQuotaSet, JobSubmitted, JobStarted,
JobCompleted), folds them with the core's `evolve`, runs `schedule` each instant, and folds the
decision events from `events_for` back, exactly as the live scheduler service does.
"""

from __future__ import annotations

from events import (
    Event,
    JobCompleted,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeDiscovered,
    NodeIsolated,
    NodeRestored,
    PoolDefined,
    TeamQuotaSet,
)
from events.telemetry import GpuInfo
from services.quota.core import QuotaState
from services.quota.core import decide as quota_decide
from services.quota.core import evolve as quota_evolve
from services.scheduler.core import CHAMBER, CycleMark, Policy, SchedulerState, events_for, evolve, schedule
from services.tracesim.engine import FleetSpec
from services.tracesim.model import Action, SimJob, Start, Stop
from services.tracesim.quotas import TeamQuota

CLUSTER = "sim"


def node_name(node: int) -> str:
    return f"n{node:05d}"


def job_spec(job: SimJob, gpus_per_node: int) -> JobSpec:
    """A trace job as a gang: up to one node's GPUs is one replica; larger ones are whole nodes
    (or single-GPU replicas when the size is not a multiple of a node)."""
    gpus = job.t.gpus
    if gpus <= gpus_per_node:
        per, replicas = gpus, 1
    elif gpus % gpus_per_node == 0:
        per, replicas = gpus_per_node, gpus // gpus_per_node
    else:
        per, replicas = 1, gpus
    return JobSpec(
        team=job.t.team,
        gpus_per_replica=per,
        replicas=replicas,
        priority=job.t.priority,
        gpu_model=job.t.gpu_model,
        preemptible=job.t.preemptible,
        checkpoint_interval_s=job.t.checkpoint_interval_s,
        sim_duration_s=job.t.duration_s,  # the backfill estimate: exact runtimes (an optimistic case)
    )


class CorePolicy:
    """A scheduling policy of the core as the simulator's policy."""

    def __init__(self, policy: Policy = CHAMBER, *, fair_share: bool = True) -> None:
        """`fair_share`: play the quota service's fair-share factor (each team's usage, decayed with
        the service's default half-life, against its share), as the live scheduler gets it. Off,
        every team's factor stays 1, so within a class the queue goes by age and submit time.
        Only a policy whose queue order uses the factor gets it."""
        self.policy = policy
        self.quota = QuotaState() if fair_share and policy.order == "priority-fair-share" else None
        self.name = policy.name
        self.decision_log: list[tuple[float, str, str]] = []  # (now, event type, job id) of each action
        self.folded: list[Event] = []  # every event folded, in order: the log a live scheduler would read
        self.cycles: list[tuple[int, float]] = []  # (log position, now) of each cycle: replayable

    def setup(self, fleet: FleetSpec, quotas: dict[str, TeamQuota]) -> None:
        self.fleet = fleet
        self.state = SchedulerState()
        self.mark: CycleMark | None = None
        self.node_ids = {node_name(n): n for n in range(fleet.nodes)}
        pools = sorted({q.pool for q in quotas.values()} - {"default"})
        for pool in pools:
            self._fold(PoolDefined(pool=pool, at=0.0, node_selector={"chamber.io/pool": pool}))
        pool_of_node = self._assign_pools(pools, quotas)
        for n in range(fleet.nodes):
            labels = {"chamber.io/pool": pool_of_node[n]} if pool_of_node.get(n) else {}
            gpus = [
                GpuInfo(index=i, uuid=f"GPU-{CLUSTER}-{n}-{i}", model=fleet.gpu_model)
                for i in range(fleet.node_size(n))
            ]
            self._fold(NodeDiscovered(cluster=CLUSTER, node=node_name(n), at=0.0, gpus=gpus, labels=labels))
        for q in quotas.values():
            self._fold(
                TeamQuotaSet(
                    team=q.team,
                    pool=q.pool,
                    at=0.0,
                    guaranteed_gpus=q.guaranteed,
                    borrow_limit=q.borrow_limit,
                    lend_limit=q.lend_limit,
                    weight=q.weight,
                    critical=q.critical,
                    np_lend_limit=q.np_lend_limit,
                )
            )

    def _assign_pools(self, pools: list[str], quotas: dict[str, TeamQuota]) -> dict[int, str]:
        """Named pools take consecutive nodes sized by their teams' guarantees; the rest is default."""
        out: dict[int, str] = {}
        node = 0
        for pool in pools:
            need = sum(q.guaranteed for q in quotas.values() if q.pool == pool)
            while need > 0 and node < self.fleet.nodes:
                out[node] = pool
                need -= self.fleet.node_size(node)
                node += 1
        return out

    def _fold(self, event: Event) -> None:
        self.folded.append(event)
        evolve(self.state, event)
        if self.quota is not None:
            quota_evolve(self.quota, event)

    def submitted(self, job: SimJob, now: float) -> None:
        self._fold(JobSubmitted(job_id=job.t.id, at=now, spec=job_spec(job, self.fleet.gpus_per_node)))

    def finished(self, job: SimJob, now: float) -> None:
        self._fold(JobCompleted(job_id=job.t.id, at=now))

    def node_down(self, node: int, now: float) -> None:
        self._fold(NodeIsolated(cluster=CLUSTER, node=node_name(node), at=now, reason="simulated node fault"))

    def node_up(self, node: int, now: float) -> None:
        self._fold(NodeRestored(cluster=CLUSTER, node=node_name(node), at=now, reason="repaired", by="operator"))

    def publish_fair_share(self, now: float) -> None:
        """Fold the factors that moved by `now`, as the quota service publishes them before a cycle
        reads them. A second call at the same `now` publishes nothing more."""
        if self.quota is not None:
            for update, _ in quota_decide(self.quota, now):
                self._fold(update)

    def decide(self, now: float) -> list[Action]:
        self.publish_fair_share(now)
        self.cycles.append((len(self.folded), now))
        cycle = schedule(self.state, now, self.mark, policy=self.policy)
        self.mark = cycle.mark
        actions: list[Action] = []
        started: list[str] = []
        for event, _ in events_for(cycle.decisions, now):
            self._fold(event)
            match event:
                case JobScheduled() | JobResumed():
                    placement: dict[int, int] = {}
                    for p in event.placements:
                        nid = self.node_ids[p.node]
                        placement[nid] = placement.get(nid, 0) + len(p.gpu_indices)
                    actions.append(Start(event.job_id, placement))
                    started.append(event.job_id)
                case JobPreempted():
                    actions.append(Stop(event.job_id, "preempted"))
                case JobRequeued():
                    actions.append(Stop(event.job_id, "requeued"))
                case _:
                    continue
            self.decision_log.append((now, type(event).__name__, event.job_id))
        for job_id in started:  # the executor reports them started, after the decisions (as live)
            self._fold(JobStarted(job_id=job_id, at=now))
        return actions


class ChamberPolicy(CorePolicy):
    """The live scheduler's policy."""

    def __init__(self) -> None:
        super().__init__(CHAMBER)
