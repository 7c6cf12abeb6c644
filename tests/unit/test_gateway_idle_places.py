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


def test_the_live_cost_rate_prices_by_instance_type_then_cluster_then_model_as_billing_does() -> None:
    """n1 is a p5.48xlarge (12.29 per GPU-hour; its H100s' model price is 3.00), n2 prices by model.
    An agent inventory with the agent's own labels arrives after discovery's: n1 stays a p5.48xlarge."""
    from events import NodeInventory
    from tests.gateway_builders import CLUSTER, T0, a_node_discovered, a_scheduled, a_submitted, gpu_infos

    n1 = a_node_discovered("n1", model="H100")
    n1 = type(n1)(**{**{f: getattr(n1, f) for f in n1.__struct_fields__}, "labels": {INSTANCE: "p5.48xlarge"}})
    state = GatewayState()
    for event in (
        PriceSet(gpu_model="H100", at=0.0, price_per_gpu_hour=3.0),
        PriceSet(gpu_model="", at=0.0, price_per_gpu_hour=12.29, instance_type="p5.48xlarge"),
        n1,
        a_node_discovered("n2", model="H100"),
        NodeInventory(cluster=CLUSTER, node="n1", observed_at=T0 + 1, gpus=gpu_infos("n1", 8, "H100"),
                      labels={"leaf": "leaf-3"}),
        a_submitted("a", team="vision"),
        a_scheduled("a", "n1", [0, 1], team="vision"),
        a_submitted("b", team="nlp"),
        a_scheduled("b", "n2", [0, 1], team="nlp"),
    ):  # fmt: skip
        evolve(state, event)
    assert state.nodes[(CLUSTER, "n1")].labels == {"leaf": "leaf-3", INSTANCE: "p5.48xlarge"}
    rates = {t.team: t.rate_per_hour for t in views.cost(state).by_team}
    assert rates == {"vision": 2 * 12.29, "nlp": 2 * 3.0}
    # an on-premises rate for the cluster comes before the model's, not before the instance type's
    evolve(state, PriceSet(gpu_model="", at=1.0, price_per_gpu_hour=1.0, cluster=CLUSTER))
    assert {t.team: t.rate_per_hour for t in views.cost(state).by_team}["vision"] == 2 * 12.29
    assert {t.team: t.rate_per_hour for t in views.cost(state).by_team}["nlp"] == 2 * 1.0


INSTANCE = "chamber.io/instance-type"
