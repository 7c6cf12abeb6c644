"""Billing's pure core: fold JOBS, FLEET, QUOTA and BILLING events into who held which GPUs when, and
turn every closed period into CostAccrued events (per job and GPU model; idle capacity per pool) and
BudgetExceeded when a team's spending in a month passes its budget.

- `evolve(state, event, event_id)` folds one event in (mutating `state`, returned for chaining).
- `decide(state, now)` returns the decisions due at `now`, leaving `state` unchanged; the shell
  publishes them and folds them back in with `evolve`. Ids are deterministic (`stable_id`), so a
  replay re-emits the same ids and JetStream drops them.
A period [p, p + period_s) is accrued once it ended `settle_s` ago (late events still count).
A GPU's price is its node's instance type's, else its cluster's (an on-premises amortised rate),
else its model's (`price_of`). Costs are grouped by job (idle: by pool) and by GPU model, cluster,
provider and region (discovery's `chamber.io/` node labels), so reports can split them by cloud.
Shared GPUs: a placement holds `share_milli` of each of its GPUs (a fraction by its share, a MIG instance
by the mean of its compute and memory fractions), and is charged that share of the GPU's seconds, so
four pods at 25 % for an hour are one GPU-hour; what no share holds of a GPU in service is idle, so for
every physical GPU the shares plus idle equal its seconds (`gpu_ledger` shows it per GPU).
Known simplifications: the current price applies to the whole period; budgets are monthly (UTC
calendar months) whatever their `period` says.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from events import (
    BudgetExceeded,
    BudgetSet,
    CostAccrued,
    Event,
    GpuIsolated,
    GpuRestored,
    JobScheduled,
    JobSubmitted,
    NodeDiscovered,
    NodeForgotten,
    NodeInventory,
    NodeIsolated,
    NodeLost,
    NodeRestored,
    NodeUpdated,
    PoolDefined,
    PoolRemoved,
    PriceSet,
)
from events.codec import stable_id
from events.jobs import JobResumed
from services.billing.idle import Reclaimed
from services.billing.idle import fold as fold_reclaimed
from services.billing.price_table import resolve
from services.billing.serving import ServingLedger
from services.billing.serving import fold as fold_serving
from services.pools import PoolDef, node_pool

GpuKey = tuple[str, str, int]  # cluster, node, gpu index
_JOB_ENDS = {"io.chamber.jobs.completed.v1", "io.chamber.jobs.failed.v1", "io.chamber.jobs.cancelled.v1"}
_JOB_STOPS = {
    "io.chamber.jobs.preempted.v1",
    "io.chamber.jobs.suspended.v1",
    "io.chamber.jobs.requeued.v1",
    "io.chamber.jobs.completed.v1",
    "io.chamber.jobs.failed.v1",
    "io.chamber.jobs.cancelled.v1",
}


@dataclass(frozen=True)
class Held:
    job_id: str
    team: str
    gpu: GpuKey
    start: float
    end: float | None  # None: still held
    share: float = 1.0  # of the GPU (GPU-equivalents): below 1 for a fraction or a MIG instance


@dataclass(frozen=True)
class InService:
    gpu: GpuKey
    start: float
    end: float | None


# The meaning of this core's fold, for its snapshots (services/runtime/state_codec.py): bump it when a
# change makes a state folded by the previous release wrong for this one (a field's meaning, what an
# event does); the first start after it folds the log from the start. Comments, logs, speed: no bump.
# 2: GPU-hours reclaimed from idle jobs (billing/idle.py)
# 3: cost and tokens per serving workload (billing/serving.py)
# 4: forgotten nodes leave the state once the time on their GPUs is accrued (NodeForgotten, BillingState.forgotten)
STATE_VERSION = 4


@dataclass
class BillingState:
    period_s: float = 300.0
    settle_s: float = 30.0
    currency: str = "USD"
    prices: dict[str, float] = field(default_factory=dict)
    price_at: dict[str, float] = field(default_factory=dict)
    instance_prices: dict[str, float] = field(default_factory=dict)
    cluster_prices: dict[str, float] = field(default_factory=dict)
    gpu_model: dict[GpuKey, str] = field(default_factory=dict)
    node_labels: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    pools: dict[str, PoolDefined] = field(default_factory=dict)
    job_team: dict[str, str] = field(default_factory=dict)
    job_pool: dict[str, str] = field(default_factory=dict)
    held: list[Held] = field(default_factory=list)  # closed intervals not accrued yet, in the order they closed
    open_held: dict[str, list[Held]] = field(default_factory=dict)  # job -> GPUs it holds now
    finished: dict[str, float] = field(default_factory=dict)  # job -> when it ended, until it is accrued
    service: list[InService] = field(default_factory=list)
    isolated_nodes: set[tuple[str, str]] = field(default_factory=set)
    isolated_gpus: set[GpuKey] = field(default_factory=set)
    # Nodes forgotten (NodeForgotten) whose GPUs' models and labels are kept until the intervals on
    # them are accrued (they price those), then dropped with them
    forgotten: set[tuple[str, str]] = field(default_factory=set)
    accrued_until: float | None = None
    accrued_any: bool = False  # a CostAccrued was folded: accrual continues from it, never earlier
    budgets: dict[str, float] = field(default_factory=dict)
    spent: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    exceeded: set[tuple[str, str]] = field(default_factory=set)
    # Ids folded lately (id -> event time), for de-duplication; forgotten DEDUP_WINDOW_S behind what
    # is accrued (a CostAccrued of a period already accrued is a duplicate whatever its id), so the
    # state stays bounded however long the history.
    seen: dict[str, float] = field(default_factory=dict)
    reclaimed: Reclaimed = field(default_factory=Reclaimed)  # idle reclaim's GPU-hours (billing/idle.py)
    serving: ServingLedger = field(default_factory=ServingLedger)  # cost per serving workload (billing/serving.py)


def month_of(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m")


def _month_end(month: str) -> float:
    year, mon = (int(x) for x in month.split("-"))
    year, mon = (year + 1, 1) if mon == 12 else (year, mon + 1)
    return datetime(year, mon, 1, tzinfo=UTC).timestamp()


def _floor(ts: float, period: float) -> float:
    return (ts // period) * period


def pool_of(state: BillingState, gpu: GpuKey) -> str:
    """The pool the scheduler places this GPU's node in (one shared rule: `services.pools`)."""
    defs = {name: PoolDef(name, p.gpu_model, dict(p.node_selector)) for name, p in state.pools.items()}
    return node_pool(defs, state.gpu_model.get(gpu, ""), state.node_labels.get(gpu[:2], {}))


