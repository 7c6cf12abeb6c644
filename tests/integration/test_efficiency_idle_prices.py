"""`chamber report efficiency` prices idle cost with billing's price table: the node's instance type,
else its cluster, else its GPU model; by cluster, provider, region, instance type and team.

The fleet of test_cost_places (prices read by `chamber billing price import`'s code) plus one node
priced by its model only. One 300 s window from T0, every GPU reporting every 10 s:
  c1/a1  aws, p5.48xlarge at 12.29 per GPU-hour (its model, H100, is 3.00): 8 GPUs, j1 (vision) holds
         0-3 at 90 %: capacity 2400 s, busy 1080 s -> idle 1320 s x 12.29 / 3600 = 4.5063
         (priced by model it would be 1.10)
  c2/b1  on-premises, cluster c2 at 1.50 (its model, A100, is 2.00): 4 idle GPUs, 1200 s -> 0.50 (not 0.67)
  c3/m1  no instance type, no cluster price: 2 idle H100 at the model's 3.00, 600 s -> 0.50
  team vision: held 1200 s, busy 1080 s -> 120 s x 12.29 / 3600 = 0.4097 of idle money it held
An agent inventory of a1 recorded after discovery's (without discovery's labels) does not make the
node's provider unknown: the latest non-empty label counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from events import Event, GpuInfo, NodeDiscovered
from services.recorder.rows import Recorded, build_tables
from services.runtime.nats_server import free_port
from services.warehouse import migrate
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.efficiency import efficiency_sql, shape, sql_time
from services.warehouse.rollup import insert_samples
from tests.integration.test_cost_places import fleet
from tests.warehouse_builders import T0, a_sample, an_inventory

pytestmark = pytest.mark.integration
H = 3600.0
A1_IDLE = 1320 / H * 12.29


def events() -> list[Event]:
    m1 = NodeDiscovered(
        cluster="c3", node="m1", at=T0, source="agent", labels={},
        gpus=[GpuInfo(index=i, uuid=f"GPU-m1-{i}", model="H100") for i in range(2)],
    )  # fmt: skip
    out: list[Event] = [*fleet(), m1, an_inventory("a1", gpus=8, model="H100", at=T0 + 100)]
    for k in range(30):
        out.append(a_sample("a1", T0 + 10 * k, [90, 90, 90, 90, 0, 0, 0, 0], seq=k))
        out.append(a_sample("b1", T0 + 10 * k, [0, 0, 0, 0], seq=k, cluster="c2"))
        out.append(a_sample("m1", T0 + 10 * k, [50, 50], seq=k, cluster="c3"))
    return out


@pytest.fixture
def warehouse(tmp_path: Path) -> ChdbWarehouse:
    w = ChdbWarehouse(tmp_path)
    migrate(w)
    items = [Recorded(e, f"e{i}", "test", "", "TEST", "test", i + 1) for i, e in enumerate(events())]
    for name, table in build_tables(items).items():
        insert_samples(w, table) if name == "gpu_samples" else w.insert(name, table)
    return w


def idle_by(w: ChdbWarehouse, by: str | None) -> dict[str, float]:
    report = shape(w.query(efficiency_sql(T0, T0 + 300, by)).as_dicts(), T0, T0 + 300, by)
    if by is None:
        return {"fleet": report["idle_cost"]}
    return {g[by]: g["idle_cost"] for g in report["groups"]}


def test_each_gpu_is_priced_by_its_instance_type_then_its_cluster_then_its_model(warehouse: ChdbWarehouse) -> None:
    rows = warehouse.query(
        "SELECT node, any(price_scope), any(price_per_gpu_hour) FROM gpu_prices GROUP BY node ORDER BY node"
    ).rows
    assert [tuple(r) for r in rows] == [
        ("a1", "instance_type", pytest.approx(12.29)),
        ("b1", "cluster", pytest.approx(1.5)),
        ("m1", "gpu_model", pytest.approx(3.0)),
    ]


def test_idle_cost_by_cluster_provider_and_instance_type_uses_the_instance_price_not_the_models(
    warehouse: ChdbWarehouse,
) -> None:
    by_cluster = idle_by(warehouse, "cluster")
    assert by_cluster == {"c1": pytest.approx(A1_IDLE), "c2": pytest.approx(0.5), "c3": pytest.approx(0.5)}
    assert by_cluster["c1"] != pytest.approx(1320 / H * 3.0)  # what pricing by the H100 model alone gave
    assert idle_by(warehouse, "provider") == {
        "aws": pytest.approx(A1_IDLE),
        "on-prem": pytest.approx(0.5),
        "unknown": pytest.approx(0.5),  # m1: discovery knows no provider for it
    }
    assert idle_by(warehouse, "region") == {"us-east-1": pytest.approx(A1_IDLE), "unknown": pytest.approx(1.0)}
    assert idle_by(warehouse, "instance_type") == {"p5.48xlarge": pytest.approx(A1_IDLE), "unknown": pytest.approx(1.0)}
    assert idle_by(warehouse, None) == {"fleet": pytest.approx(A1_IDLE + 1.0)}
    assert idle_by(warehouse, "model") == {"A100": pytest.approx(0.5), "H100": pytest.approx(A1_IDLE + 0.5)}


def test_a_team_is_charged_the_idle_money_of_the_gpus_it_held(warehouse: ChdbWarehouse) -> None:
    assert idle_by(warehouse, "team") == {"vision": pytest.approx(120 / H * 12.29)}


def test_the_cli_reports_idle_cost_by_provider(warehouse: ChdbWarehouse, tmp_path: Path) -> None:
    warehouse.close()  # the CLI opens the directory itself
    chamber = str(Path(sys.executable).parent / "chamber")
    window = ["--since", sql_time(T0).replace(" ", "T"), "--until", sql_time(T0 + 300).replace(" ", "T")]
    common = ["--data-dir", str(tmp_path), "--nats", f"nats://127.0.0.1:{free_port()}"]
    out = subprocess.run(
        [chamber, "report", "efficiency", "--by", "provider", "--json", *window, *common],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    groups = {g["provider"]: g["idle_cost"] for g in json.loads(out.stdout)["groups"]}
    assert groups == {"aws": pytest.approx(A1_IDLE), "on-prem": pytest.approx(0.5), "unknown": pytest.approx(0.5)}
