"""The gateway's read model: the fleet, jobs, teams and costs, folded from every event stream.

Pure: no I/O, no clock reads, no asyncio. `evolve(state, event)` folds one event; `record_point(state,
now)` appends one point of the live efficiency series (the shell calls it on a timer and passes `now`).

The streams are consumed independently (an event of JOBS may arrive before the FLEET event of the node
it names), so nothing here depends on the order *between* streams: GPU allocations are kept apart
from the nodes, keyed by (cluster, node, gpu index), and joined only when a view is built.

`evolve` updates the state in place and returns it: the model is large and telemetry is hot, and a copy
per sample would dominate the gateway's CPU. It never raises on a valid event.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from events import (
    BudgetExceeded,
    BudgetSet,
    CostAccrued,
    Event,
    FairShareUpdated,
    FaultKind,
    GpuFaultDetected,
    GpuIsolated,
    GpuRestored,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobSuspended,
    NodeDiscovered,
    NodeForgotten,
    NodeInventory,
    NodeIsolated,
    NodeLost,
    NodeRestored,
    NodeSample,
    NodeStatus,
    NodeUpdated,
    Placement,
    PoolDefined,
    PoolRemoved,
    PriceSet,
    TeamQuotaSet,
)
from events.fabric import FabricSample, JobSlowdownCleared, JobSlowdownDetected
from events.fleet import IsolationDismissed, IsolationHeld
from events.idle import IdleModeName, JobIdleDetected
from events.telemetry import GpuInfo
from services.billing.price_table import resolve
from services.gateway.fabric import FabricView, fold, fold_verdict
from services.timefmt import iso

INSTANCE_TYPE_LABEL = "chamber.io/instance-type"  # discovery's (services/discovery/cloud.py)
DISCOVERY_LABEL_PREFIX = "chamber.io/"
MAX_FINISHED_JOBS = 2_000  # finished jobs kept for the API; their history lives in the warehouse
MAX_TIMELINE = 1_000  # faults, isolations, restores and losses kept for the timeline
MAX_HISTORY = 720  # efficiency points (one hour at the default 5 s)
BUSY_THRESHOLD_PCT = 5.0  # an allocated GPU below this utilization counts as idle-while-allocated

NodeKey = tuple[str, str]  # (cluster, node)
GpuKey = tuple[str, str, int]  # (cluster, node, gpu index)


class JobState(StrEnum):
    PENDING = "pending"  # submitted or requeued, waiting for a placement
    SCHEDULED = "scheduled"  # placed, holding GPUs, not yet reported started
    RUNNING = "running"
    PREEMPTED = "preempted"  # asked to give its GPUs back; waits in the queue to resume
    SUSPENDED = "suspended"  # suspended after preemption; waits in the queue to resume
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def queued(self) -> bool:
        return self in (JobState.PENDING, JobState.PREEMPTED, JobState.SUSPENDED)

    @property
    def holds_gpus(self) -> bool:
        return self in (JobState.SCHEDULED, JobState.RUNNING)

    @property
    def finished(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


@dataclass
class Gpu:
    index: int
    uuid: str = ""
    model: str = "unknown"
    vendor: str = "nvidia"  # "amd" for an AMD Instinct GPU (GpuInfo.vendor)
    memory_total_mib: float | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    isolated: Isolation | None = None


@dataclass
class Node:
    cluster: str
    name: str
    status: str = NodeStatus.HEALTHY.value
    gpus: dict[int, Gpu] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    isolated: Isolation | None = None
    last_seen_at: float | None = None
    simulated: bool = False
    driver_version: str | None = None

    @property
    def key(self) -> NodeKey:
        return (self.cluster, self.name)

    @property
    def in_service(self) -> bool:
        """Its healthy GPUs count as capacity: known, not lost, not isolated as a whole."""
        return self.isolated is None and self.status not in (NodeStatus.LOST.value, NodeStatus.NO_AGENT.value)


@dataclass(frozen=True)
class Isolation:
    cluster: str
    node: str
    gpu_index: int | None  # None: the whole node
    at: float
    reason: str
    fault_ids: tuple[str, ...] = ()
    until: float | None = None


@dataclass
class Job:
    job_id: str
    spec: JobSpec | None = None  # None until JobSubmitted is seen (streams can lag each other)
    team: str = ""
    state: JobState = JobState.PENDING
    submitted_at: float | None = None
    updated_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    placements: list[Placement] = field(default_factory=list)
    reason: str = ""  # why it is where it is, from the last event that said so
    borrowed_gpus: float = 0  # GPU-equivalents where the job shares GPUs
    preemptions: int = 0
    idle: str = ""  # the idle-reclaim flag of its current run (JobIdleDetected), "" when none

    @property
    def total_gpus(self) -> int:
        return self.spec.total_gpus if self.spec is not None else sum(len(p.gpu_indices) for p in self.placements)


@dataclass(frozen=True)
class HeldIsolation:
    """An isolation health's budget held back, waiting for `chamber health confirm` or `dismiss`."""

    cluster: str
    node: str
    gpu_index: int | None  # None: the whole node
    at: float
    action: str  # isolate_gpu | isolate_node
    reason: str
    fault_ids: tuple[str, ...] = ()


