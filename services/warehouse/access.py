"""Read-only queries for the CLI: a server directly, or chDB through the recorder that holds it.

With chDB only one process may open the data directory. While the stack runs that is the recorder,
so the CLI asks it over request/reply (`chamber.cmd.recorder.sql`); when nothing holds the directory
the CLI opens it itself. Every path checks the query is read-only first.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from services.errors import UsageError
from services.warehouse.backend import WarehouseError, WarehouseUnavailable
from services.warehouse.confine import confined_query
from services.warehouse.readonly import ReadOnlyViolation, check_read_only

MAX_ROWS = 10_000


async def _via_recorder(url: str, sql: str, max_rows: int) -> dict[str, Any] | None:
    """The recorder's answer, or None when NATS or the recorder is not there."""
    import nats

    from services.runtime.commands import CommandRefused, CommandUnavailable, request
    from services.runtime.connection import server_urls
    from services.runtime.credentials import inbox_prefix, login, user_of

    async def quiet(exc: Exception) -> None:
        pass  # no NATS is an expected case here: we fall back to opening the warehouse directly

    credentials = login(server_urls(url))
    user = user_of(server_urls(url), credentials)
    try:
        # nats-py keeps retrying a refused first connection; a one-shot query must not stall on it.
        nc = await asyncio.wait_for(
            nats.connect(
                server_urls(url),
                name="chamber-sql",
                allow_reconnect=False,
                connect_timeout=1,
                error_cb=quiet,
                **credentials,
                **({"inbox_prefix": inbox_prefix(user)} if user else {}),
            ),
            2.0,
        )
    except Exception as exc:
        if "authorization violation" in str(exc).lower():  # the bus is there and wants a password
            raise UsageError(
                f"NATS at {url} refused the login; run where the data directory of `chamber up` is (.chamber) "
                "or set CHAMBER_DATA_DIR to it"
            ) from None
        return None
    try:
        return await request(nc, "recorder", "sql", {"sql": sql, "max_rows": max_rows}, timeout=30)
    except CommandUnavailable:
        return None
    except CommandRefused as exc:
        raise UsageError(str(exc)) from None
    finally:
        await nc.close()


def _direct(args: argparse.Namespace, sql: str, max_rows: int) -> dict[str, Any]:
    from services.warehouse.options import open_for_analytics

    if not args.clickhouse_url and not (args.data_dir / "warehouse").exists():
        raise UsageError(
            f"no warehouse under {args.data_dir} yet; start the stack (`chamber up`) or the recorder "
            "(`chamber service recorder`), or point --data-dir / --clickhouse-url at one"
        )
    try:
        warehouse = open_for_analytics(args)
    except WarehouseUnavailable as exc:
        raise UsageError(f"{exc}; and no recorder answered on {args.nats} to run the query for us") from None
    try:
        result = confined_query(warehouse, sql, max_rows=max_rows)
    except ReadOnlyViolation as exc:
        raise UsageError(str(exc)) from None
    except WarehouseError as exc:
        raise UsageError(f"the warehouse refused the query: {exc}") from None
    finally:
        warehouse.close()
    rows = result.rows[:max_rows]
    return {"columns": result.columns, "types": result.types, "rows": rows, "truncated": len(result.rows) > len(rows)}


def read_query(args: argparse.Namespace, sql: str, *, max_rows: int = MAX_ROWS) -> dict[str, Any]:
    """Run one read-only query where the warehouse is; returns {columns, types, rows, truncated}."""
    try:
        query = check_read_only(sql)
    except ReadOnlyViolation as exc:
        raise UsageError(str(exc)) from None
    if not args.clickhouse_url:
        answer = asyncio.run(_via_recorder(args.nats, query, max_rows))
        if answer is not None:
            return answer
    return _direct(args, query, max_rows)
