"""`chamber service gateway`: fold every stream into the read model and serve it over HTTP.

Each stream is read by an ephemeral consumer from its start (FLEET, JOBS, QUOTA, BILLING and FAULTS
are the domain history), except TELEMETRY, of which only each node's latest sample and inventory
matter to a live view. The HTTP server, the consumers and the efficiency ticker share one event
loop, so a request always sees a state between two whole events.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from aiohttp import web
from nats.js.api import ConsumerConfig, DeliverPolicy

from events.streams import BILLING, FAULTS, FLEET, JOBS, QUOTA, TELEMETRY
from services.cli.errors import UsageError
from services.gateway.api import GatewayContext, make_app
from services.gateway.core import GatewayState, evolve, record_point, scheduler_said
from services.gateway.history import WarehouseHistory
from services.runtime import Consumer, ConsumerOptions, Delivery
from services.runtime.commands import CommandRefused, CommandUnavailable, request
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import get_logger
from services.runtime.partitions import telemetry_inputs

NAME = "gateway"
DESCRIPTION = "HTTP API, dashboard and Prometheus /metrics (default http://127.0.0.1:8080)"
DEFAULT_PORT = 8080
log = get_logger("chamber.gateway")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=os.environ.get("CHAMBER_GATEWAY_HOST", "127.0.0.1"), help="bind address")
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("CHAMBER_GATEWAY_PORT", DEFAULT_PORT)), help="HTTP port"
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("CHAMBER_API_TOKEN"),
        help="bearer token for commands (default: $CHAMBER_API_TOKEN, which keeps it out of `ps`, else the file "
        "$CHAMBER_API_TOKEN_FILE names; without one, commands answer 401)",
    )
    parser.add_argument(
        "--protect-reads",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("CHAMBER_API_PROTECT_READS", "").lower() in ("1", "true", "yes"),
        help="reads under /api/ and /metrics need the bearer token too (default: $CHAMBER_API_PROTECT_READS, "
        "off; the Helm chart turns it on)",
    )
    parser.add_argument("--history-interval", type=float, default=5.0, help="seconds between efficiency points")
    parser.add_argument("--stream-interval", type=float, default=2.0, help="seconds between dashboard pushes")
    parser.add_argument(
        "--reasons-interval", type=float, default=2.0, help="seconds between asking the scheduler why jobs wait"
    )
    parser.add_argument("--command-timeout", type=float, default=5.0, help="seconds to wait for a command's answer")
    parser.add_argument(
        "--no-warehouse-history",
        action="store_true",
        help="serve only the live series (by default history comes from the recorder's warehouse, when it answers)",
    )


class LatestPerSubject(Consumer):
    """A consumer that starts from the last message of every subject (one per node for telemetry)."""

    def _config(self) -> ConsumerConfig:
        config = super()._config()
        config.deliver_policy = DeliverPolicy.LAST_PER_SUBJECT
        return config


def consume_all(
    ctx: ServiceContext, state: GatewayState, telemetry: list[tuple[str, str]] | None = None
) -> list[Consumer]:
    """`telemetry`: (stream, filter) of TELEMETRY and its partitions (`telemetry_inputs`)."""
    if telemetry is None:
        telemetry = [(TELEMETRY.name, TELEMETRY.subjects[0])]

    async def fold(batch: list[Delivery]) -> None:
        for delivery in batch:
            evolve(state, delivery.envelope.event)

    consumers = [
        ctx.consume(ConsumerOptions(stream=spec.name, durable=None), batch_handler=fold)
        for spec in (FLEET, JOBS, QUOTA, BILLING, FAULTS)
    ]
    # the server needs a filter subject to deliver the last message per subject; every partition
    latest = []
    for stream, subject in telemetry:
        options = ConsumerOptions(stream=stream, durable=None, filter_subjects=(subject,))
        consumer = LatestPerSubject(ctx.js, options, batch_handler=fold)
        ctx.consumers.append(consumer)
        ctx.task(lambda consumer=consumer: consumer.run(ctx.stop))  # type: ignore[misc]
        latest.append(consumer)
    return [*consumers, *latest]


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    state = GatewayState()

    async def setup(ctx: ServiceContext) -> None:
        consumers = consume_all(ctx, state, await telemetry_inputs(ctx.js))

        async def forward(service: str, verb: str, payload: dict[str, Any]) -> Any:
            return await request(ctx.nc, service, verb, payload, timeout=args.command_timeout)

        def ready() -> dict[str, Any]:
            return {
                "nats_connected": ctx.nc.is_connected,
                "pid": os.getpid(),  # `chamber up` checks that the gateway answering is the one it started
                "streams": {c.options.stream: c.stats.last_acked_seq for c in consumers},
            }

        first_tick = True

        async def tick(now: float) -> None:
            # the first tick comes while the streams are still replaying: a point then would be a
            # half-built fleet, drawn as a dip to zero
            nonlocal first_tick
            if first_tick or state.events_seen == 0:
                first_tick = False
                return
            record_point(state, now)

        gateway = GatewayContext(
            state=state,
            forward=forward,
            token=args.token or token_from_file(os.environ.get("CHAMBER_API_TOKEN_FILE")),
            stop=stop,
            stream_interval_s=args.stream_interval,
            ready=ready,
            protect_reads=args.protect_reads,
            history=None if args.no_warehouse_history else WarehouseHistory(forward).get,
        )

        async def ask_scheduler(now: float) -> None:
            """The scheduler's reasons for waiting jobs, for the dashboard and /api/queue (finding 9)."""
            if not any(j.state.queued for j in state.jobs.values()):
                state.waiting_reasons = {}
                return
            try:
                answer = await request(ctx.nc, "scheduler", "queue", {"limit": 2000}, timeout=args.command_timeout)
            except (CommandRefused, CommandUnavailable):
                return  # keep the last answer; the fleet-based guess covers jobs it did not name
            scheduler_said(state, answer.get("jobs", []))

        ctx.every(args.history_interval, tick)
        ctx.every(args.reasons_interval, ask_scheduler)
        ctx.task(lambda: serve_http(make_app(gateway), args.host, args.port, stop))
        if not gateway.token:
            log.warning("no API token: commands will answer 401; set --token or CHAMBER_API_TOKEN")

    await serve(NAME, args.nats, setup, stop)


def token_from_file(path: str | None) -> str | None:
    """$CHAMBER_API_TOKEN_FILE: the token in a file (what `chamber up` passes, so the secret itself is
    not in the environment of every process)."""
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as exc:
        raise UsageError(f"CHAMBER_API_TOKEN_FILE={path}: {exc.strerror}") from None


async def serve_http(app: web.Application, host: str, port: int, stop: asyncio.Event) -> None:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("gateway listening", url=f"http://{host}:{port}/")
        await stop.wait()
    finally:
        await runner.cleanup()
