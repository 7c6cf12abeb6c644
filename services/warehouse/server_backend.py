"""A ClickHouse server through clickhouse-connect (HTTP). Same DDL and queries as chDB."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import pyarrow as pa

from services.warehouse.backend import (
    DATABASE,
    OUTPUT_SETTINGS,
    QueryResult,
    Warehouse,
    WarehouseError,
    WarehouseUnavailable,
    dedup_settings,
)


def _unavailable(exc: Exception) -> bool:
    from clickhouse_connect.driver.exceptions import OperationalError

    return isinstance(exc, OperationalError | ConnectionError | TimeoutError)


class ServerWarehouse(Warehouse):
    kind = "clickhouse"

    def __init__(self, url: str, *, database: str = DATABASE, cluster: str | None = None) -> None:
        import clickhouse_connect

        from services.warehouse.cluster import check_cluster_name

        self.cluster = check_cluster_name(cluster) if cluster else None

        parsed = urlparse(url)
        self.url = url
        self.database = database
        kwargs: dict[str, Any] = {
            "host": parsed.hostname or "127.0.0.1",
            "port": parsed.port or (8443 if parsed.scheme == "https" else 8123),
            "username": parsed.username or "default",
            "password": parsed.password or "",
            "secure": parsed.scheme == "https",
        }
        try:
            bootstrap = clickhouse_connect.get_client(**kwargs)
            on_cluster = f" ON CLUSTER {self.cluster}" if self.cluster else ""
            bootstrap.command(f"CREATE DATABASE IF NOT EXISTS {database}{on_cluster}")
            bootstrap.close()
            self._client = clickhouse_connect.get_client(**kwargs, database=database, settings=OUTPUT_SETTINGS)
        except Exception as exc:
            raise WarehouseUnavailable(f"cannot reach ClickHouse at {url}: {exc}") from None

    def _call(self, what: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:
            if _unavailable(exc):
                raise WarehouseUnavailable(f"ClickHouse at {self.url} unavailable during {what}: {exc}") from None
            raise WarehouseError(f"{what}: {exc}") from None

    def command(self, sql: str) -> None:
        self._call("command", lambda: self._client.command(sql))

    def query(self, sql: str, *, readonly: bool = False, settings: dict[str, Any] | None = None) -> QueryResult:
        # readonly=2: no writes or DDL, but the client may still set per-query settings.
        chosen = {**OUTPUT_SETTINGS, **({"readonly": 2} if readonly else {}), **(settings or {})}
        raw = self._call("query", lambda: self._client.raw_query(sql, settings=chosen, fmt="JSONCompact"))
        return QueryResult.from_json_compact(raw)

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        settings: dict[str, Any] = dict(dedup_settings(dedup_token)) if dedup_token else {}
        if self.cluster:  # an insert into a Distributed table returns once every shard has its rows
            settings["insert_distributed_sync"] = 1
        self._call(f"insert into {table}", lambda: self._client.insert_arrow(table, data, settings=settings or None))

    def open_analytics(self, limits: Any) -> Any:
        from services.warehouse.analytics import ServerAnalytics

        return ServerAnalytics(self.url, limits)

    def close(self) -> None:
        self._client.close()
