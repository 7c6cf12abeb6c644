"""Capacity pools (cohorts), team quotas, fair-share factors and budgets."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from msgspec import Meta

from events.base import Event, Name, event_type
from events.names import GpuCount, Team

NonNegative = GpuCount


class PoolDefined(Event, frozen=True, tag=event_type("quota", "pool_defined")):
    """A pool of capacity, selected by GPU model or by a node label (`default` spans the fleet)."""

    pool: Name
    at: float
    gpu_model: str | None = None
    node_selector: dict[str, str] = {}


class PoolRemoved(Event, frozen=True, tag=event_type("quota", "pool_removed")):
    """A pool no team has a quota in and no node is selected into, removed by an operator."""

    pool: Name
    at: float


class TeamQuotaSet(Event, frozen=True, tag=event_type("quota", "team_quota_set")):
    """Guaranteed GPUs in a pool; how much more the team may borrow, and how much it lends."""

    team: Team
    pool: Name
    at: float
    guaranteed_gpus: NonNegative
    borrow_limit: NonNegative | None = None  # None: no limit beyond the pool
    lend_limit: NonNegative | None = None  # None: all idle guaranteed GPUs may be lent
    weight: Annotated[float, Meta(gt=0)] = 1.0
    critical: bool = False  # may the team run `critical` work in this pool (preempting other teams)
    # Idle guaranteed GPUs other teams' non-preemptible work may use, returned by draining (issue 19).
    # None: half of what `lend_limit` lends; 0: non-preemptible work never borrows this guarantee.
    np_lend_limit: NonNegative | None = None


class FairShareUpdated(Event, frozen=True, tag=event_type("quota", "fair_share_updated")):
    """Slurm-style factor in (0, 1]: 1 for a team that used nothing, lower as decayed usage grows."""

    team: Team
    pool: Name
    at: float
    factor: float
    decayed_usage_gpu_s: float
    share: float


class BudgetAction(StrEnum):
    """What the scheduler does with a team's new work once the team is over its budget."""

    DEMOTE = "demote"  # new work runs preemptible at low priority
    HOLD = "hold"  # new work waits until the budget is raised or the month ends
    NOTIFY = "notify"  # only BudgetExceeded and the dashboard flag


class BudgetSet(Event, frozen=True, tag=event_type("quota", "budget_set")):
    team: Team
    at: float
    amount: Annotated[float, Meta(ge=0)]
    currency: str = "USD"
    period: str = "month"
    on_budget: BudgetAction = BudgetAction.NOTIFY
