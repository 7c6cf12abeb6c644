"""Minute rollups recomputed from de-duplicated raw samples, so a duplicate can never count twice.

A materialized view sums whatever is inserted: a sample stored a second time in another batch (a
redelivery the recorder could not recognise as one) would count twice in its minute, while the raw
table (ReplacingMergeTree) collapses it. So the minutes an insert of raw samples touched are
recomputed from `gpu_samples FINAL` into `gpu_minute_rollup`, a ReplacingMergeTree keyed by GPU and
minute where the newest computation replaces the older ones; the view `gpu_minute` reads it with
FINAL (schemas/clickhouse/0150_*.sql, 0151_*.sql). A recomputation is idempotent: running it again
(a retried batch, a second recorder) gives the same rows. Tests and benches insert through
`insert_samples`, which recomputes at once.

Recomputing after every batch reads a minute's rows once per batch that touches it: with thousands of
nodes per batch, several times the cost of the insert. So the recorder defers: with each batch it
writes the (node, minute) keys it touched to `gpu_minute_pending` (before the batch is acked, so a
crash loses none), and every few seconds one round recomputes every key pending since the last
round (`gpu_minute_progress`). A minute is then read about once per round, whatever the batch size;
the rollup trails the raw table by up to a round.
"""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pyarrow.compute as pc

from services.warehouse.backend import Warehouse

ROLLUP_TABLE = "gpu_minute_rollup"
PENDING_TABLE = "gpu_minute_pending"
PROGRESS_TABLE = "gpu_minute_progress"
# A round leaves out keys written in its last seconds: another recorder's insert of them may not be
# visible yet (the `at` default is taken when its insert starts); the next round takes them.
SETTLE_S = 2.0
MINUTE = timedelta(minutes=1)


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ts(value: object) -> str:
    return f"toDateTime64('{value:%Y-%m-%d %H:%M:%S}', 3, 'UTC')"


_AGGREGATES = """
    cluster, node, gpu_index, toStartOfMinute(ts) AS minute,
    toUInt64(count()), sum(toFloat64(interval_s)), sum(coalesce(toFloat64(utilization_pct), 0) / 100 * interval_s),
    avgState(utilization_pct), max(utilization_pct), max(memory_used_mib), avgState(power_w), max(temperature_c),
    now64(6)"""


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
SELECT{_AGGREGATES}
FROM gpu_samples FINAL
WHERE ts >= {_ts(lo)} AND ts < {_ts(hi)} AND (cluster, node) IN ({nodes})
GROUP BY cluster, node, gpu_index, minute"""


def pending_keys(samples: pa.Table) -> pa.Table:
    """The distinct (cluster, node, minute) keys of `samples`, as rows of `gpu_minute_pending`."""
    minutes = pc.floor_temporal(samples.column("ts"), unit="minute")
    keys = pa.table({"cluster": samples.column("cluster"), "node": samples.column("node"), "minute": minutes})
    return keys.group_by(["cluster", "node", "minute"]).aggregate([])


def _at(value: str) -> str:
    return f"toDateTime64('{value}', 6, 'UTC')"


# On a cluster a round reads each shard through one of its replicas; one that has not fetched the
# latest parts yet would recompute a minute without them. Only replicas less than a second behind
# answer (the keys are at least SETTLE_S old), else the round fails and is retried.
REPLICA_SETTINGS = (
    " SETTINGS max_replica_delay_for_distributed_queries = 1, fallback_to_stale_replicas_for_distributed_queries = 0"
)


def round_sql(done_until: str, until: str, minute: str, *, replicated: bool = False) -> str:
    """Recompute one minute for every node with a key pending in (done_until, until]: a scan of that
    minute only (the raw table is partitioned by day and sorted by node, then time), so a node that
    sends hours-old samples costs its own minutes, not a scan of the hours between. GLOBAL IN: on a
    cluster the nodes are read once and sent to every shard (a plain IN over two distributed tables
    is refused)."""
    start = f"toDateTime64('{minute}', 3, 'UTC')"
    pending = f"FROM {PENDING_TABLE} WHERE at > {_at(done_until)} AND at <= {_at(until)} AND minute = '{minute}'"
    return f"""INSERT INTO {ROLLUP_TABLE}
SELECT{_AGGREGATES}
FROM gpu_samples FINAL
WHERE ts >= {start} AND ts < {start} + INTERVAL 1 MINUTE
    AND (cluster, node) GLOBAL IN (SELECT cluster, node {pending})
GROUP BY cluster, node, gpu_index, minute{REPLICA_SETTINGS if replicated else ""}"""


class RollupRounds:
    """Deferred recomputation (see the module docstring); blocking calls, on the writer's thread."""

    def __init__(self, warehouse: Warehouse) -> None:
        self.warehouse = warehouse
        self.done_until: str | None = None  # read from the warehouse on first use
        self.rounds = 0
        # Keys noted since this process's last round: noting one again before that round adds
        # nothing (its pending row is still ahead of every round's mark), so a node-minute is written
        # about once per round, not once per batch.
        self._noted: set[tuple[str, str, object]] = set()

    def note(self, samples: pa.Table) -> None:
        """Record the minutes `samples` touched: part of storing the batch, before its ack."""
        if not samples.num_rows:
            return
        keys = pending_keys(samples)
        rows = list(zip(*(keys.column(c).to_pylist() for c in ("cluster", "node", "minute")), strict=True))
        fresh = [i for i, row in enumerate(rows) if row not in self._noted]
        if fresh:
            self.warehouse.insert(PENDING_TABLE, keys.take(fresh))
            self._noted.update(rows[i] for i in fresh)

    def run(self, *, settle_s: float = SETTLE_S) -> None:
        """One round: recompute what is pending up to `settle_s` ago, then move the mark."""
        self._noted.clear()  # what is noted from now on is for the next round
        if self.done_until is None:
            stored = self.warehouse.query(f"SELECT toString(max(done_until)) FROM {PROGRESS_TABLE}").scalar()
            self.done_until = str(stored or "1970-01-01 00:00:00.000000")
        until = str(self.warehouse.query(f"SELECT toString(now64(6) - {settle_s})").scalar())
        minutes = self.warehouse.query(
            f"SELECT DISTINCT toString(minute) FROM {PENDING_TABLE} "
            f"WHERE at > {_at(self.done_until)} AND at <= {_at(until)} ORDER BY 1"
        ).rows
        replicated = getattr(self.warehouse, "cluster", None) is not None
        for (minute,) in minutes:
            self.warehouse.command(round_sql(self.done_until, until, str(minute), replicated=replicated))
        self.rounds += 1 if minutes else 0
        self.warehouse.command(f"INSERT INTO {PROGRESS_TABLE} VALUES ('rollup', {_at(until)})")
        self.done_until = until


def recompute_minutes(warehouse: Warehouse, samples: pa.Table) -> None:
    """Recompute the minute rollups of every minute and node in `samples`, already in `gpu_samples`."""
    if (sql := recompute_sql(samples)) is not None:
        warehouse.command(sql)


def insert_samples(warehouse: Warehouse, samples: pa.Table, *, dedup_token: str | None = None) -> None:
    """Insert raw GPU samples and roll up their minutes: what every writer of `gpu_samples` does."""
    warehouse.insert("gpu_samples", samples, dedup_token=dedup_token)
    recompute_minutes(warehouse, samples)
