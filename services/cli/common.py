"""What every CLI command shares: the --nats option, and turning NATS trouble into a clear message."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from services.cli.errors import UsageError
from services.runtime.options import DEFAULT_CLUSTER, add_cluster_option  # noqa: F401 (re-exported for the CLI)

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
CONNECT_DEADLINE_S = 2.0  # the first connection fails within this, naming the URL (never hangs)
T = TypeVar("T")


def finite_float(text: str) -> float:
    """An argparse type: a number, refusing NaN and infinity (`--budget nan` would remove a budget)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


UP_URL_FILE = "nats-url"  # in the data directory: the NATS URL of the `chamber up` that made it


def default_nats_url() -> str:
    """$CHAMBER_NATS_URL; else the URL `chamber up` wrote into the data directory (so `make up
    NATS_PORT=4223` needs nothing more in the next terminal); else the default port."""
    if os.environ.get("CHAMBER_NATS_URL"):
        return os.environ["CHAMBER_NATS_URL"]
    try:
        written = (Path(os.environ.get("CHAMBER_DATA_DIR", ".chamber")) / UP_URL_FILE).read_text().strip()
    except OSError:
        written = ""
    return written or DEFAULT_NATS_URL


def add_nats_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nats",
        metavar="URL",
        default=default_nats_url(),
        help="NATS server, or several separated by commas (default: $CHAMBER_NATS_URL, else the URL of the "
        f"`chamber up` whose data directory is $CHAMBER_DATA_DIR or .chamber, else {DEFAULT_NATS_URL})",
    )


def add_replicas_option(parser: argparse.ArgumentParser) -> None:
    """`--replicas N`: copies of each stream and KV bucket (processes that create them)."""
    parser.add_argument(
        "--replicas",
        metavar="N",
        help="stream and KV replicas (default: $CHAMBER_NATS_REPLICAS, else 3 on a JetStream cluster "
        "of 3 or more servers, else 1); never lowers a stream an operator raised",
    )


def add_partitions_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--telemetry-partitions",
        metavar="N",
        help="node-sample partition streams (default: $CHAMBER_TELEMETRY_PARTITIONS, else 1); the NATS "
        "server must map chamber.telemetry.sample.*.* with the same N (the chart and `chamber up` do)",
    )


def apply_partitions_option(args: argparse.Namespace) -> int:
    """Validate `--telemetry-partitions` and pass it on through the environment; returns the count."""
    from services.runtime.partitions import ENV, configured_partitions, parse_partitions

    if getattr(args, "telemetry_partitions", None) is not None:
        os.environ[ENV] = str(parse_partitions(args.telemetry_partitions))
    return configured_partitions()


def apply_replicas_option(args: argparse.Namespace) -> None:
    """Validate `--replicas` and hand it to the runtime through the environment (as the chart does),
    so child processes and every stream/KV creation see the same number."""
    from services.runtime.replicas import ENV, parse_replicas, requested_replicas

    if getattr(args, "replicas", None) is not None:
        os.environ[ENV] = str(parse_replicas(args.replicas))
    else:
        requested_replicas()  # a bad $CHAMBER_NATS_REPLICAS is refused here, before connecting


def with_nats(args: argparse.Namespace, body: Callable[[Any], Awaitable[T]], *, name: str = "chamber-cli") -> T:
    """Connect (failing fast with a clear message), run `body(nc)`, close."""

    async def main() -> T:
        from services.runtime import connect
        from services.runtime.credentials import CredentialsError

        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            # the CLI's own span is worth its import time (~0.2 s) only when it is exported; without
            # it the service starts the command's trace, which its events then continue
            from services.runtime.tracing import configure_tracing

            configure_tracing("cli")

        try:
            nc = await connect(args.nats, name=name, deadline_s=CONNECT_DEADLINE_S)
        except CredentialsError as exc:
            raise UsageError(str(exc)) from None
        except Exception as exc:
            why = "no answer within 2 s" if isinstance(exc, TimeoutError) else (str(exc) or type(exc).__name__)
            raise UsageError(
                f"cannot reach NATS at {args.nats} ({why}); start Chamber with `chamber up`, "
                "or point --nats URL or CHAMBER_NATS_URL at a running server"
            ) from None
        try:
            return await body(nc)
        finally:
            await nc.close()

    return asyncio.run(main())


def add_node_verb(
    verbs: argparse._SubParsersAction[argparse.ArgumentParser],
    verb: str,
    func: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """A verb acting on one node (`chamber mig abandon NODE`, `chamber fleet forget NODE`): NODE, a
    reason recorded with the event, --cluster and --nats."""
    parser = verbs.add_parser(verb, help=help, description=description)
    parser.add_argument("node", metavar="NODE")
    parser.add_argument("--reason", default="", help="recorded with the event")
    add_cluster_option(parser)
    add_nats_option(parser)
    parser.set_defaults(func=func)
    return parser


def node_payload(args: argparse.Namespace, node: str | None = None, cluster: str | None = None) -> dict[str, Any]:
    """A node verb's request: the node, its cluster (`args`' unless given), who asks (the user running
    the CLI) and why."""
    import getpass

    return {
        "node": args.node if node is None else node,
        "cluster": args.cluster if cluster is None else cluster,
        "by": getpass.getuser(),
        "reason": args.reason,
    }


def not_running(exc: Exception, service: str) -> UsageError:
    """A command's service is not answering: say how to start it."""
    return UsageError(f"{exc}; start it with `chamber up` or `chamber service {service}`")


async def request_patiently(
    nc: Any, service: str, verb: str, payload: Any, *, timeout: float = 5.0, patience_s: float = 0.0
) -> Any:
    """`request`, asked again every half second for up to `patience_s` while the service answers that
    it is catching up (a refusal of kind catching_up: what the user just saw is not folded there
    yet, e.g. a node `chamber fleet` shows LOST that the discovery is still announcing so)."""
    from services.runtime.commands import CommandRefused, request

    deadline = time.monotonic() + patience_s
    while True:
        try:
            return await request(nc, service, verb, payload, timeout=timeout)
        except CommandRefused as exc:
            if exc.kind != "catching_up" or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(0.5)


def send_command(
    args: argparse.Namespace, service: str, verb: str, payload: Any, *, timeout: float = 5.0, patience_s: float = 0.0
) -> Any:
    """Send one command (asked again while the service is catching up, for up to `patience_s`); a
    refusal or a missing service becomes a UsageError (no traceback)."""
    from services.runtime.commands import CommandRefused, CommandUnavailable

    async def body(nc: Any) -> Any:
        try:
            return await request_patiently(nc, service, verb, payload, timeout=timeout, patience_s=patience_s)
        except CommandRefused as exc:
            hint = f" (field: {exc.field})" if exc.field else ""
            raise UsageError(f"{exc}{hint}") from None
        except CommandUnavailable as exc:
            raise not_running(exc, service) from None

    return with_nats(args, body)