@dataclass
class TeamQuota:
    pool: str
    guaranteed_gpus: int
    borrow_limit: int | None
    lend_limit: int | None
    weight: float


@dataclass
class Team:
    name: str
    quotas: dict[str, TeamQuota] = field(default_factory=dict)
    fair_share: dict[str, float] = field(default_factory=dict)  # pool -> factor in (0, 1]
    budget: float | None = None
    budget_currency: str = "USD"
    budget_period: str = "month"
    budget_exceeded_at: float | None = None
    budget_set_at: float | None = None  # when the budget was last set: an older "exceeded" is void
    cost: float = 0.0
    gpu_seconds: float = 0.0

    @property
    def guaranteed_gpus(self) -> int:
        return sum(q.guaranteed_gpus for q in self.quotas.values())


@dataclass(frozen=True)
class TimelineEntry:
    at: float
    # fault | node_isolated | gpu_isolated | node_restored | gpu_restored | node_lost | isolation_held |
    # isolation_dismissed | node_forgotten
    kind: str
    cluster: str
    node: str
    detail: str
    gpu_index: int | None = None
    severity: str = "info"


@dataclass(frozen=True)
class Point:
    """One point of the live efficiency series (see `efficiency`)."""

    at: float
    capacity: int
    allocated: int
    busy: float
    idle: int
    queue_depth: int
    cost_total: float


# The meaning of this core's fold, for its snapshots (services/runtime/state_codec.py): bump it when a
# change makes a state folded by the previous release wrong for this one (a field's meaning, what an
# event does); the first start after it folds the log from the start. Comments, logs, speed: no bump.
STATE_VERSION = 4  # 2: held isolations are part of the read model; 3: jobs' idle flags; 4: shares' GPU-equivalents


@dataclass
class GatewayState:
    nodes: dict[NodeKey, Node] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    allocations: dict[GpuKey, str] = field(default_factory=dict)  # GPU -> job holding it
    finished: deque[str] = field(default_factory=deque)  # finished job ids, oldest first
    teams: dict[str, Team] = field(default_factory=dict)
    pools: dict[str, PoolDefined] = field(default_factory=dict)
    prices: dict[str, PriceSet] = field(default_factory=dict)  # by GPU model
    # per instance type and per cluster (an on-premises rate): they come before the model's (billing's order)
    instance_prices: dict[str, float] = field(default_factory=dict)
    cluster_prices: dict[str, float] = field(default_factory=dict)
    idle_cost: float = 0.0
    idle_gpu_seconds: float = 0.0
    # idle cost by where the GPUs were: (provider, region, cluster), from CostAccrued (issue 18)
    idle_by_place: dict[tuple[str, str, str], float] = field(default_factory=dict)
    currency: str = "USD"
    faults_total: int = 0
    held: dict[tuple[str, str, int | None], HeldIsolation] = field(default_factory=dict)  # (cluster, node, gpu)
    timeline: deque[TimelineEntry] = field(default_factory=lambda: deque(maxlen=MAX_TIMELINE))
    history: deque[Point] = field(default_factory=lambda: deque(maxlen=MAX_HISTORY))
    events_seen: int = 0
    # Why each waiting job waits, in the scheduler's own words (its `queue` answer, asked every few
    # seconds): the read model alone cannot know about quotas, fair share or reservations.
    waiting_reasons: dict[str, str] = field(default_factory=dict)
    queue_positions: dict[str, int] = field(default_factory=dict)  # the scheduler's next-cycle order
    fabric: FabricView = field(default_factory=FabricView)  # latest NICs per node (services/gateway/fabric.py)

    def team(self, name: str) -> Team:
        team = self.teams.get(name)
        if team is None:
            team = self.teams[name] = Team(name)
        return team

    def node(self, cluster: str, name: str) -> Node:
        node = self.nodes.get((cluster, name))
        if node is None:
            node = self.nodes[(cluster, name)] = Node(cluster, name)
        return node

    def job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = Job(job_id)
        return job


