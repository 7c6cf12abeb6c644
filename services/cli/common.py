"""What every CLI command shares: the --nats option, and turning NATS trouble into a clear message."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from services.cli.errors import UsageError
from services.runtime.options import DEFAULT_CLUSTER, add_cluster_option  # noqa: F401 (re-exported for the CLI)

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
T = TypeVar("T")


def add_nats_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nats",
        metavar="URL",
        default=os.environ.get("CHAMBER_NATS_URL", DEFAULT_NATS_URL),
        help=f"NATS server (default: $CHAMBER_NATS_URL or {DEFAULT_NATS_URL})",
    )


def with_nats(args: argparse.Namespace, body: Callable[[Any], Awaitable[T]], *, name: str = "chamber-cli") -> T:
    """Connect (failing fast with a clear message), run `body(nc)`, close."""

    async def main() -> T:
        from services.runtime import connect

        try:
            nc = await connect(args.nats, name=name, attempts=2, first_delay_s=0.2)
        except Exception as exc:
            raise UsageError(
                f"cannot reach NATS at {args.nats} ({type(exc).__name__}); start it with `chamber up` "
                "or point --nats / CHAMBER_NATS_URL at a running server"
            ) from None
        try:
            return await body(nc)
        finally:
            await nc.close()

    return asyncio.run(main())


def send_command(args: argparse.Namespace, service: str, verb: str, payload: Any, *, timeout: float = 5.0) -> Any:
    """Send one command; a refusal or a missing service becomes a UsageError (no traceback)."""
    from services.runtime.commands import CommandRefused, CommandUnavailable, request

    async def body(nc: Any) -> Any:
        try:
            return await request(nc, service, verb, payload, timeout=timeout)
        except CommandRefused as exc:
            hint = f" (field: {exc.field})" if exc.field else ""
            raise UsageError(f"{exc}{hint}") from None
        except CommandUnavailable as exc:
            raise UsageError(f"{exc}; start it with `chamber up` or `chamber service {service}`") from None

    return with_nats(args, body)
