"""The quota service's pure core: pools, team quotas, usage and Slurm-style decayed fair share.

Fair share (Slurm's classic multifactor formula): a team's usage decays with a half-life,
U = its decayed GPU-seconds / all teams' in the pool, S = its share (weight x guarantee, normalized
in the pool; by weight alone when no team has a guarantee), factor F = 2^(-U/S) in (0, 1]: 1 for a
team that used nothing, 0.5 for one that used exactly its share. Decayed usage is integrated
exactly between job events: usage u held for dt adds u x h/ln2 x (1 - 2^(-dt/h)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from events import (
    BudgetSet,
    Event,
    FairShareUpdated,
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
    JobSubmitted,
    JobSuspended,
    NodeDiscovered,
    NodeForgotten,
    NodeIsolated,
    NodeLost,
    NodeRestored,
    NodeStatus,
    NodeUpdated,
    Placement,
    PoolDefined,
    PoolRemoved,
    TeamQuotaSet,
)
from events.codec import stable_id
from services.pools import DEFAULT_POOL, PoolDef, Quota, node_pool

DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0  # Slurm's default PriorityDecayHalfLife (7 days)
PUBLISH_DELTA = 0.01  # publish a factor when it moved at least this much


class QuotaRefused(ValueError):
    """A quota command that cannot be applied; `field` names what to fix."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class NodeCap:
    model: str
    labels: dict[str, str]
    gpus: set[int]
    bad: set[int] = field(default_factory=set)
    in_service: bool = True
    lost: bool = False  # discovery declared it gone (silent): no longer installed capacity

    @property
    def healthy(self) -> int:
        return len(self.gpus - self.bad) if self.in_service else 0

    @property
    def installed(self) -> int:
        """GPUs the node has, isolated or not: what quotas are promises about."""
        return 0 if self.lost else len(self.gpus)


# The meaning of this core's fold, for its snapshots (services/runtime/state_codec.py): bump it when a
# change makes a state folded by the previous release wrong for this one (a field's meaning, what an
# event does); the first start after it folds the log from the start. Comments, logs, speed: no bump.
STATE_VERSION = 2  # 2: a quota keeps every setting a patch may change (np-lend limit, critical, budget)


