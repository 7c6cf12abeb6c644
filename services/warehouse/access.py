"""Read-only queries for the CLI: a server directly, or chDB through the recorder that holds it.

With chDB only one process may open the data directory. While the stack runs that is the recorder,
so the CLI asks it over request/reply (`chamber.cmd.recorder.sql`); when no recorder is there (no
one answers the subject) the CLI opens the directory itself. Both paths go through the same door:
the engine's own parse, an analytics session apart from ingest, read-only at the engine level.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from services.errors import UsageError
from services.warehouse.analytics import Limits, confined_query
from services.warehouse.backend import WarehouseError, WarehouseUnavailable
from services.warehouse.confine import ReadOnlyViolation, refused_text
from services.warehouse.door import QUEUE_WAIT_S

MAX_ROWS = 10_000
# Longer than a query may run (the time limit) plus the longest wait for a slot, so a slow query
# ends in the recorder's own words ("ran past its time limit of 30 s") rather than in a timeout here.
REQUEST_MARGIN_S = 10.0
REQUEST_TIMEOUT_S = Limits().max_execution_time_s + QUEUE_WAIT_S + REQUEST_MARGIN_S


async def _via_recorder(url: str, sql: str, max_rows: int) -> dict[str, Any] | None:
    """The recorder's answer, or None when NATS or the recorder is not there."""
    import nats

    from services.runtime.commands import CommandRefused, CommandTimedOut, CommandUnavailable, request
    from services.runtime.connection import server_urls
    from services.runtime.credentials import login

    async def quiet(exc: Exception) -> None:
        pass  # no NATS is an expected case here: we fall back to opening the warehouse directly

    try:
        # nats-py keeps retrying a refused first connection; a one-shot query must not stall on it.
        nc = await asyncio.wait_for(
            nats.connect(
                server_urls(url),
                name="chamber-sql",
                allow_reconnect=False,
                connect_timeout=1,
                error_cb=quiet,
                **login(server_urls(url)),
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
        return await request(nc, "recorder", "sql", {"sql": sql, "max_rows": max_rows}, timeout=REQUEST_TIMEOUT_S)
    except CommandTimedOut:
        # The recorder is there (it holds the warehouse), so opening it here would only fail.
        limits = Limits()
        raise UsageError(
            f"the recorder did not answer within {REQUEST_TIMEOUT_S:g} s, longer than a query may take "
            f"(its time limit, {limits.max_execution_time_s} s, plus up to {QUEUE_WAIT_S:g} s waiting for a slot): "
            "it is stuck or overloaded; `chamber health` shows its state"
        ) from None
    except CommandUnavailable:
        return None  # no recorder answers the subject: nobody holds the warehouse
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
    limits = Limits()
    try:
        session = warehouse.open_analytics(limits)
        try:
            result = confined_query(session, sql, max_rows=max_rows)
        finally:
            session.close()
    except ReadOnlyViolation as exc:
        raise UsageError(str(exc)) from None
    except WarehouseError as exc:
        raise UsageError(limits.explain(str(exc))) from None
    finally:
        warehouse.close()
    rows = result.rows[:max_rows]
    return {"columns": result.columns, "types": result.types, "rows": rows, "truncated": len(result.rows) > len(rows)}


def read_query(args: argparse.Namespace, sql: str, *, max_rows: int = MAX_ROWS) -> dict[str, Any]:
    """Run one read-only query where the warehouse is; returns {columns, types, rows, truncated}."""
    refused = refused_text(sql)  # before any connection: an empty or oversized text
    if refused is not None:
        raise UsageError(refused)
    if not args.clickhouse_url:
        answer = asyncio.run(_via_recorder(args.nats, sql, max_rows))
        if answer is not None:
            return answer
    return _direct(args, sql, max_rows)
