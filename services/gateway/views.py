"""What the HTTP API returns: msgspec Structs built from the read model (pure functions of state).

The Structs double as the OpenAPI schemas (`openapi.py` derives them with msgspec), so the document
and the responses cannot drift apart.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from events import Placement
from services.gateway import core
from services.gateway.core import GatewayState, Job, Node


class Isolation(msgspec.Struct, kw_only=True):
    cluster: str
    node: str
    gpu_index: int | None
    at: float
    reason: str
    fault_ids: list[str] = []
    until: float | None = None


class GpuView(msgspec.Struct, kw_only=True):
    cluster: str
    node: str
    index: int
    uuid: str
    model: str
    health: str  # healthy | isolated | node_isolated | lost | suspect | no_agent
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    job_id: str | None = None
    team: str | None = None
    isolation: Isolation | None = None
    vendor: str = "nvidia"  # nvidia | amd


class NodeView(msgspec.Struct, kw_only=True):
    cluster: str
    node: str
    status: str
    isolated: bool
    gpus_total: int
    gpus_allocated: int
    gpus_isolated: int
    utilization_avg_pct: float | None
    last_seen_at: float | None
    simulated: bool
    labels: dict[str, str]
    isolation: Isolation | None = None
    gpus: list[GpuView] = []


class FleetView(msgspec.Struct, kw_only=True):
    nodes_total: int
    nodes_by_status: dict[str, int]
    nodes_isolated: int
    gpus_total: int
    gpus_in_service: int
    gpus_allocated: int
    gpus_idle: int
    gpus_isolated: int
    nodes: list[NodeView]


class JobView(msgspec.Struct, kw_only=True):
    job_id: str
    name: str
    team: str
    state: str
    priority: str | None
    gpus: int
    replicas: int | None
    gpus_per_replica: int | None
    gpu_model: str | None
    preemptible: bool | None
    submitted_at: float | None
    started_at: float | None
    finished_at: float | None
    updated_at: float
    reason: str
    borrowed_gpus: float  # GPU-equivalents where the job shares GPUs
    preemptions: int
    placements: list[Placement] = []
    # the idle-reclaim flag of its current run ("idle since ...: why; flagged or suspended"), if any
    idle: str | None = None


class JobsView(msgspec.Struct, kw_only=True):
    count: int
    by_state: dict[str, int]
    jobs: list[JobView]


class QueueView(msgspec.Struct, kw_only=True):
    depth: int
    gpus_requested: int
    by_team: dict[str, int]
    jobs: list[JobView]


class QuotaView(msgspec.Struct, kw_only=True):
    pool: str
    guaranteed_gpus: int
    borrow_limit: int | None
    lend_limit: int | None
    weight: float
    fair_share: float | None = None


class TeamView(msgspec.Struct, kw_only=True):
    team: str
    guaranteed_gpus: int
    used_gpus: int
    borrowed_gpus: int  # in use beyond the guarantee (capacity lent by others)
    unused_guarantee_gpus: int  # guaranteed but not in use (lendable to others)
    usage_of_guarantee: float | None  # used / guaranteed; None without a guarantee
    running_jobs: int
    pending_jobs: int
    fair_share: float | None
    cost: float
    gpu_hours: float
    cost_rate_per_hour: float
    currency: str
    budget: float | None
    budget_period: str
    budget_exceeded: bool
    quotas: list[QuotaView] = []


class TeamsView(msgspec.Struct, kw_only=True):
    teams: list[TeamView]


class PointView(msgspec.Struct, kw_only=True, array_like=False):
    at: float
    capacity: int
    allocated: int
    busy: float
    idle: int
    queue_depth: int
    efficiency_score: float
    idle_ratio: float
    cost_total: float


class EfficiencyView(msgspec.Struct, kw_only=True):
    source: str  # "live": from the read model; historical windows come from the warehouse
    gpus_total: int
    capacity: int
    allocated: int
    busy: float
    idle: int
    isolated: int
    allocated_idle: int
    allocation_ratio: float
    usage_ratio: float
    efficiency_score: float
    idle_ratio: float
    history: list[PointView] = []


class TeamCost(msgspec.Struct, kw_only=True):
    team: str
    cost: float
    gpu_hours: float
    rate_per_hour: float
    budget: float | None
    budget_exceeded: bool


class PriceView(msgspec.Struct, kw_only=True):
    gpu_model: str
    price_per_gpu_hour: float
    currency: str


class IdlePlace(msgspec.Struct, kw_only=True):
    """Where idle money goes: idle cost by provider, region and cluster of the GPUs."""

    provider: str
    region: str
    cluster: str
    idle_cost: float


class CostView(msgspec.Struct, kw_only=True):
    currency: str
    total: float
    idle_cost: float
    idle_gpu_hours: float
    rate_per_hour: float
    by_team: list[TeamCost]
    prices: list[PriceView]
    idle_by_place: list[IdlePlace] = []


class TimelineView(msgspec.Struct, kw_only=True):
    at: float
    kind: str
    cluster: str
    node: str
    detail: str
    severity: str
    gpu_index: int | None = None


class HeldView(msgspec.Struct, kw_only=True):
    """An isolation the isolation budget held back: the fault would have isolated the GPU or node;
    it waits for `chamber health confirm` (or `dismiss`). New work is kept off it meanwhile."""

    cluster: str
    node: str
    gpu_index: int | None
    at: float
    action: str
    reason: str
    fault_ids: list[str] = []


class FaultsView(msgspec.Struct, kw_only=True):
    faults_total: int
    isolations: list[Isolation]
    timeline: list[TimelineView]
    held: list[HeldView] = []  # isolations held for an operator's confirmation, oldest first


class Summary(msgspec.Struct, kw_only=True):
    """Everything the dashboard draws, in one document (also pushed by /api/stream)."""

    at: float
    events_seen: int
    fleet: FleetView
    efficiency: EfficiencyView
    queue: QueueView
    running: JobsView
    teams: TeamsView
    cost: CostView
    faults: FaultsView


class CommandAnswer(msgspec.Struct, kw_only=True):
    """A command the owning service accepted; `result` is what that service answered."""

    ok: bool
    result: Any = None


class Problem(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The body of every 4xx/5xx answer: what was wrong, and which field when one was."""

    error: str
    status: int
    field: str | None = None