def evolve(state: GatewayState, event: Event) -> GatewayState:
    """Fold one event of any stream into the read model."""
    state.events_seen += 1
    match event:
        case NodeSample() | NodeInventory():
            _telemetry(state, event)
        case FabricSample():
            fold(state.fabric, event)
        case JobSlowdownDetected() | JobSlowdownCleared():
            fold_verdict(state.fabric, event)
        case NodeDiscovered() | NodeUpdated() | NodeLost() | NodeIsolated() | NodeRestored():
            _fleet(state, event)
        case NodeForgotten():
            _forgotten(state, event)
        case GpuIsolated() | GpuRestored():
            _gpu_isolation(state, event)
        case IsolationHeld() | IsolationDismissed():
            _held(state, event)
        case GpuFaultDetected():
            _fault(state, event)
        case (
            JobSubmitted()
            | JobScheduled()
            | JobStarted()
            | JobPreempted()
            | JobSuspended()
            | JobResumed()
            | JobRequeued()
            | JobCompleted()
            | JobFailed()
            | JobCancelled()
            | JobIdleDetected()
        ):
            _job(state, event)
        case PoolDefined() | PoolRemoved() | TeamQuotaSet() | FairShareUpdated() | BudgetSet():
            _quota(state, event)
        case PriceSet() | CostAccrued() | BudgetExceeded():
            _billing(state, event)
    return state


# --- fleet -----------------------------------------------------------------------------------------


def _merge_gpus(node: Node, gpus: list[GpuInfo]) -> None:
    for info in gpus:
        gpu = node.gpus.get(info.index)
        if gpu is None:
            gpu = node.gpus[info.index] = Gpu(info.index)
        gpu.uuid = info.uuid
        gpu.model = info.model
        gpu.vendor = info.vendor
        gpu.memory_total_mib = info.memory_total_mib


def _telemetry(state: GatewayState, event: NodeSample | NodeInventory) -> None:
    node = state.node(event.cluster, event.node)
    node.last_seen_at = max(node.last_seen_at or 0.0, event.observed_at)
    if isinstance(event, NodeInventory):
        _merge_gpus(node, event.gpus)
        if event.labels:  # the agent's own labels; where the node runs stays discovery's word
            kept = {k: v for k, v in node.labels.items() if k.startswith(DISCOVERY_LABEL_PREFIX)}
            node.labels = {**event.labels, **kept}
        node.simulated = event.simulated
        node.driver_version = event.driver_version
        return
    for sample in event.gpus:
        gpu = node.gpus.get(sample.index)
        if gpu is None:
            gpu = node.gpus[sample.index] = Gpu(sample.index, uuid=sample.uuid)
        gpu.utilization_pct = sample.utilization_pct
        gpu.memory_used_mib = sample.memory_used_mib
        gpu.temperature_c = sample.temperature_c
        gpu.power_w = sample.power_w
        if gpu.memory_total_mib is None:
            gpu.memory_total_mib = sample.memory_total_mib


