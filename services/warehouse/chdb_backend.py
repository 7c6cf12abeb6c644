"""chDB: ClickHouse's engine inside this process, persisted under the data directory.

chDB holds a lock on its directory: one process per directory, and one directory per process at a
time. The recorder owns it while the stack runs; other tools ask the recorder (request/reply).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa

from services.warehouse.backend import (
    DATABASE,
    INGEST_PRIORITY,
    OUTPUT_SETTINGS,
    QueryResult,
    Warehouse,
    WarehouseError,
    WarehouseUnavailable,
    dedup_settings,
    settings_clause,
)


def _sql_value(value: str | int) -> str:
    if isinstance(value, int):
        return str(value)
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _is_lock_error(message: str) -> bool:
    return "Cannot lock file" in message or "already initialized with path" in message


def holder(path: Path) -> str | None:
    """Who holds the chDB directory ("pid N"), or None when it is free. ClickHouse flocks `status`
    and writes its PID there; chDB's own error for a held directory says nothing useful."""
    status = path / "status"
    if not status.exists():
        return None
    fd = os.open(status, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        text = status.read_text(errors="replace")
        pid = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("PID:")), "?")
        return f"pid {pid}"
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class ChdbWarehouse(Warehouse):
    kind = "chdb"

    def __init__(self, path: Path | str) -> None:
        from chdb import session

        self.path = Path(path) / "warehouse"
        self.path.mkdir(parents=True, exist_ok=True)
        held_by = holder(self.path)
        if held_by is not None:
            raise WarehouseUnavailable(
                f"the warehouse at {self.path} is held by another process ({held_by}; is the recorder running?)"
            )
        self._lock = threading.Lock()  # one chDB session; serialize calls from any thread
        try:
            self._session: session.Session | None = session.Session(str(self.path))
        except Exception as exc:
            text = str(exc)
            if _is_lock_error(text):
                raise WarehouseUnavailable(
                    f"the warehouse at {self.path} is held by another process (is the recorder running?): {text}"
                ) from None
            raise WarehouseUnavailable(f"cannot open chDB at {self.path}: {text}") from None
        self._session.query(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
        self._session.query(f"USE {DATABASE}")
        for name, value in {**OUTPUT_SETTINGS, "priority": INGEST_PRIORITY}.items():
            self._session.query(f"SET {name} = {value}")

    def _run(self, sql: str, fmt: str = "CSV") -> bytes:
        with self._lock:
            if self._session is None:
                raise WarehouseUnavailable("the chDB session is closed")
            try:
                result = self._session.query(sql, fmt)
            except Exception as exc:
                # chDB hands what a query wrote before failing (a timeout, a memory limit) to the next
                # call's result; a throwaway query takes it, so the next caller gets only its own rows.
                with contextlib.suppress(Exception):
                    self._session.query("SELECT 1", "CSV")
                raise WarehouseError(str(exc)) from None
        return result.bytes() if result is not None else b""

    def command(self, sql: str) -> None:
        self._run(sql)

    def query(self, sql: str, *, readonly: bool = False, settings: dict[str, Any] | None = None) -> QueryResult:
        chosen = {**({"readonly": 2} if readonly else {}), **(settings or {})}
        if chosen:
            # A session-wide `SET readonly` would also lock the recorder out, so the engine guard is
            # a per-query SETTINGS clause; `sql` was already checked to be one query (readonly.py).
            sql = f"{sql.rstrip().rstrip(';')}\n{settings_clause(chosen)}"
        return QueryResult.from_json_compact(self._run(sql, "JSONCompact"))

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        columns = ", ".join(f"`{c}`" for c in data.column_names)
        arrow = data  # noqa: F841 (chDB's Python() table function finds this local by name)
        settings = ""
        if dedup_token:
            pairs = dedup_settings(dedup_token).items()
            settings = " SETTINGS " + ", ".join(f"{k} = {_sql_value(v)}" for k, v in pairs)
        with self._lock:
            if self._session is None:
                raise WarehouseUnavailable("the chDB session is closed")
            try:
                self._session.query(f"INSERT INTO {table} ({columns}){settings} SELECT {columns} FROM Python(arrow)")
            except Exception as exc:
                raise WarehouseError(f"insert into {table}: {exc}") from None

    def open_analytics(self, limits: Any) -> Any:
        from services.warehouse.analytics import ChdbAnalytics

        return ChdbAnalytics(self.path, limits)

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None