def _open_service(state: BillingState, gpu: GpuKey, at: float) -> None:
    if not any(s.gpu == gpu and s.end is None for s in state.service):
        state.service.append(InService(gpu, at, None))


def _close_service(state: BillingState, at: float, match: Callable[[GpuKey], bool]) -> None:
    state.service = [InService(s.gpu, s.start, at) if s.end is None and match(s.gpu) else s for s in state.service]


def _node_gpus(state: BillingState, cluster: str, node: str) -> list[GpuKey]:
    return [g for g in state.gpu_model if g[0] == cluster and g[1] == node]


DEDUP_WINDOW_S = 3600.0  # event time: far beyond JetStream's own duplicate window


def evolve(state: BillingState, event: Event, event_id: str = "") -> BillingState:
    if event_id and event_id in state.seen:
        return state
    at = getattr(event, "at", None)
    if isinstance(event, CostAccrued):
        if state.accrued_any and state.accrued_until is not None and event.period_end < state.accrued_until:
            return state  # a later period is accrued already: this one was (a replayed decision)
        at = event.period_end
    if event_id:
        state.seen[event_id] = float(at) if isinstance(at, float | int) else (state.accrued_until or 0.0)
    at = getattr(event, "at", None)
    if (
        isinstance(at, float | int)
        and not state.accrued_any
        and not isinstance(event, PriceSet | BudgetSet | CostAccrued | BudgetExceeded)
    ):
        # Accrual starts at the earliest fact, whichever stream it was folded from (not at the first
        # one folded), so the state does not depend on the order the streams were merged in.
        start = _floor(float(at), state.period_s)
        state.accrued_until = start if state.accrued_until is None else min(state.accrued_until, start)
    fold_reclaimed(state.reclaimed, event)
    fold_serving(state.serving, event)
    match event:
        case PriceSet():
            table, price_key, at_key = _price_table(state, event)
            if event.at >= state.price_at.get(at_key, float("-inf")):
                table[price_key] = event.price_per_gpu_hour
                state.price_at[at_key] = event.at
        case PoolDefined():
            state.pools[event.pool] = event
        case PoolRemoved():
            state.pools.pop(event.pool, None)
        case BudgetSet():
            state.budgets[event.team] = event.amount
        case NodeDiscovered() | NodeUpdated() | NodeInventory():
            when = event.observed_at if isinstance(event, NodeInventory) else event.at
            state.forgotten.discard((event.cluster, event.node))  # back: a node again
            state.node_labels[(event.cluster, event.node)] = dict(event.labels)
            for g in event.gpus:
                key = (event.cluster, event.node, g.index)
                state.gpu_model[key] = g.model
                if (event.cluster, event.node) not in state.isolated_nodes and key not in state.isolated_gpus:
                    _open_service(state, key, when)
        case NodeLost() | NodeIsolated():
            node = (event.cluster, event.node)
            if isinstance(event, NodeIsolated):
                state.isolated_nodes.add(node)
            _close_service(state, event.at, lambda g: g[:2] == node)
        case NodeForgotten():
            node = (event.cluster, event.node)
            _close_service(state, event.at, lambda g: g[:2] == node)  # lost first: closed already
            state.forgotten.add(node)
            _drop_forgotten(state)
        case NodeRestored():
            state.isolated_nodes.discard((event.cluster, event.node))
            for key in _node_gpus(state, event.cluster, event.node):
                if key not in state.isolated_gpus:
                    _open_service(state, key, event.at)
        case GpuIsolated():
            key = (event.cluster, event.node, event.gpu_index)
            state.isolated_gpus.add(key)
            _close_service(state, event.at, lambda g: g == key)
        case GpuRestored():
            key = (event.cluster, event.node, event.gpu_index)
            state.isolated_gpus.discard(key)
            if key in state.gpu_model and (event.cluster, event.node) not in state.isolated_nodes:
                _open_service(state, key, event.at)
        case JobSubmitted():
            state.job_team[event.job_id] = event.spec.team
            if event.spec.pool:
                state.job_pool[event.job_id] = event.spec.pool
        case JobScheduled() | JobResumed():
            team = event.team if isinstance(event, JobScheduled) else state.job_team.get(event.job_id, "")
            state.job_team.setdefault(event.job_id, team)
            state.finished.pop(event.job_id, None)
            _stop_job(state, event.job_id, event.at)  # a start without a stop: the old placement ended
            state.open_held[event.job_id] = [
                Held(
                    event.job_id,
                    state.job_team[event.job_id],
                    (p.cluster, p.node, i),
                    event.at,
                    None,
                    p.share_milli / 1000,
                )
                for p in event.placements
                for i in p.gpu_indices
            ]
        case CostAccrued():
            state.accrued_any = True
            if event.team:
                state.spent[(event.team, month_of(event.period_start))] += event.cost
            before = state.accrued_until
            state.accrued_until = max(state.accrued_until or event.period_end, event.period_end)
            if state.accrued_until != before:  # once per period, not per cost line
                _prune(state)
        case BudgetExceeded():
            state.exceeded.add((event.team, month_of(event.at)))
        case _ if type(event).ce_type() in _JOB_STOPS:
            _stop_job(state, event.job_id, event.at)  # type: ignore[attr-defined]
            if type(event).ce_type() in _JOB_ENDS:
                state.finished[event.job_id] = event.at  # type: ignore[attr-defined]
    return state