def _forgotten(state: GatewayState, event: NodeForgotten) -> None:
    """The node left the fleet for good: out of the read model (its GPUs, held isolations, NICs); the
    timeline says so. A GPU a job still held there (not requeued yet) is no longer shown as held."""
    key = (event.cluster, event.node)
    if state.nodes.pop(key, None) is None:
        return
    for gone in [k for k in state.allocations if k[:2] == key]:
        del state.allocations[gone]
    for gone_held in [k for k in state.held if k[:2] == key]:
        del state.held[gone_held]
    state.fabric.latest.pop(key, None)
    for nic in [k for k in state.fabric.totals if k[:2] == key]:
        del state.fabric.totals[nic]
    why = event.reason or "node forgotten"
    _add_to_timeline(state, TimelineEntry(event.at, "node_forgotten", event.cluster, event.node, why, None, "info"))


def _fleet(state: GatewayState, event: NodeDiscovered | NodeUpdated | NodeLost | NodeIsolated | NodeRestored) -> None:
    node = state.node(event.cluster, event.node)
    match event:
        case NodeDiscovered():
            _merge_gpus(node, event.gpus)
            node.labels = dict(event.labels) or node.labels
            node.status = NodeStatus.HEALTHY.value
        case NodeUpdated():
            _merge_gpus(node, event.gpus)
            node.labels = dict(event.labels) or node.labels
            node.status = event.status.value
        case NodeLost():
            node.status = NodeStatus.LOST.value
            _add_to_timeline(
                state,
                TimelineEntry(
                    event.at, "node_lost", event.cluster, event.node, event.reason or "node lost", None, "critical"
                ),
            )
        case NodeIsolated():
            state.held.pop((event.cluster, event.node, None), None)  # confirmed: no longer only held
            node.isolated = Isolation(
                event.cluster, event.node, None, event.at, event.reason, tuple(event.fault_ids), event.until
            )
            _add_to_timeline(
                state,
                TimelineEntry(event.at, "node_isolated", event.cluster, event.node, event.reason, None, "critical"),
            )
        case NodeRestored():
            node.isolated = None
            _add_to_timeline(
                state,
                TimelineEntry(
                    event.at,
                    "node_restored",
                    event.cluster,
                    event.node,
                    _restored(event.reason, event.by),
                    None,
                    "info",
                ),
            )


def _gpu_isolation(state: GatewayState, event: GpuIsolated | GpuRestored) -> None:
    node = state.node(event.cluster, event.node)
    gpu = node.gpus.get(event.gpu_index)
    if gpu is None:
        gpu = node.gpus[event.gpu_index] = Gpu(event.gpu_index, uuid=event.gpu_uuid or "")
    if isinstance(event, GpuIsolated):
        state.held.pop((event.cluster, event.node, event.gpu_index), None)
        gpu.isolated = Isolation(
            event.cluster, event.node, event.gpu_index, event.at, event.reason, tuple(event.fault_ids), event.until
        )
        entry = TimelineEntry(
            event.at, "gpu_isolated", event.cluster, event.node, event.reason, event.gpu_index, "warning"
        )
    else:
        gpu.isolated = None
        entry = TimelineEntry(
            event.at, "gpu_restored", event.cluster, event.node, _restored(event.reason, event.by), event.gpu_index
        )
    _add_to_timeline(state, entry)


def _held(state: GatewayState, event: IsolationHeld | IsolationDismissed) -> None:
    key = (event.cluster, event.node, event.gpu_index)
    if isinstance(event, IsolationHeld):
        state.held[key] = HeldIsolation(
            event.cluster, event.node, event.gpu_index, event.at, event.action, event.reason, tuple(event.fault_ids)
        )
        entry = TimelineEntry(
            event.at, "isolation_held", event.cluster, event.node, event.reason, event.gpu_index, "warning"
        )
    else:
        state.held.pop(key, None)
        entry = TimelineEntry(
            event.at, "isolation_dismissed", event.cluster, event.node, event.reason, event.gpu_index, "info"
        )
    _add_to_timeline(state, entry)


