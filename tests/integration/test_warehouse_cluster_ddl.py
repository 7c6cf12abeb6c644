"""`--clickhouse-cluster NAME`: the migrations become replicated local tables and distributed tables
under the names the queries use, all ON CLUSTER; ClickHouse's own parser (chDB) accepts every
statement. Without a cluster the DDL is unchanged. (No ClickHouse cluster with Keeper runs here: the
statements are checked by the engine's parser, not executed.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import chdb
import pytest

from services.warehouse.backend import WarehouseError
from services.warehouse.cluster import on_cluster
from services.warehouse.migrations import load
from services.warehouse.rollup import round_sql

pytestmark = pytest.mark.integration
STATEMENTS = [s for m in load() for s in m.statements]
CHAMBER = str(Path(sys.executable).parent / "chamber")


def created_tables() -> list[str]:
    return [m.group(1) for s in STATEMENTS if (m := re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", s))]


def test_every_table_gets_a_replicated_local_twin_and_a_distributed_table_under_its_name() -> None:
    ddl = on_cluster(STATEMENTS, "fleet")
    for table in created_tables():
        [local] = [s for s in ddl if s.startswith(f"CREATE TABLE IF NOT EXISTS {table}_local ON CLUSTER fleet")]
        path = f"'/clickhouse/tables/{{shard}}/{{database}}/{table}_local', '{{replica}}'"
        assert re.search(rf"ENGINE = Replicated\w*MergeTree\({re.escape(path)}", local), local
        [dist] = [
            s for s in ddl if s.startswith(f"CREATE TABLE IF NOT EXISTS {table} ON CLUSTER fleet AS {table}_local")
        ]
        assert f"ENGINE = Distributed(fleet, currentDatabase(), {table}_local, cityHash64(" in dist
    # a replacing engine keeps its version column
    assert any("ReplicatedReplacingMergeTree(" in s and "', observed_at)" in s for s in ddl)
    # the rollup runs per shard, from local samples into the local rollup
    [mv] = [s for s in ddl if "MATERIALIZED VIEW" in s]
    assert "ON CLUSTER fleet TO gpu_minute_local" in mv and "FROM gpu_samples_local" in mv
    assert all(re.search(r" ON CLUSTER fleet(\s|$)", s) for s in ddl if not s.startswith("INSERT INTO"))
    # the exact rollup replaces the view-fed one: a backfill through the distributed tables, then the view
    assert "DROP VIEW IF EXISTS gpu_minute_mv ON CLUSTER fleet SYNC" in ddl
    assert ddl.index("DROP TABLE IF EXISTS gpu_minute_local ON CLUSTER fleet SYNC") > max(
        i for i, s in enumerate(ddl) if s.startswith("INSERT INTO gpu_minute_rollup")
    )
    [view] = [s for s in ddl if s.startswith("CREATE VIEW IF NOT EXISTS gpu_minute ON CLUSTER")]
    assert "FROM gpu_minute_rollup FINAL" in view
    assert "ALTER TABLE gpu_samples_local ON CLUSTER fleet MODIFY SETTING" in "\n".join(ddl)


def test_clickhouse_parses_every_cluster_statement() -> None:
    for statement in on_cluster(STATEMENTS, "fleet"):
        chdb.query(f"EXPLAIN AST {statement}", "CSV")  # raises on a syntax error


def test_a_bad_cluster_name_or_an_unknown_statement_is_refused() -> None:
    with pytest.raises(WarehouseError, match="must be an identifier"):
        on_cluster(STATEMENTS, "fleet; DROP TABLE x")
    with pytest.raises(WarehouseError, match="cannot run this statement ON CLUSTER"):
        on_cluster(["DROP TABLE gpu_samples"], "fleet")


def test_a_cluster_without_a_server_is_a_usage_error(tmp_path: Path) -> None:
    argv = [CHAMBER, "service", "recorder", "--data-dir", str(tmp_path), "--clickhouse-cluster", "fleet"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and "needs a ClickHouse server (--clickhouse-url)" in result.stderr, result.stderr


def test_clickhouse_parses_a_rollup_round_on_a_cluster() -> None:
    """On a cluster a round reads only replicas that are up to date (it cannot run here: no Keeper)."""
    sql = round_sql("2026-01-01 00:00:00.000000", "2026-01-01 00:00:05.000000", "2026-01-01 00:00:00", replicated=True)
    assert "max_replica_delay_for_distributed_queries = 1" in sql and "GLOBAL IN" in sql
    chdb.query(f"EXPLAIN AST {sql}", "CSV")