def _price_table(state: BillingState, event: PriceSet) -> tuple[dict[str, float], str, str]:
    """Which table a price goes to, its key there, and its key in `price_at` (a model's is bare)."""
    if event.instance_type:
        return state.instance_prices, event.instance_type, f"instance:{event.instance_type}"
    if event.cluster:
        return state.cluster_prices, event.cluster, f"cluster:{event.cluster}"
    return state.prices, event.gpu_model, event.gpu_model


PROVIDER_LABEL, REGION_LABEL, INSTANCE_LABEL = "chamber.io/provider", "chamber.io/region", "chamber.io/instance-type"


def price_of(state: BillingState, gpu: GpuKey) -> float:
    """Per GPU-hour: the node's instance type, else its cluster, else its GPU model, else 0."""
    price = resolve(
        state.node_labels.get(gpu[:2], {}).get(INSTANCE_LABEL),
        gpu[0],
        state.gpu_model.get(gpu, "unknown"),
        instance_prices=state.instance_prices,
        cluster_prices=state.cluster_prices,
        model_prices=state.prices,
    )
    return 0.0 if price is None else price


def _where(state: BillingState, gpu: GpuKey) -> tuple[str, str | None, str | None]:
    labels = state.node_labels.get(gpu[:2], {})
    return gpu[0], labels.get(PROVIDER_LABEL), labels.get(REGION_LABEL)