def _timeline_key(entry: TimelineEntry) -> tuple[float, str, str, str, int, str, str]:
    idx = -1 if entry.gpu_index is None else entry.gpu_index
    return (entry.at, entry.kind, entry.cluster, entry.node, idx, entry.detail, entry.severity)


def _add_to_timeline(state: GatewayState, entry: TimelineEntry) -> None:
    """Keep the timeline in event-time order, whatever order the streams were folded in: the newest
    MAX_TIMELINE entries by (time, then every field), so any interleaving keeps the same entries."""
    timeline, key = state.timeline, _timeline_key(entry)
    at = len(timeline)
    while at > 0 and _timeline_key(timeline[at - 1]) > key:  # usually the newest: no step at all
        at -= 1
    if len(timeline) == timeline.maxlen:
        if at == 0:
            return  # older than everything kept
        timeline.popleft()
        at -= 1
    timeline.insert(at, entry)


def _restored(reason: str, by: str) -> str:
    return reason if by == "probation" else f"{reason} (by {by})"


def _fault(state: GatewayState, event: GpuFaultDetected) -> None:
    state.faults_total += 1
    detail = f"xid {event.xid}" if event.xid is not None else event.kind.value
    if event.xid is not None and event.kind is not FaultKind.XID:
        detail = f"{event.kind.value} ({detail})"
    if event.detail:
        detail += f": {event.detail}"
    _add_to_timeline(
        state,
        TimelineEntry(
            event.observed_at, "fault", event.cluster, event.node, detail, event.gpu_index, event.severity.value
        ),
    )


# --- jobs ------------------------------------------------------------------------------------------

_FINISHED = {JobCompleted: JobState.COMPLETED, JobFailed: JobState.FAILED, JobCancelled: JobState.CANCELLED}


def _job(state: GatewayState, event: Event) -> None:
    job_id: str = event.job_id  # type: ignore[attr-defined]
    job = state.job(job_id)
    if job.state.finished and not isinstance(event, JobSubmitted):
        return  # a late decision about a finished job changes nothing
    job.updated_at = max(job.updated_at, event.at)  # type: ignore[attr-defined]
    match event:
        case JobSubmitted():
            job.spec = event.spec
            job.team = event.spec.team
            job.submitted_at = event.at
        case JobScheduled():
            job.team = event.team or job.team
            job.borrowed_gpus = event.borrowed_gpus
            _place(state, job, event.placements, JobState.SCHEDULED, event.reason)
        case JobResumed():
            # borrowed_gpus on JobResumed is newer than this module: read it where present
            job.borrowed_gpus = getattr(event, "borrowed_gpus", job.borrowed_gpus)
            _place(state, job, event.placements, JobState.SCHEDULED, event.reason)
        case JobStarted():
            if job.state.holds_gpus:
                job.state = JobState.RUNNING
                job.started_at = job.started_at or event.at
        case JobPreempted():
            job.preemptions += 1
            reason = f"preempted ({event.reason.value})" + (
                f" by {event.preemptor_job_id}" if event.preemptor_job_id else ""
            )
            _release(state, job, JobState.PREEMPTED, f"{reason}: {event.detail}" if event.detail else reason)
        case JobSuspended():
            _release(state, job, JobState.SUSPENDED, event.reason or job.reason or "suspended")
        case JobRequeued():
            where = f" on {event.node}" if event.node else ""
            _release(state, job, JobState.PENDING, f"requeued{where}: {event.reason}")
        case JobIdleDetected():
            if job.state.holds_gpus:
                what = "suspended" if event.action == IdleModeName.SUSPEND else "flagged (its team's policy: notify)"
                job.idle = f"idle since {iso(event.idle_since)}: {event.reason or 'no sign of work'}; {what}"
        case JobCompleted() | JobFailed() | JobCancelled():
            reason = getattr(event, "reason", "") or ""
            _release(state, job, _FINISHED[type(event)], reason)
            job.finished_at = event.at
            state.finished.append(job_id)
            while len(state.finished) > MAX_FINISHED_JOBS:
                state.jobs.pop(state.finished.popleft(), None)


