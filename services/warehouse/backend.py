"""The warehouse interface: one small surface that both backends (chDB, ClickHouse server) implement.

Results come back as ClickHouse's `JSONCompact` on both backends, so a query gives the same values
(numbers as JSON numbers, dates and decimals as strings) whichever engine ran it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

DATABASE = "chamber"


class WarehouseError(Exception):
    """A query or insert the warehouse rejected (bad SQL, wrong types): retrying will not help."""


class WarehouseUnavailable(WarehouseError):
    """The warehouse cannot be reached or opened now (server down, directory held): retry later."""


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def scalar(self) -> Any:
        return self.rows[0][0] if self.rows and self.rows[0] else None

    @classmethod
    def from_json_compact(cls, raw: bytes | str) -> QueryResult:
        if not raw or not str(raw if isinstance(raw, str) else raw[:1]).strip():
            return cls([], [], [])
        doc = json.loads(raw)
        meta = doc.get("meta", [])
        return cls([m["name"] for m in meta], [m["type"] for m in meta], doc.get("data", []))


# Settings every query runs with, on both backends, so results look the same.
OUTPUT_SETTINGS: dict[str, Any] = {
    "output_format_json_quote_64bit_integers": 0,
    "output_format_json_quote_decimals": 0,
    "output_format_json_quote_denormals": 0,
}


# ClickHouse's query priority (`priority`: 1 the highest, 0 none): chDB's writer session runs its
# queries at INGEST_PRIORITY and analytics at ANALYTICS_PRIORITY, so while an insert or a rollup runs
# the engine holds an analytics query at its next block until the writer's query ends (at most
# `low_priority_query_wait_time_ms`, 1 s, at a time). On a server only queries of other clients at a
# priority from 1 to ANALYTICS_PRIORITY - 1 hold it; the server writer sets none.
INGEST_PRIORITY = 1
ANALYTICS_PRIORITY = 2


def settings_clause(settings: dict[str, Any]) -> str:
    """`SETTINGS a = 1, b = 'x'` for a per-query settings dict (names and values are ours, not a user's)."""
    values = ", ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {int(v)}" for k, v in settings.items())
    return f"SETTINGS {values}"


def dedup_settings(token: str) -> dict[str, str | int]:
    """ClickHouse's insert de-duplication by token, carried into dependent materialized views (the
    minute rollup). Tables opt in with `non_replicated_deduplication_window` (replicated tables
    de-duplicate by default); see schemas/clickhouse/0015_insert_dedup.sql."""
    return {"insert_deduplication_token": token, "deduplicate_blocks_in_dependent_materialized_views": 1}


class Warehouse(ABC):
    """Blocking calls; async callers run them on one worker thread (see `services.recorder.writer`)."""

    kind: str = "?"

    @abstractmethod
    def command(self, sql: str) -> None:
        """Run one statement that returns nothing of interest (DDL, INSERT ... SELECT, SYSTEM)."""

    @abstractmethod
    def query(self, sql: str, *, readonly: bool = False, settings: dict[str, Any] | None = None) -> QueryResult:
        """Run one query; with `readonly` the engine itself refuses writes, as a second guard.
        `settings` apply to this query only (limits, a stricter `readonly`)."""

    @abstractmethod
    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        """Insert an Arrow table (column names match the table's); atomic for one block.

        `dedup_token` names the block: the engine drops a second insert with the same token, in the
        table and in the materialized views fed from it (`DEDUP_SETTINGS`), so a retried insert
        cannot count twice in a rollup."""

    @abstractmethod
    def close(self) -> None: ...

    def open_analytics(self, limits: Any) -> Any:
        """A session for analytics SQL apart from this one (services.warehouse.analytics): its own
        settings, read-only at the engine level. `limits`: analytics.Limits."""
        raise WarehouseError(f"the {self.kind} warehouse has no analytics session")

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def count(self, table: str, where: str = "1") -> int:
        return int(self.query(f"SELECT count() FROM {table} WHERE {where}").scalar() or 0)
