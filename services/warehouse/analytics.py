"""Where analytics SQL runs: a session of its own, read-only at the engine level, apart from ingest.

On chDB it is a second session on the same engine: its settings are its own, so the limits and
`readonly = 1` are set once when it opens, and the engine then refuses any write, any change of a
setting (`SET`, a query's SETTINGS) and table functions that read or write outside. The database
is set again before every query, so no `USE` carries over. Ingest keeps its own session untouched,
and its queries run at a higher engine priority (`priority`): while an insert runs, the engine holds
an analytics query at its next block, with or without the privilege to renice threads.
On a server it is a client of the restricted user (`chamber_sql`: SELECT on `chamber`, limits under
constraints) without an HTTP session, so nothing one query sets reaches the next.

`confined_query` checks the text on the engine's own parse (confine.py) and runs that same text.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.warehouse.backend import ANALYTICS_PRIORITY, DATABASE, OUTPUT_SETTINGS, QueryResult, WarehouseError
from services.warehouse.confine import (
    Catalog,
    Node,
    ReadOnlyViolation,
    check_tree,
    explain_parse_error,
    is_simple_statement,
    nodes_from_explain,
    nodes_from_json,
    refused_text,
    sql_literal,
)
from services.warehouse.idle_threads import WATCH
from services.warehouse.memory_budget import MAX_QUERY_BYTES, size_text


def default_threads() -> int:
    """Threads one analytics query may use: a quarter of the CPUs, so ingest keeps the rest."""
    return max(1, (os.cpu_count() or 1) // 4)


@dataclass(frozen=True)
class Limits:
    """What every analytics query may spend. `max_rows` more rows than asked are not even read."""

    max_execution_time_s: int = 30
    max_memory_bytes: int = MAX_QUERY_BYTES  # the recorder sets it from its container (memory_budget.py)
    max_rows: int = 100_000
    max_threads: int = 0  # 0: default_threads()
    # The nice value of the query's threads: where the engine may renice (CAP_SYS_NICE, root in a
    # container) ingest's threads win the CPU from a heavy query; elsewhere the engine skips it.
    nice: int = 19
    # In this process (chDB), and where they were reniced: the query's threads also run under
    # SCHED_IDLE, so they get only CPU time nothing else wants (idle_threads.py). Off: on a machine
    # busy with other processes it made every query slower (the SQL door's tests: 10 s -> 17-20 s),
    # and it did not measurably help ingest there (bench/sql_isolation.py --compare nice,idle).
    idle: bool = False
    # The engine pauses the query while a query of the writer runs (an insert, a rollup), at its next
    # block: ClickHouse's `priority`, ANALYTICS_PRIORITY below the writer's INGEST_PRIORITY (backend.py).
    yield_to_ingest: bool = True

    def settings(self, rows: int | None = None) -> dict[str, Any]:
        wanted = self.max_rows if rows is None else max(0, min(rows, self.max_rows))
        return {
            "max_execution_time": self.max_execution_time_s,
            "max_memory_usage": self.max_memory_bytes,
            # one row more than returned, so the caller can say "truncated"; `break` stops reading
            # there instead of failing (subqueries are not limited by it)
            "max_result_rows": wanted + 1,
            "result_overflow_mode": "break",
            "max_threads": self.max_threads or default_threads(),
            "os_thread_priority": self.nice,
            "priority": ANALYTICS_PRIORITY if self.yield_to_ingest else 0,
        }

    def explain(self, message: str) -> str:
        """An engine error in words that name the limit it hit."""
        if "TIMEOUT_EXCEEDED" in message or "Timeout exceeded" in message:
            return (
                f"the query ran past its time limit of {self.max_execution_time_s} s (max_execution_time); "
                "narrow it (a shorter time range, LIMIT, fewer columns)"
            )
        if "MEMORY_LIMIT_EXCEEDED" in message or "Memory limit" in message:
            return (
                f"the query needed more than its memory limit of {size_text(self.max_memory_bytes)} "
                "(max_memory_usage); aggregate over fewer keys or a shorter time range"
            )
        return f"the warehouse refused the query: {message}"


class AnalyticsSession(ABC):
    """One connection for analytics queries: parse with the engine, run read-only. Blocking calls."""

    kind = "?"

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._catalog: Catalog | None = None

    @abstractmethod
    def parse(self, sql: str) -> list[Node]:
        """The engine's tree of `sql`, or ReadOnlyViolation when it is not exactly one statement."""

    @abstractmethod
    def run(self, sql: str, rows: int) -> QueryResult:
        """Run `sql` as given, read-only, within the limits; raises WarehouseError."""

    @abstractmethod
    def close(self) -> None: ...

    def catalog(self) -> Catalog:
        if self._catalog is None:  # fixed for an engine's life: read once
            self._catalog = self.read_catalog()
        return self._catalog

    def read_catalog(self) -> Catalog:
        def names(sql: str) -> list[str]:
            return [str(r[0]) for r in self.run(sql, self.limits.max_rows).rows]

        try:
            functions = self.run("SELECT name, alias_to, categories FROM system.functions", self.limits.max_rows)
        except WarehouseError:  # a server older than the `categories` column
            functions = self.run("SELECT name, alias_to, '' FROM system.functions", self.limits.max_rows)
        return Catalog.from_rows(
            names("SELECT name FROM system.table_functions"),
            names("SELECT name FROM system.databases"),
            names(f"SELECT name FROM system.tables WHERE database = '{DATABASE}'"),
            [(str(n), str(a), str(c)) for n, a, c in functions.rows],
        )


