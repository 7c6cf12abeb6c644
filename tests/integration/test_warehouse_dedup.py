"""A batch inserted twice (a retry after a lost reply, a redelivered batch the recorder did not
recognise) is stored and rolled up once: ClickHouse's insert de-duplication by token, carried into
the minute rollup's materialized view. On chDB, the engine the tests run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.recorder.rows import Recorded
from services.recorder.writer import Writer
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.migrations import migrate
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
