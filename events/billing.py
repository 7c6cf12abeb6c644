"""GPU-hour prices, accrued cost per team and job, and budgets exceeded."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from events.base import Event, Name, event_type
from events.names import Team


class PriceSet(Event, frozen=True, tag=event_type("billing", "price_set")):
    """The price of a GPU-hour on nodes of one instance type, in one cluster (an on-premises amortised
    rate) or of one GPU model; billing uses the first that applies to a GPU, in that order. An
    instance-type or cluster price leaves `gpu_model` empty."""

    gpu_model: str
    at: float
    price_per_gpu_hour: Annotated[float, Meta(ge=0)]
    currency: str = "USD"
    instance_type: str | None = None  # node.kubernetes.io/instance-type, e.g. p5.48xlarge
    cluster: Name | None = None  # every GPU of this cluster


class CostAccrued(Event, frozen=True, tag=event_type("billing", "cost_accrued")):
    """Cost of GPU-seconds in [period_start, period_end). Idle cost has no team, only a pool.
    A job holding part of a GPU (a fraction or a MIG instance) counts its share of the GPU's seconds."""

    period_start: float
    period_end: float
    gpu_model: str
    gpu_seconds: float
    cost: float
    currency: str = "USD"
    team: Team | None = None
    job_id: Name | None = None
    pool: Name | None = None
    idle: bool = False
    cluster: Name | None = None  # where the GPUs were (cost reports by cluster, provider, region)
    provider: str | None = None  # chamber.io/provider of the nodes: aws, gcp, azure, on-prem...
    region: str | None = None  # chamber.io/region of the nodes
    # The serving workload the job is a replica of, `<namespace>/<kind>/<name>` in `cluster`: billing sums
    # its cost per workload (services/billing/serving.py)
    serving: Annotated[str, Meta(max_length=600)] | None = None


class BudgetExceeded(Event, frozen=True, tag=event_type("billing", "budget_exceeded")):
    team: Team
    at: float
    budget: float
    spent: float
    currency: str = "USD"
    period: str = "month"


class ServingTokensReported(Event, frozen=True, tag=event_type("billing", "serving_tokens")):
    """Tokens a serving workload served since its last report (a count, not a running total), as its
    owner reports them (`chamber billing tokens`): billing divides the workload's cost by them."""

    team: Team
    cluster: Name
    namespace: Name
    workload: Name  # <kind>/<name>: deployment/llm, statefulset/kv, leaderworkerset/big
    tokens: Annotated[int, Meta(ge=0, le=10**15)]
    at: float