def _place(state: GatewayState, job: Job, placements: list[Placement], to: JobState, reason: str) -> None:
    _free(state, job)
    job.idle = ""  # a new run: the flag was about the last one
    job.placements = list(placements)
    for p in placements:
        for index in p.gpu_indices:
            state.allocations[(p.cluster, p.node, index)] = job.job_id
    job.state = to
    job.reason = reason


def _release(state: GatewayState, job: Job, to: JobState, reason: str) -> None:
    _free(state, job)
    job.placements = []
    job.state = to
    job.reason = reason


def _free(state: GatewayState, job: Job) -> None:
    for p in job.placements:
        for index in p.gpu_indices:
            key = (p.cluster, p.node, index)
            if state.allocations.get(key) == job.job_id:
                del state.allocations[key]


# --- quota and billing -----------------------------------------------------------------------------


def _quota(state: GatewayState, event: PoolDefined | PoolRemoved | TeamQuotaSet | FairShareUpdated | BudgetSet) -> None:
    match event:
        case PoolDefined():
            state.pools[event.pool] = event
        case PoolRemoved():  # with its quotas (of 0 GPUs)
            state.pools.pop(event.pool, None)
            for team in state.teams.values():
                team.quotas.pop(event.pool, None)
        case TeamQuotaSet():
            state.team(event.team).quotas[event.pool] = TeamQuota(
                event.pool, event.guaranteed_gpus, event.borrow_limit, event.lend_limit, event.weight
            )
        case FairShareUpdated():
            state.team(event.team).fair_share[event.pool] = event.factor
        case BudgetSet():
            team = state.team(event.team)
            team.budget, team.budget_currency, team.budget_period = event.amount, event.currency, event.period
            # BudgetSet (QUOTA) and BudgetExceeded (BILLING) come from two streams, folded in any
            # interleaving: a new budget voids only what was exceeded before it was set
            team.budget_set_at = max(event.at, team.budget_set_at or event.at)
            if team.budget_exceeded_at is not None and team.budget_exceeded_at <= team.budget_set_at:
                team.budget_exceeded_at = None


def _billing(state: GatewayState, event: PriceSet | CostAccrued | BudgetExceeded) -> None:
    match event:
        case PriceSet():
            if event.instance_type:
                state.instance_prices[event.instance_type] = event.price_per_gpu_hour
            elif event.cluster:
                state.cluster_prices[event.cluster] = event.price_per_gpu_hour
            elif event.gpu_model:  # the price list shows model prices; all three price the live rates
                state.prices[event.gpu_model] = event
            state.currency = event.currency
        case CostAccrued():
            if event.idle or event.team is None:
                state.idle_cost += event.cost
                state.idle_gpu_seconds += event.gpu_seconds
                place = (event.provider or "unknown", event.region or "", event.cluster or "")
                state.idle_by_place[place] = state.idle_by_place.get(place, 0.0) + event.cost
            else:
                team = state.team(event.team)
                team.cost += event.cost
                team.gpu_seconds += event.gpu_seconds
        case BudgetExceeded():
            team = state.team(event.team)
            if team.budget_set_at is None or event.at > team.budget_set_at:  # of the budget in force
                team.budget_exceeded_at = max(event.at, team.budget_exceeded_at or event.at)


# --- derived figures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Efficiency:
    """Live efficiency, as the design defines it per window, taken at one instant.

    capacity = healthy GPUs in service; allocated = those held by jobs; busy = sum of utilization
    (0..1) over allocated GPUs. allocation ratio = allocated / capacity; usage ratio = busy / allocated;
    efficiency score = busy / capacity; idle = capacity - allocated.
    """

    total: int
    capacity: int
    allocated: int
    busy: float
    idle: int
    isolated: int
    allocated_idle: int  # allocated, yet below BUSY_THRESHOLD_PCT

    @property
    def allocation_ratio(self) -> float:
        return self.allocated / self.capacity if self.capacity else 0.0

    @property
    def usage_ratio(self) -> float:
        return self.busy / self.allocated if self.allocated else 0.0

    @property
    def score(self) -> float:
        return self.busy / self.capacity if self.capacity else 0.0

    @property
    def idle_ratio(self) -> float:
        return self.idle / self.capacity if self.capacity else 0.0


