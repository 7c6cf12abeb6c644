"""How long the warehouse keeps raw GPU samples and their minute rollups: the recorder's options.

The DDL (schemas/clickhouse/0001_recorded.sql) creates the tables with the defaults; at start the
recorder changes a table's TTL only where it differs from what it was asked for, so restarting with
the same options does nothing, and a changed option applies to the rows already stored.
"""

from __future__ import annotations

import re

from services.warehouse import Warehouse

RAW_TTL_DAYS = 30  # raw samples: one row per GPU per interval, the big table
ROLLUP_TTL_DAYS = 400  # minute rollups: what reports and efficiency read past the raw TTL

# table -> the TTL expression, with the days left to fill in
_TTL = {"gpu_samples": "toDateTime(ts) + INTERVAL {days} DAY", "gpu_minute_rollup": "minute + INTERVAL {days} DAY"}
_DAYS = re.compile(r"TTL .*?toIntervalDay\((\d+)\)")


def ttl_days(warehouse: Warehouse) -> dict[str, int | None]:
    """Each table's TTL in days as the warehouse has it now (None: no TTL)."""
    names = ", ".join(f"'{t}'" for t in _TTL)
    rows = warehouse.query(
        f"SELECT name, engine_full FROM system.tables WHERE database = currentDatabase() AND name IN ({names})"
    ).rows
    found: dict[str, int | None] = {}
    for name, engine in rows:
        match = _DAYS.search(str(engine))
        found[str(name)] = int(match.group(1)) if match else None
    return found


def apply_retention(
    warehouse: Warehouse, *, raw_days: int = RAW_TTL_DAYS, rollup_days: int = ROLLUP_TTL_DAYS
) -> list[str]:
    """Set the raw-sample and rollup TTLs; returns what changed ("gpu_samples: 30 -> 7 days")."""
    for value, what in ((raw_days, "raw sample TTL"), (rollup_days, "rollup TTL")):
        if value < 1:
            raise ValueError(f"the {what} must be at least 1 day, not {value}")
    wanted = {"gpu_samples": raw_days, "gpu_minute_rollup": rollup_days}
    changed = []
    for table, now in ttl_days(warehouse).items():
        days = wanted[table]
        if now != days:
            warehouse.command(f"ALTER TABLE {table} MODIFY TTL {_TTL[table].format(days=days)}")
            changed.append(f"{table}: {now} -> {days} days")
    return changed
