"""Store one consumed batch in the warehouse, exactly once.

The consumer acks a batch only after `store` returns. If the process dies between the insert and
the ack, the batch comes back (delivered more than once), and so does a batch whose earlier insert
attempt failed half-way: for those "suspect" batches the writer first asks which event ids each
table already holds and inserts only the rest. Fresh batches skip that look-up, keeping the hot path
a plain Arrow insert. Warehouse outages surface as TransientError, so the consumer retries the same
batch in process and nothing is lost or acked early.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from services.recorder.rows import ID_TABLES, STATE_TABLES, Recorded, build_tables
from services.runtime.consumer import TransientError
from services.runtime.logs import get_logger
from services.warehouse.backend import QueryResult, Warehouse, WarehouseError, WarehouseUnavailable
from services.warehouse.rollup import RollupRounds, recompute_minutes

log = get_logger("chamber.recorder.writer")
T = TypeVar("T")


# The time column of tables sorted or partitioned by time, used to narrow the look-up of stored ids.
_TIME_COLUMNS = {"gpu_samples": "ts", "events": "at", "cost_ledger": "period_start"}


def _batch_key(tables: dict[str, pa.Table]) -> tuple[tuple[str, str, int], ...]:
    """Names a batch by its first event id and row count per table."""
    key = []
    for name in ID_TABLES:
        table = tables.get(name)
        if table is not None and table.num_rows:
            key.append((name, str(table.column("event_id")[0]), table.num_rows))
    return tuple(key)


def insert_token(name: str, table: pa.Table) -> str:
    """Names an insert by what it holds (table, rows, every event id), so the same rows inserted again
    (a retry after a lost reply, a redelivered batch) are dropped by ClickHouse, rollups included."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{name}:{table.num_rows}:".encode())
    for event_id in table.column("event_id").to_pylist() if "event_id" in table.column_names else []:
        digest.update(event_id.encode() + b"\0")
    return digest.hexdigest()


def _quoted(values: list[str]) -> str:
    return ", ".join("'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'" for v in values)


class Writer:
    """All warehouse calls run on one worker thread: chDB is one session, and the loop stays free."""

    def __init__(
        self,
        warehouse: Warehouse,
        *,
        after_insert: Callable[[str], None] | None = None,
        deferred_rollups: bool = False,
    ) -> None:
        """`deferred_rollups`: note the minutes each batch touched and recompute them in `rollup_round`
        (the recorder, every few seconds); otherwise after every batch (tests, small tools)."""
        self.warehouse = warehouse
        self.rollups = RollupRounds(warehouse) if deferred_rollups else None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warehouse")
        self._after_insert = after_insert  # a test hook: crash between insert and ack
        self.rows_written: dict[str, int] = {}
        self.duplicates_dropped = 0
        # Batches whose store failed, so part of them may be stored: their retry checks ids. Keyed by
        # the batch itself (its tables come out the same on a retry), since consumers share a writer.
        self._in_doubt: set[tuple[tuple[str, str, int], ...]] = set()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def query(self, sql: str, *, readonly: bool = True) -> QueryResult:
        return await self.call(lambda: self.warehouse.query(sql, readonly=readonly))

    async def store(self, items: list[Recorded], *, suspect: bool) -> None:
        await self.store_tables(build_tables(items), suspect=suspect)

    async def store_tables(self, tables: dict[str, pa.Table], *, suspect: bool) -> None:
        key = _batch_key(tables)
        suspect = suspect or key in self._in_doubt
        try:
            await self.call(self._store, tables, suspect)
        except WarehouseUnavailable as exc:
            self._in_doubt.add(key)  # part of the batch may be stored: check ids on the retry
            raise TransientError(str(exc)) from exc
        except WarehouseError:
            # Rows the warehouse rejects will not pass on retry: the consumer retries a few times and
            # then dead-letters the batch (kept 30 days in DEAD, replayable), instead of stalling.
            self._in_doubt.add(key)
            raise
        self._in_doubt.discard(key)

    def _store(self, tables: dict[str, pa.Table], suspect: bool) -> None:
        for name in ID_TABLES + STATE_TABLES:
            table = tables.get(name)
            if table is None or table.num_rows == 0:
                continue
            if suspect and name in ID_TABLES:
                table = self._drop_stored(name, table)
            if table.num_rows:
                self.warehouse.insert(name, table, dedup_token=insert_token(name, table))
                self.rows_written[name] = self.rows_written.get(name, 0) + table.num_rows
                if self._after_insert is not None:
                    self._after_insert(name)
        samples = tables.get("gpu_samples")
        if samples is not None:
            # From every row of the batch, stored now or before: a batch retried after its insert
            # landed and its recomputation failed still gets its minutes recomputed.
            if self.rollups is not None:
                self.rollups.note(samples)
            else:
                recompute_minutes(self.warehouse, samples)

    async def rollup_round(self) -> None:
        """Recompute the minutes noted since the last round (deferred rollups only)."""
        if self.rollups is not None:
            await self.call(self.rollups.run)

    def _drop_stored(self, name: str, table: pa.Table) -> pa.Table:
        ids = pc.unique(table.column("event_id")).to_pylist()
        where = f"event_id IN ({_quoted(ids)})"
        column = _TIME_COLUMNS.get(name)
        if column is not None:  # prune by time first: the ids are not where the sort key starts
            times = table.column(column)
            lo, hi = pc.min(times).as_py(), pc.max(times).as_py()
            where += f" AND {column} BETWEEN toDateTime64('{lo:%Y-%m-%d %H:%M:%S.%f}', 3, 'UTC') - 1"
            where += f" AND toDateTime64('{hi:%Y-%m-%d %H:%M:%S.%f}', 3, 'UTC') + 1"
        stored = [r[0] for r in self.warehouse.query(f"SELECT DISTINCT event_id FROM {name} WHERE {where}").rows]
        if not stored:
            return table
        keep = pc.invert(pc.is_in(table.column("event_id"), value_set=pa.array(stored, pa.string())))
        kept = table.filter(keep)
        self.duplicates_dropped += table.num_rows - kept.num_rows
        log.info("dropped rows already stored", table=name, rows=table.num_rows - kept.num_rows)
        return kept

    def close(self) -> None:
        self._pool.shutdown(wait=True)
