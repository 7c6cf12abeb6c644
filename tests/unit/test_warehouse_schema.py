"""The DDL migrations load in order and split into statements; the rows the recorder writes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from events import JobCompleted
from events.dispatch import ClusterHeartbeat, WorkloadDispatched
from services.recorder.rows import Recorded, build_tables
from services.warehouse import WarehouseError
from services.warehouse.efficiency import parse_since
from services.warehouse.migrations import load, split_statements
from tests.warehouse_builders import T0, a_sample, an_inventory, scheduled, submitted


def test_migrations_are_numbered_in_order_and_every_statement_is_idempotent() -> None:
    migrations = load()
    assert [m.version for m in migrations] == sorted(m.version for m in migrations)
    statements = [s for m in migrations for s in m.statements]
    replacing = {
        m.group(1)
        for s in statements
        if (m := re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", s)) and "ENGINE = ReplacingMergeTree" in s
    }
    for m in migrations:
        for statement in m.statements:
            upper = statement.upper()
            # a setting set twice is set once: MODIFY SETTING is idempotent without the clause; a
            # backfill into a replacing table writes the same rows under the same key and version again
            into = re.match(r"INSERT INTO (\w+)\s", statement)
            assert (
                "IF NOT EXISTS" in upper
                or (upper.startswith("DROP ") and " IF EXISTS " in upper)
                or " MODIFY SETTING " in upper
                or (into is not None and into.group(1) in replacing)
            ), f"{m.name}: {statement[:60]}"


def test_a_statement_ends_at_a_semicolon_at_the_end_of_a_line() -> None:
    text = "-- comment\nCREATE TABLE a (x String DEFAULT ';') ENGINE = Log;\n\nCREATE VIEW b AS SELECT 1;\n"
    assert split_statements(text) == ["CREATE TABLE a (x String DEFAULT ';') ENGINE = Log", "CREATE VIEW b AS SELECT 1"]


def test_a_badly_named_migration_is_refused(tmp_path: Path) -> None:
    (tmp_path / "init.sql").write_text("SELECT 1;")
    with pytest.raises(WarehouseError, match=r"NNNN_name\.sql"):
        load(tmp_path)


def test_dispatch_decisions_are_audited_and_cluster_heartbeats_are_not() -> None:
    tables = build_tables(
        recorded(
            WorkloadDispatched(workload="k8s-a-ml-train", cluster="b", generation=1, at=T0),
            ClusterHeartbeat(cluster="b", at=T0 + 1, capacity_gpus=64),
        )
    )
    events = tables["events"].to_pydict()
    assert events["type"] == [WorkloadDispatched.ce_type()] and events["cluster"] == ["b"]


def recorded(*events: object) -> list[Recorded]:
    return [Recorded(e, f"id-{i}", "test", "", "S", "subj", i) for i, e in enumerate(events)]  # type: ignore[arg-type]


def test_a_node_sample_becomes_one_row_per_gpu_with_its_event_id() -> None:
    tables = build_tables(recorded(a_sample("n1", T0, [10, 20, None]), a_sample("n2", T0 + 1, [5])))  # type: ignore[list-item]
    samples = tables["gpu_samples"].to_pydict()
    assert samples["node"] == ["n1", "n1", "n1", "n2"]
    assert samples["gpu_index"] == [0, 1, 2, 0]
    assert samples["utilization_pct"] == [10, 20, None, 5]
    assert samples["event_id"] == ["id-0", "id-0", "id-0", "id-1"]
    assert set(tables) == {"gpu_samples"}  # samples are not domain events: no audit rows


def test_job_events_carry_team_request_and_placed_gpus_and_every_event_is_audited() -> None:
    tables = build_tables(
        recorded(
            submitted("j1", "vision", 2, T0, model="H100"),
            scheduled("j1", "vision", "n1", [3, 4], T0 + 5),
            JobCompleted(job_id="j1", at=T0 + 9),
            an_inventory("n1", gpus=2),
        )
    )
    jobs = tables["job_events"].to_pydict()
    assert jobs["kind"] == ["submitted", "scheduled", "completed"]
    assert jobs["gpus_requested"] == [2, 0, 0] and jobs["gpu_model"] == ["H100", "", ""]
    assert jobs["gpus"][1] == [
        {"cluster": "c1", "node": "n1", "gpu_index": 3},
        {"cluster": "c1", "node": "n1", "gpu_index": 4},
    ]
    assert tables["events"].num_rows == 3  # the inventory updates gpu_inventory, not the audit log
    assert tables["gpu_inventory"].to_pydict()["model"] == ["H100-80GB", "H100-80GB"]


def test_a_window_start_is_a_duration_or_an_iso_time() -> None:
    assert parse_since("24h", 100_000.0) == 100_000.0 - 86_400
    assert parse_since("90m", 10_000.0) == 10_000.0 - 5_400
    assert parse_since("2026-01-01T00:00:00", 0) == 1_767_225_600.0
    with pytest.raises(ValueError, match="duration"):
        parse_since("yesterday", 0)
