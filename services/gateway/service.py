"""`chamber service gateway`: fold every stream into the read model and serve it over HTTP.

The read model is a decider without decisions on the decider host: FLEET, JOBS, QUOTA, BILLING and
FAULTS from their start (the domain history), TELEMETRY from each node's latest sample and inventory
(all a live view needs), folded in the host's one order. The HTTP server, the fold loop and the
efficiency ticker share one event loop, so a request always sees a state between two whole events.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from aiohttp import web

from events.streams import BILLING, FAULTS, FLEET, JOBS, QUOTA, TELEMETRY
from services.errors import UsageError
from services.gateway.api import GatewayContext, make_app
from services.gateway.core import GatewayState, evolve, record_point, scheduler_said
from services.gateway.history import WarehouseHistory
from services.runtime.commands import CommandRefused, CommandUnavailable, request
from services.runtime.decider import Decider, DeciderHost, Input, SnapshotCodec
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import get_logger
from services.runtime.partitions import telemetry_inputs
from services.runtime.state_codec import facts_codec

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


def read_model(state: GatewayState, telemetry: list[tuple[str, str]] | None = None) -> Decider[GatewayState]:
    """The gateway's view as a decider without decisions: every stream folded in the host's one
    order, telemetry from the last sample of every node (the server needs a filter subject for that)."""
    inputs = [Input(spec.name) for spec in (FLEET, JOBS, QUOTA, BILLING, FAULTS)]
    # `telemetry`: (stream, filter) of TELEMETRY and each of its partitions (`telemetry_inputs`)
    for stream, subject in telemetry or [(TELEMETRY.name, TELEMETRY.subjects[0])]:
        inputs.append(Input(stream, (subject,), deliver="last_per_subject"))
    return Decider(
        name=NAME, inputs=tuple(inputs), initial=lambda: state, evolve=evolve, snapshot=snapshot_codec(state)
    )


def snapshot_codec(state: GatewayState) -> SnapshotCodec[GatewayState]:
    """Snapshots of the read model, restored INTO `state`: the HTTP handlers hold that object."""
    from services.gateway import core

    # the scheduler's reasons and queue order are its answers, asked again every few seconds: not facts
    codec = facts_codec(GatewayState, version=core.STATE_VERSION, caches=("waiting_reasons", "queue_positions"))

    def restore(data: bytes) -> GatewayState:
        restored = codec.decode(data)
        state.__dict__.update(restored.__dict__)
        return state

    return SnapshotCodec(format=codec.format, encode=codec.encode, decode=restore)


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    state = GatewayState()

    async def setup(ctx: ServiceContext) -> None:
        host = DeciderHost(read_model(state, await telemetry_inputs(ctx.js)), ctx)
        host.install()

        async def forward(service: str, verb: str, payload: dict[str, Any]) -> Any:
            return await request(ctx.nc, service, verb, payload, timeout=args.command_timeout)

        def ready() -> dict[str, Any]:
            return {
                "nats_connected": ctx.nc.is_connected,
                "pid": os.getpid(),  # `chamber up` checks that the gateway answering is the one it started
                "streams": dict(host.positions),
            }

        async def tick(now: float) -> None:
            # while the streams are still replaying, a point would be a half-built fleet, drawn as a
            # dip to zero
            if host.ready and state.events_seen:
                record_point(state, now)

        gateway = GatewayContext(
            state=state,
            forward=forward,
            token=args.token or token_from_file(os.environ.get("CHAMBER_API_TOKEN_FILE")),
            stop=stop,
            stream_interval_s=args.stream_interval,
            ready=ready,
            replaying=host.replaying,
            protect_reads=args.protect_reads,
            history=None if args.no_warehouse_history else WarehouseHistory(forward).get,
        )

        async def ask_scheduler(now: float) -> None:
            """The scheduler's reasons for waiting jobs, for the dashboard and /api/queue (finding 9)."""
            if not any(j.state.queued for j in state.jobs.values()):
                state.waiting_reasons = {}
                state.queue_positions = {}
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