@dataclass
class QuotaState:
    half_life_s: float = DEFAULT_HALF_LIFE_S
    pools: dict[str, PoolDef] = field(default_factory=dict)
    quotas: dict[tuple[str, str], Quota] = field(default_factory=dict)  # (pool, team)
    nodes: dict[tuple[str, str], NodeCap] = field(default_factory=dict)
    specs: dict[str, JobSpec] = field(default_factory=dict)  # jobs not finished
    # job -> pool, team, GPU-equivalents (a fraction or a MIG instance counts its share of a GPU)
    running: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    decayed: dict[tuple[str, str], float] = field(default_factory=dict)  # decayed GPU-seconds at `clock`
    clock: float | None = None
    published: dict[tuple[str, str], float] = field(default_factory=dict)
    budgets: dict[str, BudgetSet] = field(default_factory=dict)  # team -> its latest budget
    # A cache of `running` (not in snapshots; `rebuild_use` derives it again): (pool, team) -> the
    # GPU-equivalents its jobs hold, in thousandths so that adding and removing jobs is exact. The
    # decay reads it on every job event and every publish; summing `running` each time made a
    # whole-trace replay 2.6 times slower.
    use_milli: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def team_pools(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for pool, team in sorted(self.quotas):
            out.setdefault(team, []).append(pool)
        return out

    def in_use(self) -> dict[tuple[str, str], float]:
        """(pool, team) -> GPU-equivalents held now, for each with a job running (whole GPUs as ints)."""
        return {k: m // 1000 if m % 1000 == 0 else m / 1000 for k, m in self.use_milli.items()}

    def start(self, job_id: str, pool: str, team: str, gpus: float) -> None:
        self.running[job_id] = (pool, team, gpus)
        self._count(pool, team, gpus, +1)

    def stop(self, job_id: str) -> None:
        pool, team, gpus = self.running.pop(job_id)
        self._count(pool, team, gpus, -1)

    def rebuild_use(self) -> None:
        """Derive the `use_milli` cache from `running` (after a snapshot is loaded)."""
        self.use_milli = {}
        for pool, team, gpus in self.running.values():
            self._count(pool, team, gpus, +1)

    def _count(self, pool: str, team: str, gpus: float, sign: int) -> None:
        key = (pool, team)
        left = self.use_milli.get(key, 0) + sign * round(gpus * 1000)
        if left:
            self.use_milli[key] = left
        else:
            self.use_milli.pop(key, None)  # nothing running: no entry, as `in_use` always gave

    def pool_capacity(self, pool: str) -> int:
        """Healthy GPUs of the pool now (isolations and lost nodes left out)."""
        return sum(n.healthy for n in self.nodes.values() if node_pool(self.pools, n.model, n.labels) == pool)

    def pool_installed(self, pool: str) -> int:
        """GPUs installed in the pool, isolated or not (lost nodes left out)."""
        return sum(n.installed for n in self.nodes.values() if node_pool(self.pools, n.model, n.labels) == pool)

    def pool_guaranteed(self, pool: str) -> int:
        return sum(q.guaranteed for (p, _), q in self.quotas.items() if p == pool)


def decayed_at(state: QuotaState, now: float) -> dict[tuple[str, str], float]:
    """Each (pool, team)'s decayed usage at `now`, without changing the state."""
    if state.clock is None:
        return dict(state.decayed)
    dt = max(0.0, now - state.clock)
    h = state.half_life_s
    keep = 2.0 ** (-dt / h)
    gain = h / math.log(2) * (1.0 - keep)
    out = {k: v * keep for k, v in state.decayed.items()}
    for k, u in state.in_use().items():
        out[k] = out.get(k, 0.0) + u * gain
    return out


def _advance(state: QuotaState, at: float) -> None:
    state.decayed = decayed_at(state, at)
    state.clock = at if state.clock is None else max(state.clock, at)


def evolve(state: QuotaState, event: Event) -> QuotaState:
    match event:
        case PoolDefined():
            state.pools[event.pool] = PoolDef(event.pool, event.gpu_model, dict(event.node_selector))
        case PoolRemoved():  # with its quotas (of 0 GPUs: remove_pool)
            state.pools.pop(event.pool, None)
            for key in [k for k in state.quotas if k[0] == event.pool]:
                del state.quotas[key]
        case TeamQuotaSet():
            state.quotas[(event.pool, event.team)] = Quota(
                event.team,
                event.pool,
                event.guaranteed_gpus,
                event.borrow_limit,
                event.lend_limit,
                event.weight,
                event.critical,
                event.np_lend_limit,
            )
        case FairShareUpdated():
            state.published[(event.pool, event.team)] = event.factor
        case BudgetSet():
            state.budgets[event.team] = event
        case JobSubmitted():
            state.specs.setdefault(event.job_id, event.spec)
        case JobScheduled() | JobResumed():
            spec = state.specs.get(event.job_id)
            if spec is not None and event.job_id not in state.running:
                _advance(state, event.at)
                # The pool the decision carries (v1 events without one are upcast by the codec).
                state.start(event.job_id, event.pool, spec.team, _equivalents(event.placements, spec.total_gpus))
        case JobPreempted() | JobSuspended() | JobRequeued():
            if event.job_id in state.running:
                _advance(state, event.at)
                state.stop(event.job_id)
        case JobCompleted() | JobFailed() | JobCancelled():
            if event.job_id in state.running:
                _advance(state, event.at)
                state.stop(event.job_id)
            state.specs.pop(event.job_id, None)
        case NodeDiscovered():
            state.nodes[(event.cluster, event.node)] = NodeCap(
                _model(event.gpus), dict(event.labels), {g.index for g in event.gpus}
            )
        case NodeUpdated():
            old = state.nodes.get((event.cluster, event.node))
            node = NodeCap(
                _model(event.gpus), dict(event.labels or (old.labels if old else {})), {g.index for g in event.gpus}
            )
            node.in_service = event.status == NodeStatus.HEALTHY and not (old is not None and not old.in_service)
            node.lost = event.status == NodeStatus.LOST
            node.bad = old.bad if old else set()
            state.nodes[(event.cluster, event.node)] = node
        case NodeLost():
            if (n := state.nodes.get((event.cluster, event.node))) is not None:
                n.in_service = False
                n.lost = True
        case NodeForgotten():
            state.nodes.pop((event.cluster, event.node), None)  # lost, so already out of every pool's count
        case NodeIsolated():
            if (n := state.nodes.get((event.cluster, event.node))) is not None:
                n.in_service = False
        case NodeRestored():
            if (n := state.nodes.get((event.cluster, event.node))) is not None:
                n.in_service = True
        case GpuIsolated():
            if (n := state.nodes.get((event.cluster, event.node))) is not None:
                n.bad.add(event.gpu_index)
        case GpuRestored():
            if (n := state.nodes.get((event.cluster, event.node))) is not None:
                n.bad.discard(event.gpu_index)
    return state


def _equivalents(placements: list[Placement], whole: int) -> float:
    """GPU-equivalents a decision holds: the spec's GPUs when it holds whole GPUs (integers, as
    before), else each GPU by the share held of it."""
    if all(p.share_milli == 1000 for p in placements):
        return whole
    total = sum(p.gpu_equivalents for p in placements)
    return int(total) if float(total).is_integer() else round(total, 3)


def _model(gpus: list[Any]) -> str:
    models = sorted(g.model for g in gpus)
    return max(models, key=models.count) if models else ""


def fair_shares(state: QuotaState, now: float) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(pool, team) -> (factor, decayed usage, share) for every team with a quota or usage."""
    usage = decayed_at(state, now)
    keys = set(state.quotas) | {k for k, v in usage.items() if v > 0}
    out: dict[tuple[str, str], tuple[float, float, float]] = {}
    for pool in sorted({p for p, _ in keys}):
        teams = sorted(t for p, t in keys if p == pool)
        quotas = {t: state.quotas.get((pool, t)) for t in teams}
        raw = {t: (q.weight * q.guaranteed if q else 0.0) for t, q in quotas.items()}
        if not any(raw.values()):
            raw = {t: (q.weight if q else 1.0) for t, q in quotas.items()}
        total_raw = sum(raw.values()) or 1.0
        total_use = sum(usage.get((pool, t), 0.0) for t in teams)
        for t in teams:
            share = raw[t] / total_raw
            used = usage.get((pool, t), 0.0)
            norm = used / total_use if total_use > 0 else 0.0
            if norm == 0:
                factor = 1.0
            elif share <= 0:
                factor = 0.0
            else:
                factor = 2.0 ** (-norm / share)
            out[(pool, t)] = (round(factor, 6), used, share)
    return out


def decide(state: QuotaState, now: float) -> list[tuple[FairShareUpdated, str]]:
    """FairShareUpdated for each team whose factor moved enough since it was last published."""
    out = []
    for (pool, team), (factor, used, share) in sorted(fair_shares(state, now).items()):
        last = state.published.get((pool, team))
        if last is None or abs(last - factor) >= PUBLISH_DELTA:
            event = FairShareUpdated(team=team, pool=pool, at=now, factor=factor, decayed_usage_gpu_s=used, share=share)
            out.append((event, stable_id("fair_share", pool, team, f"{now:.3f}")))
    return out


def rows(state: QuotaState, now: float) -> list[dict[str, Any]]:
    """The `chamber quota list --json` rows."""
    shares = fair_shares(state, now)
    use = state.in_use()
    out = []
    for (pool, team), q in sorted(state.quotas.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        in_use = use.get((pool, team), 0)
        budget = state.budgets.get(team)
        out.append(
            {
                "team": team,
                "pool": pool,
                "guaranteed": q.guaranteed,
                "borrow_limit": q.borrow_limit,
                "lend_limit": q.lend_limit,
                "np_lend_limit": q.np_lend_limit,
                "weight": q.weight,
                "critical": q.critical,
                "budget": budget.amount if budget else None,
                "currency": budget.currency if budget else None,
                "on_budget": budget.on_budget.value if budget else None,
                "in_use": in_use,
                "borrowed": max(0, in_use - q.guaranteed),
                "fair_share": shares.get((pool, team), (1.0, 0.0, 0.0))[0],
            }
        )
    return out


def pool_rows(state: QuotaState) -> list[dict[str, Any]]:
    """Per pool with a quota or a definition: installed and healthy GPUs, what is guaranteed, and
    whether the guarantees promise more than is installed (over-committed)."""
    names = sorted({p for p, _ in state.quotas} | set(state.pools))
    out = []
    for pool in names:
        definition = state.pools.get(pool)
        installed, guaranteed = state.pool_installed(pool), state.pool_guaranteed(pool)
        out.append(
            {
                "pool": pool,
                "gpu_model": definition.gpu_model if definition else None,
                "node_selector": dict(definition.node_selector) if definition else {},
                "installed": installed,
                "in_service": state.pool_capacity(pool),
                "guaranteed": guaranteed,
                "over_committed": max(0, guaranteed - installed),
            }
        )
    return out


# -- the settings of a quota, and what a command changes ----------------------------------------------
# The order `chamber quota set` prints them in; names as the command's fields.
SETTINGS = ("gpus", "borrow_limit", "lend_limit", "np_lend_limit", "weight", "critical")
DEFAULTS: dict[str, Any] = {
    "borrow_limit": None,
    "lend_limit": None,
    "np_lend_limit": None,
    "weight": 1.0,
    "critical": False,
}


def settings_of(state: QuotaState, pool: str, team: str) -> dict[str, Any] | None:
    """The team's current quota in the pool as command fields, or None when it has none."""
    q = state.quotas.get((pool, team))
    if q is None:
        return None
    return {
        "gpus": q.guaranteed,
        "borrow_limit": q.borrow_limit,
        "lend_limit": q.lend_limit,
        "np_lend_limit": q.np_lend_limit,
        "weight": q.weight,
        "critical": q.critical,
    }


def patched(current: dict[str, Any] | None, given: dict[str, Any], *, replace: bool) -> dict[str, Any]:
    """The settings after a command: with `replace` the fields given and the defaults for the rest;
    otherwise the current settings with only the fields given changed. A new quota needs `gpus`."""
    base = dict(DEFAULTS) if replace or current is None else dict(current)
    out = {**base, **{k: v for k, v in given.items() if k in SETTINGS}}
    if "gpus" not in out:
        raise QuotaRefused("the team has no quota in this pool yet: how many guaranteed GPUs? pass --gpus N", "gpus")
    return out


def changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[dict[str, Any]]:
    """Each setting before and after, and whether it changed (before is None for a new quota)."""
    return [
        {
            "setting": name,
            "before": None if before is None else before[name],
            "after": after[name],
            "changed": before is None or before[name] != after[name],
        }
        for name in SETTINGS
    ]


def over_commitment(state: QuotaState, pool: str, team: str, gpus: int) -> str | None:
    """A warning when the pool's guarantees, with this one, promise more GPUs than are installed
    (nodes not joined yet, a Kueue import applied first). Isolations do not count: a quota is a
    promise about installed capacity, and an isolated GPU comes back."""
    installed = state.pool_installed(pool)
    others = sum(q.guaranteed for (p, t), q in state.quotas.items() if p == pool and t != team)
    total = others + gpus
    if total <= installed:
        return None
    return (
        f"pool {pool} is over-committed: guarantees total {total} GPUs (other teams {others}), "
        f"{total - installed} more than the {installed} installed; until more join, a team below its "
        f"guarantee may wait for GPUs that other teams hold within theirs"
    )


# -- commands --------------------------------------------------------------------------------------
def set_quota(
    state: QuotaState,
    *,
    team: str,
    pool: str,
    gpus: int,
    borrow_limit: int | None,
    lend_limit: int | None,
    weight: float,
    at: float,
    critical: bool = False,
    np_lend_limit: int | None = None,
) -> TeamQuotaSet:
    """Validate a quota command and return the event that records it; QuotaRefused if invalid."""
    if not team.strip() or team.startswith("_"):
        raise QuotaRefused("team must be a name that does not start with '_'", "team")
    if pool != DEFAULT_POOL and pool not in state.pools:
        known = ", ".join(sorted({DEFAULT_POOL, *state.pools}))
        raise QuotaRefused(f"unknown pool {pool!r} (known: {known}); define it with `chamber quota pool set`", "pool")
    for name, value in (
        ("gpus", gpus),
        ("borrow_limit", borrow_limit),
        ("lend_limit", lend_limit),
        ("np_lend_limit", np_lend_limit),
    ):
        if value is not None and value < 0:
            raise QuotaRefused(f"{name} must be 0 or more, got {value}", name)
    if weight <= 0:
        raise QuotaRefused(f"weight must be above 0, got {weight}", "weight")
    if lend_limit is not None and lend_limit > gpus:
        raise QuotaRefused(
            f"lend_limit {lend_limit} is above the guarantee {gpus}: a team lends only its own", "lend_limit"
        )
    if np_lend_limit is not None and np_lend_limit > gpus:
        raise QuotaRefused(
            f"np_lend_limit {np_lend_limit} is above the guarantee {gpus}: a team lends only its own", "np_lend_limit"
        )
    # Capacity is not checked here: guarantees above what is installed are accepted (the service warns,
    # `over_commitment`), so quotas can be applied before nodes join and isolations never invalidate one.
    return TeamQuotaSet(
        team=team,
        pool=pool,
        at=at,
        guaranteed_gpus=gpus,
        borrow_limit=borrow_limit,
        lend_limit=lend_limit,
        weight=weight,
        critical=critical,
        np_lend_limit=np_lend_limit,
    )


def remove_pool(state: QuotaState, *, name: str, at: float) -> PoolRemoved:
    """Remove a pool, with its quotas of 0 GPUs. Refused, naming them, while a team has a guarantee
    in it, a job runs in it or a node is selected into it: they would move silently."""
    if name == DEFAULT_POOL:
        raise QuotaRefused("the default pool spans every node no other pool selects; it cannot be deleted", "name")
    if name not in state.pools and not any(p == name for p, _ in state.quotas):
        known = sorted(state.pools)
        raise QuotaRefused(f"no pool {name!r}" + (f" (pools: {', '.join(known)})" if known else ""), "name")
    guarantees = sorted((t, q.guaranteed) for (p, t), q in state.quotas.items() if p == name and q.guaranteed)
    if guarantees:
        raise QuotaRefused(
            f"pool {name} still guarantees GPUs to {', '.join(f'{t} ({g})' for t, g in guarantees)}: set them to 0 "
            f"first (`chamber quota set TEAM --pool {name} --gpus 0`)",
            "name",
        )
    jobs = sorted(job for job, (p, _, _) in state.running.items() if p == name)
    if jobs:
        raise QuotaRefused(
            f"pool {name} still runs {len(jobs)} job(s) ({_some(jobs)}); wait for them or cancel them", "name"
        )
    nodes = sorted(
        k[1] for k, n in state.nodes.items() if not n.lost and node_pool(state.pools, n.model, n.labels) == name
    )
    if nodes:
        raise QuotaRefused(
            f"pool {name} still selects {len(nodes)} node(s) ({_some(nodes)}); deleting it would move them to "
            "another pool",
            "name",
        )
    return PoolRemoved(pool=name, at=at)


def _pool_of(state: QuotaState, node: NodeCap) -> str:
    return node_pool(state.pools, node.model, node.labels)


def _some(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def define_pool(
    state: QuotaState, *, name: str, gpu_model: str | None, node_label: str | None, at: float
) -> PoolDefined:
    if not name.strip() or name.startswith("_"):
        raise QuotaRefused("pool name must be a name that does not start with '_'", "name")
    if name == DEFAULT_POOL:
        raise QuotaRefused("the default pool spans every node no other pool selects; it takes no selector", "name")
    if (gpu_model is None) == (node_label is None):
        raise QuotaRefused("give exactly one of --gpu-model M or --node-label K=V", "gpu_model")
    selector: dict[str, str] = {}
    if node_label is not None:
        key, sep, value = node_label.partition("=")
        if not sep or not key.strip():
            raise QuotaRefused(f"--node-label must look like KEY=VALUE, got {node_label!r}", "node_label")
        selector = {key.strip(): value.strip()}
    return PoolDefined(pool=name, at=at, gpu_model=gpu_model, node_selector=selector)