class ChdbAnalytics(AnalyticsSession):
    """A second chDB session on the warehouse directory this process already opened."""

    kind = "chdb"

    def __init__(self, path: Path, limits: Limits) -> None:
        from chdb import session

        super().__init__(limits)
        self._lock = threading.Lock()
        self._session: Any = session.Session(str(path))
        try:
            self._session.query(f"USE {DATABASE}")
            for name, value in {**OUTPUT_SETTINGS, **limits.settings()}.items():
                self._session.query(f"SET {name} = {value!r}" if isinstance(value, str) else f"SET {name} = {value}")
            self._session.query("SET readonly = 1")  # last: after it no setting may change
        except Exception as exc:
            self._session.close()
            raise WarehouseError(f"cannot open the analytics session: {exc}") from None

    def _query(self, sql: str) -> QueryResult:
        with self._lock:
            if self._session is None:
                raise WarehouseError("the analytics session is closed")
            try:
                self._session.query(f"USE {DATABASE}")  # whatever ran before, this query starts in chamber
                # a query on several threads may leave pool threads at its nice: tidied when it ends
                tidy = self.limits.idle or self.limits.settings()["max_threads"] > 1
                with WATCH.during_query(idle=self.limits.idle) if tidy else contextlib.nullcontext():
                    result = self._session.query(sql, "JSONCompact")
            except Exception as exc:
                # chDB hands what a failed query wrote to the next call's result; a throwaway query takes it
                with contextlib.suppress(Exception):  # the query's own error is the one to report
                    self._session.query("SELECT 1", "CSV")
                raise WarehouseError(str(exc)) from None
        return QueryResult.from_json_compact(result.bytes() if result is not None else b"")

    def parse(self, sql: str) -> list[Node]:
        try:
            answer = self._query(f"SELECT parseQueryToJSON({sql_literal(sql)}) AS tree")
        except WarehouseError as exc:
            raise explain_parse_error(str(exc)) from None
        return nodes_from_json(json.loads(str(answer.scalar())))

    def run(self, sql: str, rows: int) -> QueryResult:
        return self._query(sql)  # the row limit is the session's; the caller keeps `rows` of them

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None


class ServerAnalytics(AnalyticsSession):
    """A ClickHouse server, as the restricted user when its URL is given; no HTTP session."""

    kind = "clickhouse"

    def __init__(self, url: str, limits: Limits) -> None:
        from urllib.parse import urlparse

        import clickhouse_connect

        super().__init__(limits)
        parsed = urlparse(url)
        self.url = url
        try:
            self._client = clickhouse_connect.get_client(
                host=parsed.hostname or "127.0.0.1",
                port=parsed.port or (8443 if parsed.scheme == "https" else 8123),
                username=parsed.username or "default",
                password=parsed.password or "",
                secure=parsed.scheme == "https",
                database=DATABASE,
                settings=OUTPUT_SETTINGS,
                autogenerate_session_id=False,  # a session would carry a `USE` or `SET` to the next query
            )
        except Exception as exc:
            raise WarehouseError(f"cannot reach ClickHouse at {url}: {exc}") from None

    def _query(self, sql: str, rows: int) -> QueryResult:
        settings = {**OUTPUT_SETTINGS, "readonly": 1, **self.limits.settings(rows)}
        try:
            raw = self._client.raw_query(sql, settings=settings, fmt="JSONCompact")
        except Exception as exc:
            raise WarehouseError(str(exc)) from None
        return QueryResult.from_json_compact(raw)

    def parse(self, sql: str) -> list[Node]:
        # The server's HTTP interface runs one statement per request: a second one is a syntax error
        # here, never executed.
        try:
            tree = self._query(f"EXPLAIN AST {sql}", self.limits.max_rows)
        except WarehouseError as exc:
            raise explain_parse_error(str(exc)) from None
        return nodes_from_explain([str(r[0]) for r in tree.rows])

    def run(self, sql: str, rows: int) -> QueryResult:
        return self._query(sql, rows)

    def close(self) -> None:
        self._client.close()


def confined_query(session: AnalyticsSession, sql: str, *, max_rows: int) -> QueryResult:
    """Check `sql` on the engine's own parse, then run exactly that text on the analytics session.
    Raises ReadOnlyViolation (refused, nothing ran) or WarehouseError (ran and failed)."""
    refused = refused_text(sql)
    if refused is not None:
        raise ReadOnlyViolation(refused)
    if not is_simple_statement(sql):
        check_tree(session.parse(sql), session.catalog())
    return session.run(sql, max(0, max_rows))
