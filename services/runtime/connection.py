"""Connect to NATS: retry the first connection with back-off, then let nats-py reconnect forever."""

from __future__ import annotations

import asyncio

import nats
from nats.aio.client import Client

from services.runtime.backoff import Backoff
from services.runtime.logs import get_logger

log = get_logger("chamber.runtime.connection")


async def connect(
    url: str | list[str],
    *,
    name: str,
    attempts: int = 10,
    first_delay_s: float = 0.2,
    max_delay_s: float = 5.0,
    user_credentials: str | None = None,
) -> Client:
    """A connected client. A server that is down at start is retried `attempts` times."""
    servers = [url] if isinstance(url, str) else url
    backoff = Backoff(first_s=first_delay_s, max_s=max_delay_s)
    for attempt in range(1, attempts + 1):
        try:
            return await nats.connect(
                servers=servers,
                name=name,
                allow_reconnect=True,
                max_reconnect_attempts=-1,  # a service outlives server restarts
                reconnect_time_wait=0.5,
                connect_timeout=2,
                user_credentials=user_credentials,
                error_cb=_on_error,
                disconnected_cb=_on_disconnect,
                reconnected_cb=_on_reconnect,
            )
        except (OSError, nats.errors.NoServersError, TimeoutError) as exc:
            if attempt == attempts:
                raise
            log.warning("nats connect failed, retrying", url=servers, attempt=attempt, error=str(exc))
            await asyncio.sleep(backoff.for_attempt(attempt))
    raise AssertionError("unreachable")


async def _on_error(exc: Exception) -> None:
    log.warning("nats error", error=repr(exc))


async def _on_disconnect() -> None:
    log.warning("nats disconnected")


async def _on_reconnect() -> None:
    log.info("nats reconnected")
