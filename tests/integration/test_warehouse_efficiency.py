"""Fleet efficiency on a scripted ten minutes, against numbers computed by hand.

Window [T0, T0 + 600 s). Every GPU reports every 10 s (6 samples = 60 s per GPU-minute).
  n1 (label pool=train): 4 x H100 at 80, 80, 25, 0 % utilization   -> pool "train"
  n2 (no label):         2 x A100 at 50, 100 %                      -> pool "default"
  n2 GPU 1 is isolated from +300 to +420 (minutes 5 and 6).
  j1 vision: 2 GPUs (n1 0,1) from +0 to +300.                         held 600 s, busy 480 s
  j2 nlp:    submitted +60, n2 GPU 0 from +120, preempted +240, resumed on n1 GPU 2 at +360, still running:
                                                                     held 120 + 240 s, busy 60 + 60 s
  j3 vision: waits for 4 x H100 the whole window (never fits: at most 4 free only in minute 5).
  j4 nlp:    waits for 1 x A100 from +480.
capacity  = 4 x 600 + 600 + 480 = 3480 s;  allocated = 960 s;  busy = 600 s
stranded  = minute 1 (j2 waits): 2 H100 + 2 A100 free = 240 s;  minute 4 (j2): 2 + 2 = 240 s;
            minute 5: 4 H100 (j3 fits) + 1 A100 (j2) = 300 s;  minutes 8, 9 (j4): 2 A100 each = 240 s
          = 1020 s
idle cost = H100 (2400 - 540) s x $3.60/h + A100 (1080 - 60) s x $1.80/h = 1.86 + 0.51 = 2.37
idle GPUs now (minute 9): n1 GPUs 0, 1, 3 and both n2 GPUs = 5
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from events import Event, GpuIsolated, GpuRestored, PoolDefined, PriceSet
from services.recorder.rows import Recorded, build_tables
from services.runtime.nats_server import free_port
from services.warehouse import Warehouse, migrate
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.efficiency import efficiency_sql, shape, sql_time
from services.warehouse.rollup import insert_samples
from tests.warehouse_builders import (
    T0,
    a_sample,
    an_inventory,
    completed,
    preempted,
    resumed,
    scheduled,
    submitted,
)

pytestmark = pytest.mark.integration
H = 3600.0


def timeline() -> list[Event]:
    inv1 = an_inventory("n1", gpus=4, model="H100-80GB")
    inv1 = type(inv1)(**{**{f: getattr(inv1, f) for f in inv1.__struct_fields__}, "labels": {"pool": "train"}})
    events: list[Event] = [
        inv1,
        an_inventory("n2", gpus=2, model="A100-40GB"),
        PoolDefined(pool="train", at=T0, node_selector={"pool": "train"}),
        PriceSet(gpu_model="H100-80GB", at=T0, price_per_gpu_hour=3.6),
        PriceSet(gpu_model="A100-40GB", at=T0, price_per_gpu_hour=1.8),
        submitted("j1", "vision", 2, T0),
        scheduled("j1", "vision", "n1", [0, 1], T0),
        submitted("j3", "vision", 4, T0, model="H100-80GB"),
        submitted("j2", "nlp", 1, T0 + 60),
        scheduled("j2", "nlp", "n2", [0], T0 + 120),
        preempted("j2", "nlp", T0 + 240),
        completed("j1", T0 + 300),
        GpuIsolated(cluster="c1", node="n2", gpu_index=1, at=T0 + 300, reason="xid 79"),
        resumed("j2", "n1", [2], T0 + 360),
        GpuRestored(cluster="c1", node="n2", gpu_index=1, at=T0 + 420, reason="probation"),
        submitted("j4", "nlp", 1, T0 + 480, model="A100-40GB"),
    ]
    for k in range(60):
        events.append(a_sample("n1", T0 + 10 * k, [80, 80, 25, 0], seq=k))
        events.append(a_sample("n2", T0 + 10 * k, [50, 100], seq=k))
    return events


def record(warehouse: Warehouse, events: list[Event]) -> None:
    items = [Recorded(e, f"e{i}", "test", "", "TEST", "test", i + 1) for i, e in enumerate(events)]
    for name, table in build_tables(items).items():  # as the recorder stores them
        insert_samples(warehouse, table) if name == "gpu_samples" else warehouse.insert(name, table)


@pytest.fixture
def warehouse(tmp_path: Path) -> ChdbWarehouse:
    w = ChdbWarehouse(tmp_path)
    migrate(w)
    record(w, timeline())
    return w


@pytest.fixture(params=["chdb", "clickhouse"])
def any_warehouse(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Warehouse]:
    """The same scenario on both backends; the server only when CHAMBER_CLICKHOUSE_URL is set."""
    if request.param == "chdb":
        w: Warehouse = ChdbWarehouse(tmp_path)
    else:
        url = os.environ.get("CHAMBER_CLICKHOUSE_URL")
        if not url:
            pytest.skip("set CHAMBER_CLICKHOUSE_URL to run the efficiency scenario on a ClickHouse server")
        from services.warehouse.server_backend import ServerWarehouse

        w = ServerWarehouse(url, database=f"chamber_test_{uuid.uuid4().hex[:8]}")
    migrate(w)
    record(w, timeline())
    try:
        yield w
    finally:
        if request.param == "clickhouse":
            w.command(f"DROP DATABASE IF EXISTS {w.database}")  # type: ignore[attr-defined]
        w.close()


def report(w: Warehouse, by: str | None = None) -> dict[str, object]:
    result = w.query(efficiency_sql(T0, T0 + 600, by))
    return shape(result.as_dicts(), T0, T0 + 600, by)


def test_fleet_efficiency_equals_the_hand_computed_numbers(any_warehouse: Warehouse) -> None:
    fleet = report(any_warehouse)
    assert fleet["capacity_gpu_hours"] == pytest.approx(3480 / H)
    assert fleet["allocated_gpu_hours"] == pytest.approx(960 / H)
    assert fleet["busy_gpu_hours"] == pytest.approx(600 / H)
    assert fleet["allocation_ratio"] == pytest.approx(960 / 3480, abs=1e-6)
    assert fleet["usage_ratio"] == pytest.approx(600 / 960, abs=1e-6)
    assert fleet["efficiency_score"] == pytest.approx(600 / 3480, abs=1e-6)
    assert fleet["stranded_gpu_hours"] == pytest.approx(1020 / H)
    assert fleet["idle_cost"] == pytest.approx(2.37)
    assert fleet["idle_gpus_now"] == 5


def test_efficiency_by_model_pool_team_and_node(any_warehouse: Warehouse) -> None:
    warehouse = any_warehouse
    by_model = {g["model"]: g for g in report(warehouse, "model")["groups"]}  # type: ignore[union-attr]
    h100, a100 = by_model["H100-80GB"], by_model["A100-40GB"]
    assert (h100["capacity_gpu_hours"], h100["allocated_gpu_hours"], h100["busy_gpu_hours"]) == pytest.approx(
        (2400 / H, 840 / H, 540 / H), abs=1e-6
    )
    assert (a100["capacity_gpu_hours"], a100["allocated_gpu_hours"], a100["busy_gpu_hours"]) == pytest.approx(
        (1080 / H, 120 / H, 60 / H), abs=1e-6
    )
    assert (h100["stranded_gpu_hours"], a100["stranded_gpu_hours"]) == pytest.approx((480 / H, 540 / H), abs=1e-6)
    assert (h100["idle_cost"], a100["idle_cost"]) == pytest.approx((1.86, 0.51))
    assert (h100["idle_gpus_now"], a100["idle_gpus_now"]) == (3, 2)

    by_pool = {g["pool"]: g["capacity_gpu_hours"] for g in report(warehouse, "pool")["groups"]}  # type: ignore[union-attr]
    assert by_pool == pytest.approx({"train": 2400 / H, "default": 1080 / H})

    by_team = {g["team"]: g for g in report(warehouse, "team")["groups"]}  # type: ignore[union-attr]
    assert by_team["vision"]["allocated_gpu_hours"] == pytest.approx(600 / H)
    assert by_team["vision"]["usage_ratio"] == pytest.approx(0.8)
    assert by_team["nlp"]["allocated_gpu_hours"] == pytest.approx(360 / H)
    assert by_team["nlp"]["usage_ratio"] == pytest.approx(120 / 360, abs=1e-6)
    assert by_team["nlp"]["capacity_gpu_hours"] == 0  # capacity belongs to pools, not teams

    by_node = {g["node"]: g["busy_gpu_hours"] for g in report(warehouse, "node")["groups"]}  # type: ignore[union-attr]
    assert by_node == pytest.approx({"n1": 540 / H, "n2": 60 / H})


def test_the_cli_reports_efficiency_and_answers_sql_from_the_data_dir(warehouse: ChdbWarehouse, tmp_path: Path) -> None:
    warehouse.close()  # nothing holds the directory now: the CLI opens it itself
    chamber = str(Path(sys.executable).parent / "chamber")
    common = ["--data-dir", str(tmp_path), "--nats", f"nats://127.0.0.1:{free_port()}"]
    window = ["--since", sql_time(T0).replace(" ", "T"), "--until", sql_time(T0 + 600).replace(" ", "T")]
    out = subprocess.run(
        [chamber, "report", "efficiency", *window, "--json", *common], capture_output=True, text=True, check=True
    )
    fleet = json.loads(out.stdout)
    assert fleet["capacity_gpu_hours"] == pytest.approx(3480 / H)
    assert fleet["stranded_gpu_hours"] == pytest.approx(1020 / H)
    assert fleet["idle_cost"] == pytest.approx(2.37)

    out = subprocess.run(
        [chamber, "sql", "SELECT job_id, team FROM job_intervals ORDER BY started_at", "--format", "json", *common],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == {
        "columns": ["job_id", "team"],
        "rows": [["j1", "vision"], ["j2", "nlp"], ["j2", "nlp"]],
    }

    refused = subprocess.run([chamber, "sql", "TRUNCATE TABLE events", *common], capture_output=True, text=True)
    assert refused.returncode == 2 and "read-only" in refused.stderr and "Traceback" not in refused.stderr


def test_an_isolated_node_has_no_capacity_while_isolated(tmp_path: Path) -> None:
    """n9: 2 GPUs for 5 minutes, the whole node isolated from +60 to +180: capacity 2 x (300 - 120) s."""
    from events import NodeIsolated, NodeRestored

    w = ChdbWarehouse(tmp_path / "isolated")
    migrate(w)
    events: list[Event] = [an_inventory("n9", gpus=2, model="L4")]
    events += [a_sample("n9", T0 + 10 * k, [50, 50], seq=k) for k in range(30)]
    events += [
        NodeIsolated(cluster="c1", node="n9", at=T0 + 60, reason="heartbeat lost"),
        NodeRestored(cluster="c1", node="n9", at=T0 + 180, reason="probation"),
    ]
    record(w, events)
    fleet = shape(w.query(efficiency_sql(T0, T0 + 300)).as_dicts(), T0, T0 + 300, None)
    assert fleet["capacity_gpu_hours"] == pytest.approx(2 * 180 / H)
    assert fleet["idle_gpus_now"] == 2
    w.close()
