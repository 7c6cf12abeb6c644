"""Host one service process: connect, find the streams, run its consumers, tickers and commands until
stopped, then finish the batch in hand and drain. Services describe themselves in `setup`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio.lowlevel
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from events.streams import StreamSpec
from services.runtime.backoff import Backoff
from services.runtime.commands import CommandServer
from services.runtime.connection import Throttled, connect
from services.runtime.consumer import BatchHandler, Consumer, ConsumerOptions, Handler
from services.runtime.health import HealthServer, HealthState, port_from_env
from services.runtime.logs import get_logger
from services.runtime.publisher import Publisher
from services.runtime.streams import check_own_streams, ensure_streams
from services.runtime.tracing import configure_tracing

log = get_logger("chamber.runtime.host")
T = TypeVar("T")


@dataclass
class ServiceContext:
    name: str
    url: str
    nc: Client
    js: JetStreamContext
    publisher: Publisher
    stop: asyncio.Event
    consumers: list[Consumer] = field(default_factory=list)
    _tasks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    _commands: CommandServer | None = None
    health: HealthServer | None = None
    health_state: HealthState | None = None  # what /readyz and /metrics report (a decider host adds to it)

    def consume(
        self,
        options: ConsumerOptions,
        *,
        handler: Handler | None = None,
        batch_handler: BatchHandler | None = None,
    ) -> Consumer:
        # One pull request per batch (runtime/pull.py) for every service's consumers.
        consumer = Consumer(self.js, options, handler=handler, batch_handler=batch_handler, nc=self.nc)
        self.consumers.append(consumer)
        self._tasks.append(lambda: consumer.run(self.stop))
        return consumer

    def every(self, seconds: float, tick: Callable[[float], Awaitable[None]]) -> None:
        """Call `tick(now)` every `seconds` (wall clock, read here in the shell) until stopped."""

        tick_failed = Throttled("tick failed", logger=log)

        async def loop() -> None:
            while not self.stop.is_set():
                try:
                    await tick(time.time())
                except Exception as exc:  # with the bus down every tick fails: one line per 30 s
                    tick_failed(service=self.name, error=repr(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=seconds)

        self._tasks.append(loop)

    def command(self, verb: str, request_type: type[T], handler: Callable[[T], Awaitable[Any]]) -> None:
        if self._commands is None:
            self._commands = CommandServer(self.url, self.name, nc=self.nc)  # on the service's own connection
        self._commands.register(verb, request_type, handler)

    def task(self, run: Callable[[], Awaitable[None]]) -> None:
        """Any other long-running coroutine; it should return when `stop` is set."""
        self._tasks.append(run)


async def _check_streams(js: JetStreamContext, specs: tuple[StreamSpec, ...] | None) -> None:
    await (ensure_streams(js, update=False) if specs is None else check_own_streams(js, specs))


async def serve(
    name: str,
    url: str,
    setup: Callable[[ServiceContext], Awaitable[object]],  # what it returns (a service's shell) is not used
    stop: asyncio.Event,
    *,
    health_port: int | None = None,
    streams: tuple[StreamSpec, ...] | None = None,
) -> ServiceContext:
    """`health_port` (default $CHAMBER_HEALTH_PORT, 0 = any free port) serves /livez and /readyz.
    `streams`: the only streams the process checks at start (its role may read no other's info);
    None: every stream of the design."""
    configure_tracing(name)
    health_state = HealthState(service=name)
    port = health_port if health_port is not None else port_from_env()
    health = HealthServer(health_state, port=port) if port is not None else None
    if health is not None:
        await health.start()  # before connecting: live (not ready) while NATS is still out of reach
    try:
        nc = await connect(url, name=f"chamber-{name}")
    except BaseException:
        if health is not None:
            await health.stop()
        raise
    js = nc.jetstream()
    ctx = ServiceContext(name=name, url=url, nc=nc, js=js, publisher=Publisher(js, source=f"chamber/{name}"), stop=stop)
    ctx.health, ctx.health_state = health, health_state
    health_state.nc, health_state.consumers = nc, ctx.consumers
    try:
        # the set-up's job (services/runtime/setup.py); a missing stream is made only on a bus without roles
        await _with_retries(name, lambda: _check_streams(js, streams))
        await setup(ctx)
        if ctx._commands is not None:
            await ctx._commands.start()
            # FastStream's stop needs anyio's asyncio back-end, which anyio imports on first use: load
            # it now, as importing it while stopping took seconds on a loaded machine.
            await anyio.lowlevel.checkpoint()
        log.info("service running", service=name, consumers=len(ctx.consumers))
        await asyncio.gather(*(run() for run in ctx._tasks), stop.wait())
    finally:
        if health is not None:
            await health.stop()
        if ctx._commands is not None:
            await ctx._commands.stop()
        for consumer in ctx.consumers:  # a pull subscription left open makes drain wait its full timeout
            with contextlib.suppress(Exception):
                await consumer.unsubscribe()
        with contextlib.suppress(Exception):
            await nc.drain()
        log.info("service stopped", service=name)
    return ctx


async def _with_retries(service: str, step: Callable[[], Awaitable[T]], attempts: int = 8) -> T:
    """A JetStream API call at start that times out (a cluster still electing leaders, a loaded
    server) is tried again with back-off instead of ending the service."""
    backoff = Backoff(first_s=0.5, max_s=8.0)
    for attempt in range(1, attempts + 1):
        try:
            return await step()
        except nats.errors.TimeoutError as exc:
            if attempt == attempts:
                raise
            log.warning("jetstream set-up timed out, retrying", service=service, attempt=attempt, error=repr(exc))
            await asyncio.sleep(backoff.for_attempt(attempt))
    raise AssertionError("unreachable")
