"""The dashboard's cost answer says where idle money goes: idle cost by provider, region and cluster."""

from __future__ import annotations

from events import CostAccrued, PriceSet
from services.gateway import views
from services.gateway.core import GatewayState, evolve


def idle(cost: float, cluster: str, provider: str | None, region: str | None = None) -> CostAccrued:
    return CostAccrued(
        period_start=0.0, period_end=300.0, gpu_model="H100", gpu_seconds=1200.0, cost=cost, pool="default",
        idle=True, cluster=cluster, provider=provider, region=region,
    )  # fmt: skip


def test_idle_cost_is_split_by_where_the_gpus_were_and_only_model_prices_show_as_rates() -> None:
    state = GatewayState()
    for event in (
        PriceSet(gpu_model="H100", at=0.0, price_per_gpu_hour=3.0),
        PriceSet(gpu_model="", at=0.0, price_per_gpu_hour=12.29, instance_type="p5.48xlarge"),
        idle(4.1, "c1", "aws", "us-east-1"),
        idle(0.5, "c2", "on-prem"),
        idle(1.0, "c1", "aws", "us-east-1"),
        idle(0.2, "c3", None),  # an agent-only node: discovery knows no provider
    ):
        evolve(state, event)
    view = views.cost(state)
    assert [(p.provider, p.region, p.cluster, p.idle_cost) for p in view.idle_by_place] == [
        ("aws", "us-east-1", "c1", 5.1),
        ("on-prem", "", "c2", 0.5),
        ("unknown", "", "c3", 0.2),
    ]
    assert view.idle_cost == 5.8 and [p.gpu_model for p in view.prices] == ["H100"]