def _stop_job(state: BillingState, job_id: str, at: float) -> None:
    """Close the job's open intervals (a lookup by job: a long history costs nothing here)."""
    for h in state.open_held.pop(job_id, ()):
        state.held.append(Held(h.job_id, h.team, h.gpu, h.start, at, h.share))


def _prune(state: BillingState) -> None:
    """Forget intervals that ended before everything accrued, the jobs that ended then, and ids
    too old to come again: the state holds what is not accrued yet, not the history."""
    cutoff = state.accrued_until or 0.0
    state.held = [h for h in state.held if h.end is None or h.end > cutoff]
    state.service = [s for s in state.service if s.end is None or s.end > cutoff]
    gone = [job for job, end in state.finished.items() if end <= cutoff and job not in state.open_held]
    for job in gone:
        del state.finished[job]
        state.job_team.pop(job, None)
        state.job_pool.pop(job, None)
        state.serving.replica_of.pop(job, None)
    horizon = cutoff - max(DEDUP_WINDOW_S, state.period_s)
    state.seen = {i: t for i, t in state.seen.items() if t >= horizon}
    _drop_forgotten(state)


def _drop_forgotten(state: BillingState) -> None:
    """Forgotten nodes no interval still to accrue runs on leave the state: models, labels, isolations."""
    if not state.forgotten:
        return
    busy = {s.gpu[:2] for s in state.service} | {h.gpu[:2] for h in held_intervals(state)}
    for node in sorted(state.forgotten - busy):
        state.forgotten.discard(node)
        state.node_labels.pop(node, None)
        state.isolated_nodes.discard(node)
        for gpu in [g for g in state.gpu_model if g[:2] == node]:
            del state.gpu_model[gpu]
        state.isolated_gpus = {g for g in state.isolated_gpus if g[:2] != node}


def held_intervals(state: BillingState) -> list[Held]:
    """Closed intervals not accrued yet, then the open ones (by job, in the order they started)."""
    return [*state.held, *(h for hs in state.open_held.values() for h in hs)]


def _overlap(start: float, end: float | None, p0: float, p1: float) -> float:
    return max(0.0, min(end if end is not None else p1, p1) - max(start, p0))