# --- builders --------------------------------------------------------------------------------------


def natural(name: str) -> tuple[str | int, ...]:
    """Sort key that puts gpu-2 before gpu-10 (digit runs compare as numbers)."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", name)))


def _isolation(iso: core.Isolation | None) -> Isolation | None:
    if iso is None:
        return None
    return Isolation(
        cluster=iso.cluster,
        node=iso.node,
        gpu_index=iso.gpu_index,
        at=iso.at,
        reason=iso.reason,
        fault_ids=list(iso.fault_ids),
        until=iso.until,
    )


def _health(node: Node, gpu: core.Gpu) -> str:
    if node.isolated is not None:
        return "node_isolated"
    if gpu.isolated is not None:
        return "isolated"
    return node.status


def node_view(state: GatewayState, node: Node, *, with_gpus: bool = True) -> NodeView:
    gpus: list[GpuView] = []
    allocated = isolated = 0
    utils: list[float] = []
    for gpu in sorted(node.gpus.values(), key=lambda g: g.index):
        job_id = state.allocations.get((node.cluster, node.name, gpu.index))
        job = state.jobs.get(job_id) if job_id else None
        allocated += job_id is not None
        isolated += node.isolated is not None or gpu.isolated is not None
        if gpu.utilization_pct is not None:
            utils.append(gpu.utilization_pct)
        if with_gpus:
            gpus.append(
                GpuView(
                    cluster=node.cluster,
                    node=node.name,
                    index=gpu.index,
                    uuid=gpu.uuid,
                    model=gpu.model,
                    vendor=gpu.vendor,
                    health=_health(node, gpu),
                    utilization_pct=gpu.utilization_pct,
                    memory_used_mib=gpu.memory_used_mib,
                    memory_total_mib=gpu.memory_total_mib,
                    temperature_c=gpu.temperature_c,
                    power_w=gpu.power_w,
                    job_id=job_id,
                    team=job.team if job is not None else None,
                    isolation=_isolation(gpu.isolated),
                )
            )
    return NodeView(
        cluster=node.cluster,
        node=node.name,
        status=node.status,
        isolated=node.isolated is not None,
        gpus_total=len(node.gpus),
        gpus_allocated=allocated,
        gpus_isolated=isolated,
        utilization_avg_pct=round(sum(utils) / len(utils), 2) if utils else None,
        last_seen_at=node.last_seen_at,
        simulated=node.simulated,
        labels=dict(node.labels),
        isolation=_isolation(node.isolated),
        gpus=gpus,
    )


def fleet(state: GatewayState, *, with_gpus: bool = True) -> FleetView:
    eff = core.efficiency(state)
    ordered = sorted(state.nodes.values(), key=lambda n: (natural(n.cluster), natural(n.name)))
    nodes = [node_view(state, n, with_gpus=with_gpus) for n in ordered]
    by_status: dict[str, int] = {}
    for n in nodes:
        by_status[n.status] = by_status.get(n.status, 0) + 1
    return FleetView(
        nodes_total=len(nodes),
        nodes_by_status=by_status,
        nodes_isolated=sum(n.isolated for n in nodes),
        gpus_total=eff.total,
        gpus_in_service=eff.capacity,
        gpus_allocated=eff.allocated,
        gpus_idle=eff.idle,
        gpus_isolated=eff.isolated,
        nodes=nodes,
    )


def gpus(state: GatewayState) -> list[GpuView]:
    return [g for n in fleet(state).nodes for g in n.gpus]


def job_view(job: Job, reason: str | None = None) -> JobView:
    spec = job.spec
    return JobView(
        job_id=job.job_id,
        name=spec.name if spec is not None else "",
        team=job.team,
        state=job.state.value,
        priority=spec.priority.value if spec is not None else None,
        gpus=job.total_gpus,
        replicas=spec.replicas if spec is not None else None,
        gpus_per_replica=spec.gpus_per_replica if spec is not None else None,
        gpu_model=spec.gpu_model if spec is not None else None,
        preemptible=spec.preemptible if spec is not None else None,
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        updated_at=job.updated_at,
        reason=reason if reason is not None else job.reason,
        borrowed_gpus=job.borrowed_gpus,
        preemptions=job.preemptions,
        placements=list(job.placements),
        idle=job.idle or None,
    )


def _free_gpus(state: GatewayState) -> dict[core.NodeKey, list[core.Gpu]]:
    free: dict[core.NodeKey, list[core.Gpu]] = {}
    for node in state.nodes.values():
        for gpu in node.gpus.values():
            if core.gpu_in_service(node, gpu) and (node.cluster, node.name, gpu.index) not in state.allocations:
                free.setdefault(node.key, []).append(gpu)
    return free


def pending_reason(
    job: Job, free: dict[core.NodeKey, list[core.Gpu]], free_nodes: list[Node], said: dict[str, str] | None = None
) -> str:
    """Why a queued job waits: the scheduler's own reason (`said`, from its queue answer) if it gave one,
    else the last event's, else what the fleet shows.

    `free_nodes` are the nodes in service (their size bounds what must fit on one node).
    """
    if said and said.get(job.job_id):
        return said[job.job_id]
    if job.reason:
        return job.reason
    spec = job.spec
    if spec is None:
        return "waiting for its submission to be seen"
    model = spec.gpu_model
    per_node = [sum(1 for g in gs if model is None or g.model == model) for gs in free.values()]
    what = f"{model} GPUs" if model else "GPUs"
    if sum(per_node) < spec.total_gpus:
        return f"waiting for {spec.total_gpus} free {what}; {sum(per_node)} free now"
    largest_node = max((len(n.gpus) for n in free_nodes), default=0)
    fitting_nodes = sum(n // spec.gpus_per_replica for n in per_node)
    # a replica of up to one node's GPUs is kept on one node (NVLink domain); larger ones span nodes
    if spec.gpus_per_replica <= largest_node and fitting_nodes < spec.replicas:
        return (
            f"waiting for {spec.replicas} x {spec.gpus_per_replica} {what} on single nodes; "
            f"largest free block is {max(per_node, default=0)}"
        )
    return "the scheduler has not said why yet (`chamber explain` asks it)"


def queue(state: GatewayState) -> QueueView:
    waiting = core.queue(state)
    free = _free_gpus(state)
    nodes = [n for n in state.nodes.values() if n.in_service]
    by_team: dict[str, int] = {}
    for job in waiting:
        by_team[job.team] = by_team.get(job.team, 0) + 1
    return QueueView(
        depth=len(waiting),
        gpus_requested=sum(j.total_gpus for j in waiting),
        by_team=by_team,
        jobs=[job_view(j, pending_reason(j, free, nodes, state.waiting_reasons)) for j in waiting],
    )


def jobs(state: GatewayState, *, states: set[str] | None = None, team: str | None = None, limit: int = 500) -> JobsView:
    by_state: dict[str, int] = {}
    selected: list[Job] = []
    for job in state.jobs.values():
        by_state[job.state.value] = by_state.get(job.state.value, 0) + 1
        if (states is None or job.state.value in states) and (team is None or job.team == team):
            selected.append(job)
    selected.sort(key=lambda j: (-j.updated_at, j.job_id))  # newest activity first, stable
    return JobsView(count=len(selected), by_state=by_state, jobs=[job_view(j) for j in selected[:limit]])


def teams(state: GatewayState) -> TeamsView:
    used = core.team_gpus_in_use(state)
    rates = core.cost_rate_by_team(state)
    running: dict[str, int] = {}
    pending: dict[str, int] = {}
    for job in state.jobs.values():
        if job.state.holds_gpus:
            running[job.team] = running.get(job.team, 0) + 1
        elif job.state.queued:
            pending[job.team] = pending.get(job.team, 0) + 1
    names = set(state.teams) | set(used) | set(pending) | set(running)
    names.discard("")
    views = []
    for name in sorted(names):
        team = state.teams.get(name) or core.Team(name)
        guaranteed = team.guaranteed_gpus
        in_use = used.get(name, 0)
        shares = list(team.fair_share.values())
        views.append(
            TeamView(
                team=name,
                guaranteed_gpus=guaranteed,
                used_gpus=in_use,
                borrowed_gpus=max(0, in_use - guaranteed),
                unused_guarantee_gpus=max(0, guaranteed - in_use),
                usage_of_guarantee=round(in_use / guaranteed, 4) if guaranteed else None,
                running_jobs=running.get(name, 0),
                pending_jobs=pending.get(name, 0),
                fair_share=min(shares) if shares else None,
                cost=round(team.cost, 4),
                gpu_hours=round(team.gpu_seconds / 3600.0, 4),
                cost_rate_per_hour=round(rates.get(name, 0.0), 4),
                currency=team.budget_currency if team.budget is not None else state.currency,
                budget=team.budget,
                budget_period=team.budget_period,
                budget_exceeded=team.budget_exceeded_at is not None,
                quotas=[
                    QuotaView(
                        pool=q.pool,
                        guaranteed_gpus=q.guaranteed_gpus,
                        borrow_limit=q.borrow_limit,
                        lend_limit=q.lend_limit,
                        weight=q.weight,
                        fair_share=team.fair_share.get(q.pool),
                    )
                    for q in sorted(team.quotas.values(), key=lambda q: q.pool)
                ],
            )
        )
    return TeamsView(teams=views)


def _point(p: core.Point) -> PointView:
    return PointView(
        at=p.at,
        capacity=p.capacity,
        allocated=p.allocated,
        busy=p.busy,
        idle=p.idle,
        queue_depth=p.queue_depth,
        efficiency_score=round(p.busy / p.capacity, 4) if p.capacity else 0.0,
        idle_ratio=round(p.idle / p.capacity, 4) if p.capacity else 0.0,
        cost_total=round(p.cost_total, 4),
    )


def efficiency(state: GatewayState, *, history: bool = True) -> EfficiencyView:
    eff = core.efficiency(state)
    return EfficiencyView(
        source="live",
        gpus_total=eff.total,
        capacity=eff.capacity,
        allocated=eff.allocated,
        busy=round(eff.busy, 4),
        idle=eff.idle,
        isolated=eff.isolated,
        allocated_idle=eff.allocated_idle,
        allocation_ratio=round(eff.allocation_ratio, 4),
        usage_ratio=round(eff.usage_ratio, 4),
        efficiency_score=round(eff.score, 4),
        idle_ratio=round(eff.idle_ratio, 4),
        history=[_point(p) for p in state.history] if history else [],
    )


def cost(state: GatewayState) -> CostView:
    rates = core.cost_rate_by_team(state)
    names = sorted(set(state.teams) | set(rates))
    by_team = []
    for name in names:
        team = state.teams.get(name) or core.Team(name)
        by_team.append(
            TeamCost(
                team=name,
                cost=round(team.cost, 4),
                gpu_hours=round(team.gpu_seconds / 3600.0, 4),
                rate_per_hour=round(rates.get(name, 0.0), 4),
                budget=team.budget,
                budget_exceeded=team.budget_exceeded_at is not None,
            )
        )
    by_team.sort(key=lambda t: (-t.cost, t.team))
    return CostView(
        currency=state.currency,
        total=round(core.cost_total(state), 4),
        idle_cost=round(state.idle_cost, 4),
        idle_gpu_hours=round(state.idle_gpu_seconds / 3600.0, 4),
        rate_per_hour=round(sum(rates.values()), 4),
        by_team=by_team,
        prices=[
            PriceView(gpu_model=p.gpu_model, price_per_gpu_hour=p.price_per_gpu_hour, currency=p.currency)
            for p in sorted(state.prices.values(), key=lambda p: p.gpu_model)
        ],
        idle_by_place=[
            IdlePlace(provider=p, region=r, cluster=c, idle_cost=round(v, 4))
            for (p, r, c), v in sorted(state.idle_by_place.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
    )


def _held_order(h: core.HeldIsolation) -> tuple[float, str, str, int]:
    return (h.at, h.cluster, h.node, -1 if h.gpu_index is None else h.gpu_index)


def faults(state: GatewayState, *, limit: int = 200) -> FaultsView:
    isolations: list[Isolation] = []
    for node in sorted(state.nodes.values(), key=lambda n: n.key):
        if node.isolated is not None:
            isolations.append(_isolation(node.isolated))  # type: ignore[arg-type]
        for gpu in sorted(node.gpus.values(), key=lambda g: g.index):
            if gpu.isolated is not None:
                isolations.append(_isolation(gpu.isolated))  # type: ignore[arg-type]
    entries = sorted(state.timeline, key=lambda e: (-e.at, e.cluster, e.node, e.kind))[:limit]
    held = [
        HeldView(
            cluster=h.cluster,
            node=h.node,
            gpu_index=h.gpu_index,
            at=h.at,
            action=h.action,
            reason=h.reason,
            fault_ids=list(h.fault_ids),
        )
        for h in sorted(
            state.held.values(), key=lambda h: (h.at, h.cluster, h.node, -1 if h.gpu_index is None else h.gpu_index)
        )
    ]
    return FaultsView(
        faults_total=state.faults_total,
        held=held,
        isolations=isolations,
        timeline=[
            TimelineView(
                at=e.at,
                kind=e.kind,
                cluster=e.cluster,
                node=e.node,
                detail=e.detail,
                severity=e.severity,
                gpu_index=e.gpu_index,
            )
            for e in entries
        ],
    )


def summary(state: GatewayState, now: float) -> Summary:
    return Summary(
        at=now,
        events_seen=state.events_seen,
        fleet=fleet(state),
        efficiency=efficiency(state),
        queue=queue(state),
        running=jobs(state, states={"scheduled", "running"}, limit=200),
        teams=teams(state),
        cost=cost(state),
        faults=faults(state, limit=100),
    )
