"""Cloud, on-premises and hybrid cost, end to end through the product's own code: discovery's labels
on the nodes, billing's core pricing each GPU by its node's instance type, else its cluster (an
on-premises amortised rate), else its model, the recorder's rows in the real ClickHouse engine (chDB),
and the reports by provider, region and cluster, against numbers computed by hand.

One 300 s period from T0:
  c1/a1  aws us-east-1, p5.48xlarge (98.32 per hour / 8 GPUs = 12.29 per GPU-hour), 8 x H100
         j1 (vision) holds GPUs 0-3 the whole period: 4 x 300 s -> 4.0966...; idle 4 x 300 s -> 4.0966...
  c2/b1  on-premises, cluster c2 at 1.50 per GPU-hour (the model's 2.00 does not apply), 4 x A100, idle
         4 x 300 s -> 0.50
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from events import Event, GpuInfo, NodeDiscovered, PriceSet
from services.billing.core import BillingState, decide, evolve
from services.billing.price_table import read
from services.cli.billing import places_sql
from services.recorder.rows import Recorded, build_tables
from services.runtime.nats_server import free_port
from services.warehouse import migrate
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.efficiency import efficiency_sql, shape, sql_time
from services.warehouse.rollup import insert_samples
from tests.warehouse_builders import T0, a_sample, scheduled, submitted

pytestmark = pytest.mark.integration
H = 3600.0
AWS = {"chamber.io/provider": "aws", "chamber.io/region": "us-east-1", "chamber.io/instance-type": "p5.48xlarge"}
ON_PREM = {"chamber.io/provider": "on-prem"}


def node(cluster: str, name: str, gpus: int, model: str, labels: dict[str, str]) -> NodeDiscovered:
    infos = [GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model=model) for i in range(gpus)]
    return NodeDiscovered(cluster=cluster, node=name, at=T0, gpus=infos, source="kubernetes", labels=labels)


def prices() -> list[PriceSet]:
    """The price table file, read by the same code as `chamber billing price import`."""
    currency, table = read(
        {
            "gpu_models": {"H100": 3.0, "A100": 2.0},
            "instance_types": {"p5.48xlarge": {"per_hour": 98.32, "gpus": 8}},
            "clusters": {"c2": {"per_gpu_hour": 1.5}},
        }
    )
    return [
        PriceSet(
            gpu_model=p.name if p.scope == "gpu_model" else "",
            at=T0,
            price_per_gpu_hour=p.per_gpu_hour,
            currency=currency,
            instance_type=p.name if p.scope == "instance_type" else None,
            cluster=p.name if p.scope == "cluster" else None,
        )
        for p in table
    ]


def fleet() -> list[Event]:
    return [
        *prices(),
        node("c1", "a1", 8, "H100", AWS),
        node("c2", "b1", 4, "A100", ON_PREM),
        submitted("j1", "vision", 4, T0),
        scheduled("j1", "vision", "a1", [0, 1, 2, 3], T0),
    ]


def test_the_amortised_on_premises_rate() -> None:
    _, [price] = read({"clusters": {"dc": {"capex": 3_200_000, "years": 4, "opex_per_year": 400_000, "gpus": 512}}})
    assert price.per_gpu_hour == pytest.approx((800_000 + 400_000) / (512 * 8766))


def test_costs_priced_by_instance_type_cluster_and_model_report_by_provider_region_and_cluster(tmp_path: Path) -> None:
    state = BillingState(period_s=300.0, settle_s=0.0)
    events = fleet()
    for i, e in enumerate(events):
        evolve(state, e, f"in{i}")
    costs = [e for e, _ in decide(state, T0 + 300)]
    by_key = {(c.cluster, c.job_id or c.pool, c.idle): c for c in costs}
    assert by_key[("c1", "j1", False)].cost == pytest.approx(4 * 300 / H * 12.29, abs=1e-6)
    assert by_key[("c1", "default", True)].cost == pytest.approx(4 * 300 / H * 12.29, abs=1e-6)
    assert by_key[("c2", "default", True)].cost == pytest.approx(4 * 300 / H * 1.5, abs=1e-6)
    assert (by_key[("c1", "j1", False)].provider, by_key[("c1", "j1", False)].region) == ("aws", "us-east-1")
    assert by_key[("c2", "default", True)].provider == "on-prem"

    warehouse = ChdbWarehouse(tmp_path)
    migrate(warehouse)
    samples: list[Event] = []
    for k in range(30):
        samples.append(a_sample("a1", T0 + 10 * k, [90, 90, 90, 90, 0, 0, 0, 0], seq=k))
        samples.append(a_sample("b1", T0 + 10 * k, [0, 0, 0, 0], seq=k, cluster="c2"))
    recorded = [
        Recorded(e, f"e{i}", "test", "", "TEST", "test", i + 1) for i, e in enumerate([*events, *samples, *costs])
    ]
    for name, table in build_tables(recorded).items():  # as the recorder stores them
        insert_samples(warehouse, table) if name == "gpu_samples" else warehouse.insert(name, table)

    def places(by: str) -> dict[str, dict[str, float]]:
        rows = warehouse.query(places_sql(T0, T0 + 300, by)).as_dicts()
        return {r["name"]: {"cost": r["spent"], "idle_cost": r["idle_cost"], "gpu_hours": r["gpu_hours"]} for r in rows}

    aws_cost = 2 * 4 * 300 / H * 12.29
    assert places("provider") == {
        "aws": {"cost": pytest.approx(aws_cost, abs=1e-5), "idle_cost": pytest.approx(aws_cost / 2, abs=1e-5),
                "gpu_hours": pytest.approx(8 * 300 / H)},
        "on-prem": {"cost": pytest.approx(0.5, abs=1e-5), "idle_cost": pytest.approx(0.5, abs=1e-5),
                    "gpu_hours": pytest.approx(4 * 300 / H)},
    }  # fmt: skip
    assert set(places("region")) == {"us-east-1", "unknown"}
    assert set(places("cluster")) == {"c1", "c2"}

    for by, keys in (("provider", ["aws", "on-prem"]), ("cluster", ["c1", "c2"])):
        report = shape(warehouse.query(efficiency_sql(T0, T0 + 300, by)).as_dicts(), T0, T0 + 300, by)
        groups = {g[by]: g for g in report["groups"]}
        assert sorted(groups) == keys
        first, second = (groups[k] for k in keys)
        assert first["capacity_gpu_hours"] == pytest.approx(8 * 300 / H)
        assert first["allocated_gpu_hours"] == pytest.approx(4 * 300 / H)
        assert second["capacity_gpu_hours"] == pytest.approx(4 * 300 / H) and second["allocated_gpu_hours"] == 0


def test_the_billing_report_cli_splits_cost_by_provider(tmp_path: Path) -> None:
    state = BillingState(period_s=300.0, settle_s=0.0)
    events = fleet()
    for i, e in enumerate(events):
        evolve(state, e, f"in{i}")
    costs = [e for e, _ in decide(state, T0 + 300)]
    warehouse = ChdbWarehouse(tmp_path)
    migrate(warehouse)
    recorded = [Recorded(e, f"e{i}", "test", "", "TEST", "test", i + 1) for i, e in enumerate([*events, *costs])]
    for name, table in build_tables(recorded).items():  # as the recorder stores them
        insert_samples(warehouse, table) if name == "gpu_samples" else warehouse.insert(name, table)
    warehouse.close()  # the CLI opens the directory itself
    chamber = str(Path(sys.executable).parent / "chamber")
    window = ["--since", sql_time(T0).replace(" ", "T"), "--until", sql_time(T0 + 600).replace(" ", "T")]
    common = ["--data-dir", str(tmp_path), "--nats", f"nats://127.0.0.1:{free_port()}"]
    out = subprocess.run(
        [chamber, "billing", "report", "--by", "provider", "--json", *window, *common],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [g["provider"] for g in report["groups"]] == ["aws", "on-prem"]
    assert report["total_cost"] == pytest.approx(2 * 4 * 300 / H * 12.29 + 0.5, abs=1e-5)