def period_costs(state: BillingState, p0: float, p1: float) -> list[tuple[CostAccrued, str]]:
    """Cost per (job, model, where) and idle cost per (pool, model, where) for [p0, p1); where is the
    cluster, provider and region, and each GPU-second costs its own GPU's price (`price_of`)."""
    Where = tuple[str, str | None, str | None]
    held: dict[tuple[str, str, str, Where], list[float]] = defaultdict(lambda: [0.0, 0.0])  # seconds, cost
    held_by_gpu: dict[GpuKey, float] = defaultdict(float)
    for h in held_intervals(state):
        seconds = _overlap(h.start, h.end, p0, p1) * h.share  # GPU-equivalent seconds
        if seconds > 0:
            acc = held[(h.job_id, h.team, state.gpu_model.get(h.gpu, "unknown"), _where(state, h.gpu))]
            acc[0] += seconds
            acc[1] += seconds / 3600 * price_of(state, h.gpu)
            held_by_gpu[h.gpu] += seconds

    def cost(model: str, where: Where, seconds: float, amount: float, **who: Any) -> CostAccrued:
        cluster, provider, region = where
        return CostAccrued(
            period_start=p0,
            period_end=p1,
            gpu_model=model,
            gpu_seconds=seconds,
            cost=round(amount, 6),
            currency=state.currency,
            cluster=cluster or None,
            provider=provider,
            region=region,
            **who,
        )

    out: list[tuple[CostAccrued, str]] = []
    for (job, team, model, where), (seconds, amount) in sorted(held.items(), key=lambda kv: _sort_key(kv[0])):
        serving = state.serving.replica_of.get(job)
        event = cost(
            model, where, seconds, amount, team=team or None, job_id=job, pool=state.job_pool.get(job), serving=serving
        )
        out.append((event, stable_id("billing.cost", job, model, p0, p1, *_id_parts(where))))
    idle: dict[tuple[str, str, Where], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s in state.service:
        capacity = _overlap(s.start, s.end, p0, p1)
        if capacity > 0:
            unheld = max(0.0, capacity - held_by_gpu.get(s.gpu, 0.0))
            acc = idle[(pool_of(state, s.gpu), state.gpu_model.get(s.gpu, "unknown"), _where(state, s.gpu))]
            acc[0] += unheld
            acc[1] += unheld / 3600 * price_of(state, s.gpu)
    for (pool, model, where), (seconds, amount) in sorted(idle.items(), key=lambda kv: _sort_key(kv[0])):
        if seconds <= 0:
            continue
        event = cost(model, where, seconds, amount, pool=pool, idle=True)
        out.append((event, stable_id("billing.idle", pool, model, p0, p1, *_id_parts(where))))
    return out


@dataclass
class GpuLedger:
    """One physical GPU over a period: GPU-equivalent seconds each job held, what was idle, and their
    cost. `held + idle == in_service` unless the shares held exceed the GPU (then idle is 0)."""

    in_service: float = 0.0
    held: dict[str, float] = field(default_factory=dict)  # job -> GPU-equivalent seconds
    idle: float = 0.0
    idle_cost: float = 0.0
    price_per_hour: float = 0.0


def gpu_ledger(state: BillingState, p0: float, p1: float) -> dict[GpuKey, GpuLedger]:
    """Per physical GPU in [p0, p1): the seconds it was in service, each job's share of them, and the
    idle rest with its cost (so a GPU whose every MIG slice is allocated still shows the slices'
    unallocatable remainder as idle)."""
    out: dict[GpuKey, GpuLedger] = {}
    for s in state.service:
        capacity = _overlap(s.start, s.end, p0, p1)
        if capacity > 0:
            row = out.setdefault(s.gpu, GpuLedger(price_per_hour=price_of(state, s.gpu)))
            row.in_service += capacity
    for h in held_intervals(state):
        seconds = _overlap(h.start, h.end, p0, p1) * h.share
        if seconds > 0:
            row = out.setdefault(h.gpu, GpuLedger(price_per_hour=price_of(state, h.gpu)))
            row.held[h.job_id] = row.held.get(h.job_id, 0.0) + seconds
    for row in out.values():
        row.idle = max(0.0, row.in_service - sum(row.held.values()))
        row.idle_cost = row.idle / 3600 * row.price_per_hour
    return out


def _sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(tuple(x or "" for x in k) if isinstance(k, tuple) else k for k in key)


def _id_parts(where: tuple[str, str | None, str | None]) -> tuple[str, ...]:
    """The place joins the id only when the nodes say where they are, so ids from before stay stable."""
    cluster, provider, region = where
    return (cluster, provider or "", region or "") if provider or region else ()


def decide(state: BillingState, now: float) -> list[tuple[Event, str]]:
    """Costs of every period that closed `settle_s` before `now`, then budgets exceeded."""
    if state.accrued_until is None:
        return []
    out: list[tuple[Event, str]] = []
    spent = defaultdict(float, state.spent)
    p0 = state.accrued_until
    while p0 + state.period_s <= now - state.settle_s:
        p1 = p0 + state.period_s
        for event, event_id in period_costs(state, p0, p1):
            out.append((event, event_id))
            if event.team:
                spent[(event.team, month_of(p0))] += event.cost
        p0 = p1
    for (team, month), amount in sorted(spent.items()):
        budget = state.budgets.get(team)
        if budget is not None and amount > budget and (team, month) not in state.exceeded:
            at = now if month_of(now) == month else _month_end(month) - 0.001  # keep it in its month
            exceeded = BudgetExceeded(team=team, at=at, budget=budget, spent=round(amount, 6), currency=state.currency)
            out.append((exceeded, stable_id("billing.budget_exceeded", team, month)))
    return out
