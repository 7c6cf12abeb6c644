"""One contract, two backends: the same DDL, inserts and queries on chDB and on a ClickHouse server.

The chDB case always runs; the server case runs when CHAMBER_CLICKHOUSE_URL points at a server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from services.warehouse import Warehouse, WarehouseError, migrate
from services.warehouse.migrations import load
from services.warehouse.rollup import insert_samples

pytestmark = pytest.mark.integration

TS = pa.timestamp("ms", tz="UTC")


class WarehouseContract:
    """Subclasses provide a `warehouse` fixture: an empty, migrated-on-demand warehouse."""

    def test_migrations_apply_once_and_are_idempotent(self, warehouse: Warehouse) -> None:
        applied = migrate(warehouse)
        assert applied == [f"{m.version:04d}_{m.name}" for m in load()]
        assert migrate(warehouse) == []
        tables = {r[0] for r in warehouse.query("SHOW TABLES").rows}
        assert {"gpu_samples", "gpu_minute", "events", "job_events", "cost_ledger", "gpu_minutes"} <= tables

    def test_an_arrow_insert_and_its_recomputation_feed_the_minute_rollup(self, warehouse: Warehouse) -> None:
        migrate(warehouse)
        now_ms = int(time.time()) // 60 * 60 * 1000  # a minute boundary, recent enough for the TTL
        rows = pa.table(
            {
                "cluster": ["c1"] * 3,
                "node": ["n1"] * 3,
                "gpu_index": pa.array([0, 0, 1], pa.uint16()),
                "gpu_uuid": ["a", "a", "b"],
                "ts": pa.array([now_ms, now_ms + 10_000, now_ms], TS),
                "interval_s": pa.array([10, 10, 10], pa.float32()),
                "seq": pa.array([1, 2, 1], pa.uint64()),
                "utilization_pct": pa.array([100, 50, None], pa.float32()),
                "throttle_reasons": pa.array([[], ["hw_slowdown"], []], pa.list_(pa.string())),
                "event_id": ["e1", "e2", "e1"],
            }
        )
        insert_samples(warehouse, rows)
        assert warehouse.count("gpu_samples") == 3
        query = (
            "SELECT gpu_index, sum(samples) AS n, sum(util_seconds) AS busy, avgMerge(util_avg) AS avg "
            "FROM gpu_minute GROUP BY gpu_index ORDER BY gpu_index"
        )
        result = warehouse.query(query)
        assert result.columns == ["gpu_index", "n", "busy", "avg"]
        assert result.rows == [[0, 2, 15, 75], [1, 1, 0, None]]
        # The same samples again in another insert (no shared token): the minute still counts them once.
        insert_samples(warehouse, rows.slice(1, 2))
        assert warehouse.query(query).rows == [[0, 2, 15, 75], [1, 1, 0, None]]

    def test_replacing_tables_collapse_a_repeated_event_under_final(self, warehouse: Warehouse) -> None:
        migrate(warehouse)
        row = pa.table({"event_id": ["x"], "gpu_model": ["H100"], "at": pa.array([0], TS), "price_per_gpu_hour": [2.5]})
        warehouse.insert("prices", row)
        warehouse.insert("prices", row)
        assert warehouse.count("prices FINAL") == 1
        assert warehouse.query("SELECT * FROM current_prices").rows == [["H100", 2.5]]

    def test_a_read_only_query_cannot_write(self, warehouse: Warehouse) -> None:
        migrate(warehouse)
        assert warehouse.query("SELECT 1 AS one", readonly=True).rows == [[1]]
        with pytest.raises(WarehouseError, match=r"(?i)readonly"):
            warehouse.query("INSERT INTO budgets (team) SELECT 'x'", readonly=True)
        assert warehouse.count("budgets") == 0

    def test_a_bad_query_is_a_warehouse_error_naming_the_problem(self, warehouse: Warehouse) -> None:
        with pytest.raises(WarehouseError, match="no_such_table"):
            warehouse.query("SELECT * FROM no_such_table")


class TestChdbWarehouse(WarehouseContract):
    @pytest.fixture
    def warehouse(self, tmp_path: Path) -> Iterator[Warehouse]:
        from services.warehouse.chdb_backend import ChdbWarehouse

        w = ChdbWarehouse(tmp_path)
        try:
            yield w
        finally:
            w.close()

    def test_data_persists_across_sessions_and_a_second_opener_is_told_who_holds_it(self, tmp_path: Path) -> None:
        from services.warehouse.chdb_backend import ChdbWarehouse

        with ChdbWarehouse(tmp_path) as w:
            migrate(w)
            w.command("INSERT INTO budgets (team, amount) VALUES ('vision', 10)")
        with ChdbWarehouse(tmp_path) as w:
            assert migrate(w) == []
            assert w.query("SELECT team, amount FROM budgets").rows == [["vision", 10]]
            other = subprocess.run(
                [sys.executable, "-c", OPEN_FROM_ANOTHER_PROCESS, str(tmp_path)], capture_output=True, text=True
            )
            assert "held by another process" in other.stdout, other.stderr


OPEN_FROM_ANOTHER_PROCESS = """
import sys
from services.warehouse import WarehouseUnavailable
from services.warehouse.chdb_backend import ChdbWarehouse
try:
    ChdbWarehouse(sys.argv[1])
except WarehouseUnavailable as exc:
    print(exc)
"""


@pytest.mark.skipif(
    not os.environ.get("CHAMBER_CLICKHOUSE_URL"),
    reason="set CHAMBER_CLICKHOUSE_URL=http://user:pass@host:8123 to run the contract on a ClickHouse server",
)
class TestServerWarehouse(WarehouseContract):
    @pytest.fixture
    def warehouse(self) -> Iterator[Warehouse]:
        from services.warehouse.server_backend import ServerWarehouse

        database = f"chamber_test_{uuid.uuid4().hex[:8]}"
        w = ServerWarehouse(os.environ["CHAMBER_CLICKHOUSE_URL"], database=database)
        try:
            yield w
        finally:
            w.command(f"DROP DATABASE IF EXISTS {database}")
            w.close()
