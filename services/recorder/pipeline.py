"""The recorder's work (services/recorder/service.py is its light front): every stream into the
warehouse, and read-only SQL over request/reply.

One durable consumer per stream hands whole fetched batches (up to --batch-size messages, or what
arrived within --flush-interval) to the writer; the runtime acks them only after the writer returns.
It also answers `chamber.cmd.recorder.sql`, because with chDB only this process may open the
warehouse directory while it runs. Those queries go through the analytics door (warehouse/door.py):
sessions and threads of their own, a bounded queue, never the writer's thread or session.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from functools import partial
from typing import Any

import msgspec
import pyarrow as pa

from events.streams import TELEMETRY
from services.errors import UsageError
from services.recorder.partitions import own_partitions
from services.recorder.retention import RAW_TTL_DAYS, ROLLUP_TTL_DAYS, apply_retention
from services.recorder.rows import Recorded
from services.recorder.samples import FETCH_MAX_BYTES, MIN_FETCH_MAX_BYTES, SampleConsumer, SubjectRate
from services.recorder.service import DURABLE, NAME, STREAMS
from services.recorder.writer import Writer
from services.runtime import ConsumerOptions, Delivery
from services.runtime.backoff import Backoff
from services.runtime.commands import CommandRefused
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import get_logger
from services.warehouse import (
    ReadOnlyViolation,
    Warehouse,
    WarehouseError,
    WarehouseUnavailable,
    migrate,
    open_from_args,
)
from services.warehouse.analytics import Limits
from services.warehouse.door import QUEUE_WAIT_S, SqlDoor, open_door
from services.warehouse.memory_budget import cgroup_memory_limit, query_memory_bytes, size_text

MAX_REPLY_ROWS = 10_000
MAX_REPLY_BYTES = 768 * 1024
_json = msgspec.json.Encoder()
log = get_logger("chamber.recorder")
WAREHOUSE_BACKOFF = Backoff(first_s=0.5, max_s=30.0)  # a ClickHouse server still starting


class SqlRequest(msgspec.Struct):
    sql: str
    max_rows: int = MAX_REPLY_ROWS


def to_recorded(stream: str, deliveries: list[Delivery]) -> list[Recorded]:
    return [
        Recorded(
            event=d.envelope.event,
            id=d.envelope.id,
            source=d.envelope.source,
            time=d.envelope.time,
            stream=stream,
            subject=d.subject,
            stream_seq=d.stream_seq,
        )
        for d in deliveries
    ]


async def setup_recorder(
    ctx: ServiceContext,
    writer: Writer,
    *,
    batch_size: int = 2000,
    flush_interval: float = 1.0,
    ack_wait: float = 60.0,
    telemetry_consumers: int = 1,
    fetch_max_bytes: int = FETCH_MAX_BYTES,
    door: SqlDoor | None = None,
    holder: str | None = None,
    partition_ttl_s: float = 15.0,
    rollup_every_s: float = 5.0,
) -> None:
    """Consumers for every stream, and the `sql` command. TELEMETRY may get several pull consumers on
    the same durable, so one decodes and acks while another's batch is being inserted. Telemetry
    partition streams are shared out among the live recorders (`holder` names this one)."""

    async def store_samples(table: pa.Table, suspect: bool) -> None:
        await writer.store_tables({"gpu_samples": table}, suspect=suspect)

    rate = SubjectRate()  # one count per subject across every sample consumer (and partition)

    for spec in [TELEMETRY] * max(0, telemetry_consumers - 1) + list(STREAMS):

        async def store(deliveries: list[Delivery], stream: str = spec.name) -> None:
            # Delivered before: a predecessor may have stored it and died before acking.
            suspect = any(d.num_delivered > 1 for d in deliveries)
            await writer.store(to_recorded(stream, deliveries), suspect=suspect)

        options = ConsumerOptions(
            stream=spec.name,
            durable=DURABLE,
            batch=batch_size,
            fetch_timeout_s=flush_interval,
            ack_wait_s=ack_wait,
            max_retry_delay_s=10.0,
        )
        if spec is TELEMETRY:  # the hot stream: node samples take the bulk decode
            consumer = SampleConsumer(
                ctx.js,
                options,
                nc=ctx.nc,
                batch_handler=store,
                table_handler=store_samples,
                fetch_max_bytes=fetch_max_bytes,
                rate=rate,
            )
            ctx.consumers.append(consumer)
            ctx.task(partial(consumer.run, ctx.stop))
        else:
            ctx.consume(options, batch_handler=store)

    def partition_consumer(stream: str) -> SampleConsumer:  # a partition of samples: the bulk decode too
        async def store(deliveries: list[Delivery]) -> None:
            suspect = any(d.num_delivered > 1 for d in deliveries)
            await writer.store(to_recorded(stream, deliveries), suspect=suspect)

        options = ConsumerOptions(
            stream=stream,
            durable=DURABLE,
            batch=batch_size,
            fetch_timeout_s=flush_interval,
            ack_wait_s=ack_wait,
            max_retry_delay_s=10.0,
        )
        return SampleConsumer(
            ctx.js,
            options,
            nc=ctx.nc,
            batch_handler=store,
            table_handler=store_samples,
            fetch_max_bytes=fetch_max_bytes,
            rate=rate,
        )

    await own_partitions(ctx, partition_consumer, holder=holder, ttl_s=partition_ttl_s)

    if door is None:
        own = door = await asyncio.to_thread(open_door, writer.warehouse)

        async def close_door() -> None:
            await ctx.stop.wait()
            await asyncio.to_thread(own.close)

        ctx.task(close_door)
    sql_door = door

    async def sql(request: SqlRequest) -> dict[str, Any]:
        return await answer_sql(sql_door, request.sql, request.max_rows)

    ctx.command("sql", SqlRequest, sql)
    if writer.rollups is not None:
        ctx.task(lambda: rollup_rounds(writer, ctx.stop, rollup_every_s))


async def rollup_rounds(writer: Writer, stop: asyncio.Event, every_s: float) -> None:
    """Recompute the noted minutes every `every_s` (the first round at start: what a predecessor
    noted and did not recompute), once more on the way out. A failed round is retried next time:
    the minutes stay noted."""
    while True:
        try:
            await writer.rollup_round()
        except WarehouseError as exc:
            log.warning("minute rollup round failed, retrying", error=str(exc))
        if stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def answer_sql(door: SqlDoor, sql: str, max_rows: int = MAX_REPLY_ROWS) -> dict[str, Any]:
    """One query through the analytics door; a refusal or an engine error is a CommandRefused."""
    try:
        answer = await door.answer(sql, max_rows)
    except ReadOnlyViolation as exc:
        raise CommandRefused(str(exc), field="sql") from None
    except WarehouseError as exc:
        raise CommandRefused(str(exc), field="sql") from None
    rows = answer.rows
    # A reply must fit in one NATS message (1 MiB by default): keep the first rows that fit.
    while rows and len(_json.encode(rows)) > MAX_REPLY_BYTES:
        rows = rows[: len(rows) // 2]
    truncated = answer.truncated or len(rows) < len(answer.rows)
    return {"columns": answer.columns, "types": answer.types, "rows": rows, "truncated": truncated}


def open_and_migrate(args: argparse.Namespace) -> Warehouse:
    warehouse = open_from_args(args)
    applied = migrate(warehouse)
    raw_days = getattr(args, "raw_ttl_days", RAW_TTL_DAYS)
    rollup_days = getattr(args, "rollup_ttl_days", ROLLUP_TTL_DAYS)
    retention = apply_retention(warehouse, raw_days=raw_days, rollup_days=rollup_days)
    log.info("warehouse ready", backend=warehouse.kind, migrations_applied=applied, retention_changed=retention)
    return warehouse


def _crash_hook() -> Any:
    """CHAMBER_RECORDER_CRASH_AFTER_INSERT=TABLE: die (like kill -9) right after inserting into TABLE,
    before the ack. Only the crash-recovery test sets it."""
    table = os.environ.get("CHAMBER_RECORDER_CRASH_AFTER_INSERT")
    if not table:
        return None

    def hook(name: str) -> None:
        if name == table:
            os._exit(137)

    return hook


async def open_when_ready(args: argparse.Namespace, stop: asyncio.Event) -> Warehouse | None:
    """A held chDB directory is a mistake to report at once; a server that is not up yet (pods start in
    any order) is waited for, with back-off, until it answers or the service is stopped."""
    delay = 0.0
    while not stop.is_set():
        try:
            return await asyncio.to_thread(open_and_migrate, args)
        except WarehouseUnavailable as exc:
            if not args.clickhouse_url:
                raise UsageError(str(exc)) from None
            delay = WAREHOUSE_BACKOFF.next(delay)
            log.warning("warehouse unavailable, retrying", error=str(exc), delay_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
    return None


def fetch_max_bytes(args: argparse.Namespace) -> int:
    value = int(args.fetch_max_mb * 2**20)
    if value < MIN_FETCH_MAX_BYTES:
        raise UsageError(
            f"--fetch-max-mb {args.fetch_max_mb:g} is below the largest message a stream takes; "
            f"use at least {MIN_FETCH_MAX_BYTES / 2**20:.2f}"
        )
    return value


def analytics_limits(args: argparse.Namespace, embedded: bool) -> Limits:
    """The door's limits: `--sql-threads`, and a memory budget per query (`--sql-memory-mib`, else,
    where the queries run in this process (chDB), memory_budget.py's share of its container's limit;
    a ClickHouse server's own limits cap its queries)."""
    container = cgroup_memory_limit() if embedded else None
    per_query = args.sql_memory_mib * 2**20 or query_memory_bytes(container, args.sql_slots)
    log.info(
        "analytics limits",
        query_memory=size_text(per_query),
        container_memory_limit=size_text(container) if container else "none",
        slots=args.sql_slots,
    )
    return Limits(max_threads=max(0, args.sql_threads), max_memory_bytes=per_query)


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    max_bytes = fetch_max_bytes(args)  # a mistake in the options is reported before anything starts
    for name in ("raw_ttl_days", "rollup_ttl_days"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1 (days)")
    if not args.rollup_every > 0:
        raise UsageError(f"--rollup-every must be a positive number of seconds, not {args.rollup_every:g}")
    warehouse = await open_when_ready(args, stop)
    if warehouse is None:
        return
    if stop.is_set():  # stopped while the warehouse opened (seconds on a loaded machine): start nothing
        warehouse.close()
        return
    for name in ("sql_slots", "sql_queue", "sql_memory_mib"):
        least = 1 if name == "sql_slots" else 0
        if getattr(args, name) < least:
            raise UsageError(f"--{name.replace('_', '-')} must be at least {least}")
    limits = analytics_limits(args, embedded=not args.clickhouse_url)
    writer = Writer(warehouse, after_insert=_crash_hook(), deferred_rollups=True)
    sql_url = args.clickhouse_sql_url if args.clickhouse_url else None
    door = await asyncio.to_thread(
        open_door,
        warehouse,
        sql_url=sql_url,
        slots=args.sql_slots,
        queue_limit=args.sql_queue,
        queue_wait_s=QUEUE_WAIT_S,
        limits=limits,
    )
    try:

        async def setup(ctx: ServiceContext) -> None:
            await setup_recorder(
                ctx,
                writer,
                batch_size=args.batch_size,
                flush_interval=args.flush_interval,
                ack_wait=args.ack_wait,
                telemetry_consumers=args.telemetry_consumers,
                fetch_max_bytes=max_bytes,
                door=door,
                partition_ttl_s=args.partition_lease_ttl,
                rollup_every_s=args.rollup_every,
            )

        await serve(NAME, args.nats, setup, stop)
    finally:
        door.close()
        writer.close()
        warehouse.close()