def gpu_in_service(node: Node, gpu: Gpu) -> bool:
    return node.in_service and gpu.isolated is None


def efficiency(state: GatewayState) -> Efficiency:
    total = capacity = allocated = isolated = allocated_idle = 0
    busy = 0.0
    for node in state.nodes.values():
        for gpu in node.gpus.values():
            total += 1
            if node.isolated is not None or gpu.isolated is not None:
                isolated += 1
            if not gpu_in_service(node, gpu):
                continue
            capacity += 1
            if (node.cluster, node.name, gpu.index) in state.allocations:
                allocated += 1
                util = gpu.utilization_pct
                if util is not None:  # unknown counts as not busy, but is not called idle either
                    busy += min(max(util, 0.0), 100.0) / 100.0
                    allocated_idle += util < BUSY_THRESHOLD_PCT
    return Efficiency(total, capacity, allocated, busy, capacity - allocated, isolated, allocated_idle)


def queue(state: GatewayState) -> list[Job]:
    """Waiting jobs in the order the scheduler's next cycle takes them, as its last `queue` answer
    gave it (fair share, age and the starvation guard are the scheduler's to weigh); jobs it has not
    listed yet follow, by priority class, then submit time, then id.
    """
    waiting = [j for j in state.jobs.values() if j.state.queued]
    positions = state.queue_positions
    return sorted(
        waiting,
        key=lambda j: (
            positions.get(j.job_id, math.inf),
            j.spec.priority.rank if j.spec is not None else 99,
            j.submitted_at if j.submitted_at is not None else float("inf"),
            j.job_id,
        ),
    )


def team_gpus_in_use(state: GatewayState) -> dict[str, int]:
    used: dict[str, int] = {}
    for job_id in state.allocations.values():
        team = state.jobs[job_id].team if job_id in state.jobs else ""
        if team:
            used[team] = used.get(team, 0) + 1
    return used


def price_of(state: GatewayState, model: str) -> float | None:
    price = state.prices.get(model)
    return price.price_per_gpu_hour if price is not None else None


def cost_rate_by_team(state: GatewayState) -> dict[str, float]:
    """What each team's held GPUs cost per hour at current prices, priced as billing prices them (the
    node's instance type, else its cluster, else the GPU's model; GPUs with no price count 0)."""
    models = {p: m.price_per_gpu_hour for p, m in state.prices.items()}
    rates: dict[str, float] = {}
    for key, job_id in state.allocations.items():
        job = state.jobs.get(job_id)
        if job is None or not job.team:
            continue
        node = state.nodes.get(key[:2])
        gpu = node.gpus.get(key[2]) if node is not None else None
        price = resolve(
            node.labels.get(INSTANCE_TYPE_LABEL) if node is not None else None,
            key[0],
            gpu.model if gpu is not None else "",
            instance_prices=state.instance_prices,
            cluster_prices=state.cluster_prices,
            model_prices=models,
        )
        rates[job.team] = rates.get(job.team, 0.0) + (price or 0.0)
    return rates


def cost_total(state: GatewayState) -> float:
    return state.idle_cost + sum(t.cost for t in state.teams.values())


def record_point(state: GatewayState, now: float) -> Point:
    """Append the live efficiency at `now` to the bounded series, and return it."""
    eff = efficiency(state)
    point = Point(now, eff.capacity, eff.allocated, round(eff.busy, 4), eff.idle, len(queue(state)), cost_total(state))
    state.history.append(point)
    return point


def scheduler_said(state: GatewayState, rows: list[dict[str, object]]) -> None:
    """Fold the scheduler's `queue` answer: the reason it gives for each job that is not running,
    and each queued job's position in its next cycle's order."""
    state.queue_positions = {str(r["id"]): pos for r in rows if isinstance(pos := r.get("position"), int)}
    state.waiting_reasons = {
        str(r["id"]): str(r.get("reason") or "") for r in rows if r.get("state") != "running" and r.get("reason")
    }
