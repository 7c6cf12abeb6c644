"""A sample stored twice is rolled up once: a batch inserted twice (a retry after a lost reply, a
redelivered batch the recorder did not recognise) is dropped by ClickHouse's insert de-duplication
by token, and a sample that comes back inside a *different* batch is collapsed because the recorder
recomputes each minute from the de-duplicated raw rows. On chDB, the engine the tests run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.recorder.rows import Recorded, build_tables
from services.recorder.writer import Writer
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.migrations import migrate, schema_dir
from tests.warehouse_builders import a_sample

pytestmark = pytest.mark.integration
T0 = float(int(time.time()) // 60 * 60 - 3600)  # a whole minute, an hour ago (inside the raw TTL)


def batch(first: int, count: int) -> list[Recorded]:
    return [
        Recorded(
            a_sample("n1", T0 + i, [50.0, 100.0], seq=i, interval_s=1.0),
            f"s-{i}",
            "test",
            "",
            "TELEMETRY",
            "chamber.telemetry.sample.c1.n1",
            i + 1,
        )
        for i in range(first, first + count)
    ]


def minute(warehouse: ChdbWarehouse) -> tuple[int, float]:
    row = warehouse.query("SELECT sum(samples), sum(seconds) FROM gpu_minute WHERE gpu_index = 0").rows[0]
    return int(row[0]), float(row[1])


def utilization(warehouse: ChdbWarehouse) -> tuple[float, float]:
    """The efficiency inputs of GPU 1 (100 % busy): busy GPU-seconds and the average utilization."""
    row = warehouse.query("SELECT sum(util_seconds), avgMerge(util_avg) FROM gpu_minute WHERE gpu_index = 1").rows[0]
    return float(row[0]), float(row[1])


async def test_the_same_batch_inserted_twice_counts_once_in_the_minute_rollup(tmp_path: Path) -> None:
    warehouse = ChdbWarehouse(tmp_path)
    migrate(warehouse)
    writer = Writer(warehouse)
    try:
        await writer.store(batch(0, 30), suspect=False)
        await writer.store(batch(0, 30), suspect=False)  # not flagged as a redelivery: it gets through
        assert minute(warehouse) == (30, 30.0)
        assert warehouse.count("gpu_samples") == 60  # 30 samples x 2 GPUs, stored once
        await writer.store(batch(30, 20), suspect=False)  # a different batch is of course stored
        assert minute(warehouse) == (50, 50.0)
    finally:
        writer.close()
        warehouse.close()


async def test_a_sample_stored_again_in_another_batch_counts_once_in_the_minute_rollup(tmp_path: Path) -> None:
    warehouse = ChdbWarehouse(tmp_path)
    migrate(warehouse)
    writer = Writer(warehouse)
    try:
        await writer.store(batch(0, 30), suspect=False)
        # Samples 20..29 come back with 30..39 (a redelivery after a lost ack, mixed with new ones):
        # a new batch, so a new insert token, and not flagged as a redelivery.
        await writer.store(batch(20, 20), suspect=False)
        assert minute(warehouse) == (40, 40.0)
        assert utilization(warehouse) == (40.0, 100.0)
        since, until = (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) for t in (T0, T0 + 60))
        capacity = warehouse.query(
            f"SELECT sum(capacity_s) FROM gpu_minutes(since = '{since}', until = '{until}') WHERE gpu_index = 1"
        ).scalar()
        assert capacity == 40.0  # what the efficiency report reads: 40 GPU-seconds, not 50
        rows = warehouse.query("SELECT count() FROM gpu_minute WHERE gpu_index = 0").scalar()
        assert rows == 1  # one row per GPU-minute, however often it was recomputed
    finally:
        writer.close()
        warehouse.close()


def test_an_existing_rollup_is_carried_over_and_recomputed_from_the_raw_rows(tmp_path: Path) -> None:
    """A warehouse made before exact rollups (the view-fed table with a doubled minute) is migrated:
    the last day's minutes are recomputed from the raw rows, older ones keep their rolled-up values."""
    old = tmp_path / "old-migrations"
    old.mkdir()
    for path in sorted(schema_dir().glob("*.sql")):
        if int(path.name[:4]) < 150:
            (old / path.name).write_text(path.read_text())
    warehouse = ChdbWarehouse(tmp_path)
    try:
        migrate(warehouse, old)
        samples = build_tables(batch(0, 30))["gpu_samples"]
        warehouse.insert("gpu_samples", samples)
        warehouse.insert("gpu_samples", samples.slice(0, 20))  # a second batch repeating 10 samples
        expired = "INSERT INTO gpu_minute (cluster, node, gpu_index, minute, samples, seconds) VALUES "
        long_ago = time.strftime("%Y-%m-%d %H:%M:00", time.gmtime(T0 - 100 * 86400))  # raw rows gone, rollup kept
        warehouse.command(expired + f"('c1', 'n0', 5, '{long_ago}', 60, 60.0)")
        assert minute(warehouse) == (40, 40.0)  # the doubled samples, as they were
        assert migrate(warehouse)[:2] == ["0150_rollup_from_deduplicated", "0151_minute_view"]  # later ones may follow
        assert minute(warehouse) == (30, 30.0)
        assert warehouse.query("SELECT sum(samples) FROM gpu_minute WHERE node = 'n0'").scalar() == 60
        migrate(warehouse)  # up to date: nothing runs again
        assert minute(warehouse) == (30, 30.0)
    finally:
        warehouse.close()


async def test_deferred_rounds_recompute_what_a_recorder_noted_before_it_died(tmp_path: Path) -> None:
    """The recorder recomputes in rounds: a batch notes its minutes (before its ack); a round recomputes
    them. Minutes noted by a recorder that died before its round are recomputed by the next one."""
    warehouse = ChdbWarehouse(tmp_path)
    migrate(warehouse)
    first = Writer(warehouse, deferred_rollups=True)
    second = Writer(warehouse, deferred_rollups=True)
    try:
        rounds = first.rollups
        assert rounds is not None
        await first.store(batch(0, 15), suspect=False)
        await first.store(batch(15, 15), suspect=False)
        assert minute(warehouse) == (0, 0.0)  # the rollup trails the raw table until the round
        assert warehouse.count("gpu_minute_pending") == 1  # one node-minute, noted once until the round
        await first.call(lambda: rounds.run(settle_s=0.0))
        assert minute(warehouse) == (30, 30.0)
        await first.store(batch(20, 20), suspect=False)  # 10 samples again, 10 new: noted, then it dies
        first.close()
        assert minute(warehouse) == (30, 30.0)
        later = second.rollups
        assert later is not None
        await second.call(lambda: later.run(settle_s=0.0))  # its first round starts where the mark is
        assert minute(warehouse) == (40, 40.0)
        assert utilization(warehouse) == (40.0, 100.0)
        # One round over minutes far apart: a node catching up on an hour-old sample, and the live one.
        late = Recorded(a_sample("n2", T0 - 3600, [10.0], seq=0, interval_s=1.0), "late", "t", "", "T", "s", 99)
        await second.store([late, *batch(40, 1)], suspect=False)
        await second.call(lambda: later.run(settle_s=0.0))
        by_node = "SELECT node, sum(samples) FROM gpu_minute WHERE gpu_index = 0 GROUP BY node ORDER BY node"
        assert warehouse.query(by_node).rows == [["n1", 41], ["n2", 1]]
    finally:
        first.close()
        second.close()
        warehouse.close()
