"""Connect to NATS: retry the first connection with back-off, then let nats-py reconnect forever."""

from __future__ import annotations

import asyncio

import nats
from nats.aio.client import Client

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
    deadline_s: float | None = None,
) -> Client:
    """A connected client. A server that is down at start is retried `attempts` times.

    With `deadline_s` (the CLI's choice) the first connection gives up after that many seconds with
    TimeoutError: nats-py alone, told to reconnect forever, would retry an unreachable server forever.
    """
    if deadline_s is not None:
        return await asyncio.wait_for(
            _connect_once(url, name=name, user_credentials=user_credentials), timeout=deadline_s
        )
    servers = [url] if isinstance(url, str) else url
    delay = first_delay_s
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
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay_s)
    raise AssertionError("unreachable")


async def _connect_once(url: str | list[str], *, name: str, user_credentials: str | None) -> Client:
    """Two tries at every server, no reconnects: for short-lived clients (the CLI). The error raised
    says what went wrong with the last try (refused, unknown host...)."""
    errors: list[Exception] = []

    async def remember(exc: Exception) -> None:  # the caller reports the failure once
        errors.append(exc)

    try:
        return await nats.connect(
            servers=[url] if isinstance(url, str) else url,
            name=name,
            allow_reconnect=False,
            max_reconnect_attempts=1,  # nats-py counts tries per server even when not reconnecting
            reconnect_time_wait=0.2,
            connect_timeout=2,
            user_credentials=user_credentials,
            error_cb=remember,
        )
    except nats.errors.NoServersError:
        if errors:
            raise ConnectionError(str(errors[-1]) or type(errors[-1]).__name__) from None
        raise


async def _on_error(exc: Exception) -> None:
    log.warning("nats error", error=repr(exc))


async def _on_disconnect() -> None:
    log.warning("nats disconnected")


async def _on_reconnect() -> None:
    log.info("nats reconnected")
