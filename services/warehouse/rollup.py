"""Minute rollups recomputed from de-duplicated raw samples, so a duplicate can never count twice.

A materialized view sums whatever is inserted: a sample stored a second time in another batch (a
redelivery the recorder could not recognise as one) would count twice in its minute, while the raw
table (ReplacingMergeTree) collapses it. So after each insert of raw samples its writer (the
recorder; a bench or test through `insert_samples`) recomputes the minutes that insert touched
from `gpu_samples FINAL` into `gpu_minute_rollup`, a
ReplacingMergeTree keyed by GPU and minute where the newest computation replaces the older ones; the
view `gpu_minute` reads it with FINAL (schemas/clickhouse/0150_*.sql, 0151_*.sql). A recomputation
is idempotent: running it again (a retried batch, a second recorder) gives the same rows.
"""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pyarrow.compute as pc

from services.warehouse.backend import Warehouse

ROLLUP_TABLE = "gpu_minute_rollup"
MINUTE = timedelta(minutes=1)


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ts(value: object) -> str:
    return f"toDateTime64('{value:%Y-%m-%d %H:%M:%S}', 3, 'UTC')"


def recompute_sql(samples: pa.Table) -> str | None:
    """The statement that recomputes every minute `samples` (rows of `gpu_samples`) falls in, for the
    nodes in it; None for no rows. It reads the nodes' raw rows of those minutes only (the primary
    key starts with cluster and node, the partition is the day)."""
    if samples.num_rows == 0:
        return None
    ts = samples.column("ts")
    lo, hi = pc.min(ts).as_py(), pc.max(ts).as_py()
    lo = lo.replace(second=0, microsecond=0)
    hi = hi.replace(second=0, microsecond=0) + MINUTE
    pairs = pc.unique(pc.binary_join_element_wise(samples.column("cluster"), samples.column("node"), "\0")).to_pylist()
    nodes = ", ".join(f"({_quoted(c)}, {_quoted(n)})" for c, n in (p.split("\0", 1) for p in pairs))
    return f"""INSERT INTO {ROLLUP_TABLE}
SELECT
    cluster, node, gpu_index, toStartOfMinute(ts) AS minute,
    toUInt64(count()), sum(toFloat64(interval_s)), sum(coalesce(toFloat64(utilization_pct), 0) / 100 * interval_s),
    avgState(utilization_pct), max(utilization_pct), max(memory_used_mib), avgState(power_w), max(temperature_c),
    now64(6)
FROM gpu_samples FINAL
WHERE ts >= {_ts(lo)} AND ts < {_ts(hi)} AND (cluster, node) IN ({nodes})
GROUP BY cluster, node, gpu_index, minute"""


def recompute_minutes(warehouse: Warehouse, samples: pa.Table) -> None:
    """Recompute the minute rollups of every minute and node in `samples`, already in `gpu_samples`."""
    if (sql := recompute_sql(samples)) is not None:
        warehouse.command(sql)


def insert_samples(warehouse: Warehouse, samples: pa.Table, *, dedup_token: str | None = None) -> None:
    """Insert raw GPU samples and roll up their minutes: what every writer of `gpu_samples` does."""
    warehouse.insert("gpu_samples", samples, dedup_token=dedup_token)
    recompute_minutes(warehouse, samples)
