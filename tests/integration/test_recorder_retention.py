"""The recorder's raw-sample TTL and rollup retention, applied to a real chDB warehouse."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.recorder.retention import RAW_TTL_DAYS, ROLLUP_TTL_DAYS, apply_retention, ttl_days
from services.warehouse import migrate
from services.warehouse.chdb_backend import ChdbWarehouse

pytestmark = pytest.mark.integration


def test_the_ttls_are_set_as_asked_changed_only_when_they_differ_and_kept_across_a_reopen(tmp_path: Path) -> None:
    warehouse = ChdbWarehouse(tmp_path)
    try:
        migrate(warehouse)
        assert ttl_days(warehouse) == {"gpu_samples": RAW_TTL_DAYS, "gpu_minute_rollup": ROLLUP_TTL_DAYS}
        assert apply_retention(warehouse) == []  # the defaults are what the DDL made
        assert sorted(apply_retention(warehouse, raw_days=7, rollup_days=90)) == [
            "gpu_minute_rollup: 400 -> 90 days",
            "gpu_samples: 30 -> 7 days",
        ]
    finally:
        warehouse.close()
    reopened = ChdbWarehouse(tmp_path)
    try:
        assert ttl_days(reopened) == {"gpu_samples": 7, "gpu_minute_rollup": 90}
        assert apply_retention(reopened, raw_days=7, rollup_days=90) == []
    finally:
        reopened.close()


def test_a_ttl_under_a_day_is_refused(tmp_path: Path) -> None:
    warehouse = ChdbWarehouse(tmp_path)
    try:
        migrate(warehouse)
        with pytest.raises(ValueError, match="at least 1 day"):
            apply_retention(warehouse, raw_days=0)
    finally:
        warehouse.close()
