"""Connect to NATS: retry the first connection with back-off, then let nats-py reconnect forever.

`--nats` / $CHAMBER_NATS_URL may name several servers separated by commas (the NATS convention,
`nats://a:4222,nats://b:4222`); the client tries them all and, once connected, also learns the
rest of the cluster from the server, so a process survives the loss of the one it first reached."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import nats
from nats.aio.client import Client

from services.runtime.backoff import Backoff
from services.runtime.credentials import CredentialsError, inbox_prefix, login, user_of
from services.runtime.logs import get_logger

log = get_logger("chamber.runtime.connection")


def server_urls(url: str | list[str]) -> list[str]:
    """One URL, a comma-separated list, or a list: the servers to try, in order."""
    items = [url] if isinstance(url, str) else list(url)
    servers = [part.strip() for item in items for part in item.split(",") if part.strip()]
    if not servers:
        raise ValueError("no NATS server given")
    return servers


async def connect(
    url: str | list[str],
    *,
    name: str,
    attempts: int = 10,
    first_delay_s: float = 0.2,
    max_delay_s: float = 5.0,
    user_credentials: str | None = None,
    credentials: dict[str, str] | None = None,
    deadline_s: float | None = None,
) -> Client:
    """A connected client. A server that is down at start is retried `attempts` times.

    With `deadline_s` (the CLI's choice) the first connection gives up after that many seconds with
    TimeoutError: nats-py alone, told to reconnect forever, would retry an unreachable server forever.
    """
    servers = server_urls(url)
    if credentials is None:
        credentials = login(servers)  # this process's NATS user, password read from its file
    user = user_of(servers, credentials)
    inbox: dict[str, Any] = {"inbox_prefix": inbox_prefix(user)} if user else {}  # its role's only inbox
    if deadline_s is not None:
        return await asyncio.wait_for(
            _connect_once(servers, name=name, user_credentials=user_credentials, credentials=credentials, **inbox),
            timeout=deadline_s,
        )
    backoff = Backoff(first_s=first_delay_s, max_s=max_delay_s)
    made: list[Client] = []

    async def on_disconnect() -> None:
        if made and made[0].is_closed:  # our own close (a stop) calls back too: nothing went wrong
            return
        _disconnected()

    for attempt in range(1, attempts + 1):
        try:
            made[:] = [
                await _refused_login_fails_fast(
                    credentials,
                    servers=servers,
                    name=name,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,  # a service outlives server restarts
                    reconnect_time_wait=0.5,
                    connect_timeout=2,
                    user_credentials=user_credentials,
                    **credentials,
                    **inbox,
                    disconnected_cb=on_disconnect,
                    reconnected_cb=_on_reconnect,
                )
            ]
            return made[0]
        except (OSError, nats.errors.NoServersError, TimeoutError) as exc:
            if attempt == attempts:
                raise
            log.warning("nats connect failed, retrying", url=servers, attempt=attempt, error=str(exc))
            await asyncio.sleep(backoff.for_attempt(attempt))
    raise AssertionError("unreachable")


async def _connect_once(
    url: str | list[str], *, name: str, user_credentials: str | None, credentials: dict[str, str], **inbox: Any
) -> Client:
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
            **credentials,
            **inbox,
        )
    except Exception as exc:
        if any("authorization violation" in str(e).lower() for e in [*errors, exc]):
            who = f"user {credentials['user']!r}" if credentials else "an anonymous client"
            raise CredentialsError(_refused_message(servers_of(url), who)) from None
        if not isinstance(exc, nats.errors.NoServersError):
            raise
        if errors:
            raise ConnectionError(str(errors[-1]) or type(errors[-1]).__name__) from None
        raise


async def _refused_login_fails_fast(credentials: dict[str, str], *, servers: list[str], **options: Any) -> Client:
    """nats.connect, except that a server refusing the login is an error at once: nats-py would
    retry a refused password forever."""
    refused = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        if "authorization violation" in str(exc).lower():
            refused.set()
        await _on_error(exc)

    connecting = asyncio.ensure_future(nats.connect(servers=servers, error_cb=on_error, **options))
    waiting = asyncio.ensure_future(refused.wait())
    await asyncio.wait({connecting, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if connecting.done():
        return connecting.result()
    connecting.cancel()
    with contextlib.suppress(BaseException):
        await connecting
    who = f"user {credentials['user']!r}" if credentials else "an anonymous client"
    raise CredentialsError(_refused_message(servers, who))


def servers_of(url: str | list[str]) -> list[str]:
    return [url] if isinstance(url, str) else url


def _refused_message(servers: list[str], who: str) -> str:
    return (
        f"NATS at {', '.join(servers)} refused {who}. The bus of `chamber up` asks each client for its password: "
        "run the CLI where its data directory is (.chamber) or set CHAMBER_DATA_DIR to it; for another server put "
        "user:password in the URL (--nats / CHAMBER_NATS_URL)"
    )


class Throttled:
    """The same warning at most once per `every_s` (a dead bus makes nats-py call back twice a second),
    with how many were left out since."""

    def __init__(
        self, event: str, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic, logger: Any = None
    ) -> None:
        self.event, self.every_s, self.clock = event, every_s, clock
        self.log = logger or log
        self.last = -float("inf")
        self.left_out = 0
        self.logged = 0

    def __call__(self, **fields: Any) -> None:
        now = self.clock()
        if now - self.last < self.every_s:
            self.left_out += 1
            return
        self.log.warning(self.event, left_out=self.left_out, every_s=self.every_s, **fields)
        self.last, self.left_out = now, 0
        self.logged += 1


_error = Throttled("nats error")
_disconnected = Throttled("nats disconnected")


async def _on_error(exc: Exception) -> None:
    _error(error=repr(exc))


async def _on_reconnect() -> None:
    log.info("nats reconnected")
