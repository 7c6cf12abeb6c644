"""The consumer loop every service uses: durable pull consumer, batched fetch, decode, handle, ack.

Outcomes per message:
- handled           -> ack (only after the handler returned)
- unknown type      -> ack and skip (a newer producer; this consumer does not need it)
- bad input         -> copy to chamber.dead.<stream> with the reason, then terminate
- TransientError    -> retried in process with a growing delay until it succeeds; order is kept and
                       the held messages' ack timers are extended, so nothing is redelivered or lost
- handler crashed   -> retried `max_attempts` times, then dead-lettered as `handler_failed` with the
                       exception; a batch handler's failing batch is halved until the messages
                       that fail alone are found, and only those are dead-lettered
- redelivered often -> (the process died on it repeatedly) dead-lettered before handling
The loop never dies on one message.

Extension points (public; nothing private is overridden from outside): `ConsumerOptions` (batch,
byte bound, timeouts), the `fast_decode` hook (a cheaper decode for messages a service knows, the
standard one otherwise), `process` (a subclass may take part of a batch its own way and hand the
rest on), `attempt` (run a handler with the retry rules above) and `puller` (the batched pull).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from events.codec import DEFAULT_MAX_BYTES, DecodeError, Envelope, UnknownEventType, decode
from services.runtime.backoff import Backoff
from services.runtime.connection import Throttled
from services.runtime.dead_letter import dead_letter
from services.runtime.logs import get_logger
from services.runtime.pull import BatchPuller, Position, position
from services.runtime.tracing import consume_span, traced

log = get_logger("chamber.runtime.consumer")
_fetch_failed = Throttled("fetch failed", logger=log)  # a dead bus fails every fetch of every consumer
FETCH_BACKOFF = Backoff(first_s=0.2, max_s=5.0)  # the server is restarting or away


def ephemeral_name() -> str:
    """A name for an ephemeral consumer. Named, it is created on `$JS.API.CONSUMER.CREATE.<stream>.
    <name>`: the unnamed form (`...CREATE.<stream>`) also accepts a durable's name in its body and would
    change that durable, so no role may use it on the event streams (services/cli/nats_config.py)."""
    return f"eph-{secrets.token_hex(8)}"


class TransientError(Exception):
    """Raised by a handler when a dependency is unavailable: retry later, lose nothing."""


@dataclass(frozen=True)
class ConsumerOptions:
    stream: str
    durable: str | None  # None: an ephemeral consumer (replays, tools)
    filter_subjects: tuple[str, ...] = ()
    batch: int = 500
    fetch_timeout_s: float = 1.0
    ack_wait_s: float = 30.0
    max_attempts: int = 3  # a handler raising (not TransientError) this often: dead-lettered
    max_redeliveries: int = 20  # delivered this often without an ack (crash loop): dead-lettered
    retry_delay_s: float = 0.5  # doubles per attempt, capped by max_retry_delay_s
    max_retry_delay_s: float = 30.0
    max_bytes: int = DEFAULT_MAX_BYTES
    start_seq: int | None = None  # deliver from this stream sequence (replay after a snapshot)
    deliver: DeliverPolicy | None = None  # e.g. LAST_PER_SUBJECT or NEW; None: all (or from start_seq)
    max_ack_pending: int = 20_000
    fetch_max_bytes: int | None = None  # a pull request's byte bound besides `batch` (large messages)


@dataclass(frozen=True)
class Delivery:
    envelope: Envelope
    subject: str
    stream_seq: int
    num_delivered: int

    @property
    def event(self) -> object:
        return self.envelope.event


@dataclass
class ConsumerStats:
    handled: int = 0
    skipped: int = 0
    dead: int = 0
    retried: int = 0
    split: int = 0  # failing batches halved to find the message that fails
    last_acked_seq: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


Handler = Callable[[Delivery], Awaitable[None]]
BatchHandler = Callable[[list[Delivery]], Awaitable[None]]
# A cheaper decode for messages a service knows: a Delivery, or None for the standard decode (which
# names what is wrong and dead-letters). Called after the redelivery check.
FastDecode = Callable[[Msg, Position], Delivery | None]


class Consumer:
    """Give either `handler` (one message at a time) or `batch_handler` (a fetched batch at once)."""

    def __init__(
        self,
        js: JetStreamContext,
        options: ConsumerOptions,
        *,
        handler: Handler | None = None,
        batch_handler: BatchHandler | None = None,
        nc: Client | None = None,
        fast_decode: FastDecode | None = None,
    ) -> None:
        """With `nc` (every service's consumers: `ServiceContext.consume`), batches come through one
        pull request each (`pull.BatchPuller`); without it, through nats-py's `fetch` (tools)."""
        if (handler is None) == (batch_handler is None):
            raise ValueError("give exactly one of handler or batch_handler")
        self.js = js
        self.nc = nc
        self._puller: BatchPuller | None = None
        self.options = options
        self.handler = handler
        self.batch_handler = batch_handler
        self.fast_decode = fast_decode
        self.stats = ConsumerStats()
        self.name = options.durable or ""
        self._sub: JetStreamContext.PullSubscription | None = None
        self.last_failure: Exception | None = None  # of the last `attempt` that gave up

    @property
    def puller(self) -> BatchPuller | None:
        """The batched pull, once started with `nc`."""
        return self._puller

    @property
    def bound(self) -> bool:
        """Started and bound to its stream (through either pull path)."""
        return self._sub is not None or self._puller is not None

    def _config(self) -> ConsumerConfig:
        o = self.options
        filters = list(o.filter_subjects)
        config = ConsumerConfig(
            durable_name=o.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=o.ack_wait_s,
            max_deliver=-1,  # never let the server drop a message; we dead-letter instead
            max_ack_pending=o.max_ack_pending,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
        )
        if o.start_seq is not None:
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = o.start_seq
        elif o.deliver is not None:
            config.deliver_policy = o.deliver
        if o.durable is None:
            config.inactive_threshold = 60.0  # ephemeral: the server removes it when we are gone
            config.name = ephemeral_name()
        return config

    async def start(self) -> None:
        o = self.options
        existing = None
        if o.durable is not None:
            with contextlib.suppress(NotFoundError):
                existing = await self.js.consumer_info(o.stream, o.durable)
        if existing is None:
            config = self._config()
            if o.durable is None:  # an ephemeral consumer is R1 unless asked: on a cluster it would die
                config.num_replicas = await self._stream_replicas()  # with its server (durables inherit)
            existing = await self.js.add_consumer(o.stream, config)
        info = existing
        self.name = info.name
        if self.nc is not None:
            self._puller = BatchPuller(self.nc, o.stream, info.name, max_bytes=o.fetch_max_bytes)
            await self._puller.start()
        else:
            self._sub = await self.js.pull_subscribe_bind(consumer=info.name, stream=o.stream)
        log.info("consumer started", stream=o.stream, consumer=info.name, pending=info.num_pending)

    async def _stream_replicas(self) -> int:
        return (await self.js.stream_info(self.options.stream)).config.num_replicas or 1

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and handle until `stop` is set; the batch in hand is finished first."""
        if self._sub is None and self._puller is None:
            await self.start()
        backoff = 0.0
        while not stop.is_set():
            if backoff:
                await _sleep_or_stop(stop, backoff)
            try:
                msgs = await self._fetch_unless_stopped(stop)
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                return
            except nats.errors.Error as exc:  # server restarting: keep trying
                _fetch_failed(stream=self.options.stream, error=repr(exc))  # at most one line per 30 s
                backoff = FETCH_BACKOFF.next(backoff)
                continue
            backoff = 0.0
            if msgs:
                await self.process(msgs, stop)

    async def _fetch_unless_stopped(self, stop: asyncio.Event) -> list[Msg]:
        """`fetch`, given up when `stop` is set: an idle long poll would otherwise hold the stop for
        its whole timeout. What the open request still delivers is handed back (nak) at close, or
        redelivered after its ack wait."""
        fetching = asyncio.ensure_future(self.fetch())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((fetching, stopping), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            fetching.cancel()
            raise
        finally:
            stopping.cancel()
        if fetching.done():
            return fetching.result()
        fetching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fetching
        return []

    async def fetch(self) -> list[Msg]:
        if self._puller is not None:
            return await self._puller.fetch(self.options.batch, self.options.fetch_timeout_s)
        assert self._sub is not None, "call start() first"
        try:
            return await self._sub.fetch(self.options.batch, timeout=self.options.fetch_timeout_s)
        except (TimeoutError, nats.errors.TimeoutError):
            return []

    async def process(self, msgs: list[Msg], stop: asyncio.Event | None = None) -> None:
        """Handle one fetched batch: every message ends acked, dead-lettered, or handed back on stop."""
        good: list[tuple[Msg, Delivery]] = []
        for msg in msgs:
            delivery = await self._decode_or_divert(msg)
            if delivery is not None:
                good.append((msg, delivery))
        if not good:
            return
        acks = [(msg, d.stream_seq) for msg, d in good]
        if self.batch_handler is not None:
            await self.attempt_batch(good, acks, stop)
            return
        for i, (msg, delivery) in enumerate(good):
            if not await self.attempt(acks[i : i + 1], acks[i:], self._traced_call(msg, delivery), stop):
                return

    def _traced_call(self, msg: Msg, delivery: Delivery) -> Callable[[], Awaitable[None]]:
        handler = self.handler
        assert handler is not None
        if not traced(msg.headers):  # no span to make or trace to continue: the handler alone
            return lambda: handler(delivery)

        async def call() -> None:
            with consume_span(
                msg.headers, stream=self.options.stream, subject=msg.subject, message_id=delivery.envelope.id
            ):
                await handler(delivery)

        return call

    async def attempt(
        self,
        current: list[tuple[Msg, int]],
        held: list[tuple[Msg, int]],
        call: Callable[[], Awaitable[None]],
        stop: asyncio.Event | None,
        *,
        attempts: int | None = None,
        dead_letter_on_failure: bool = True,
    ) -> bool:
        """Run the handler for `current` until it succeeds, keeping the rest of the batch (`held`).
        Both are (message, stream sequence) pairs.

        Retries happen here, in process, while the held messages' ack timers are extended: naking the
        rest of a batch would spend their delivery counts. After `attempts` failures (default
        `max_attempts`; a TransientError does not count) `current` is dead-lettered, or with
        `dead_letter_on_failure=False` left unacked for the caller, which `last_failure` tells.
        Returns False when stopping with the held messages handed back (nak) to the server for the
        next process.
        """
        o = self.options
        limit = attempts if attempts is not None else o.max_attempts
        attempt = 0
        self.last_failure = None
        while True:
            attempt += 1
            try:
                await call()
            except Exception as exc:
                transient = isinstance(exc, TransientError)
                if not transient and attempt >= limit:
                    self.last_failure = exc
                    if dead_letter_on_failure:
                        for msg, _ in current:
                            await self._dead(msg, "handler_failed", f"{type(exc).__name__}: {exc}")
                    return True
                delay = Backoff(o.retry_delay_s, o.max_retry_delay_s).for_attempt(attempt)
                log.warning(
                    "handler failed, will retry",
                    stream=o.stream,
                    subject=current[0][0].subject,
                    attempt=attempt,
                    delay_s=delay,
                    error=repr(exc),
                    exc_info=not transient,
                )
                self.stats.retried += 1
                if stop is not None and stop.is_set():
                    for msg, _ in held:  # hand back to the server, redelivered after the delay
                        await msg.nak(delay=delay)
                    return False
                for msg, _ in held:
                    await msg.in_progress()
                if stop is not None:
                    await _sleep_or_stop(stop, delay)
                else:
                    await asyncio.sleep(delay)
                continue
            for msg, stream_seq in current:
                await self._ack(msg, stream_seq)
            return True

    async def attempt_batch(
        self,
        good: list[tuple[Msg, Delivery]],
        held: list[tuple[Msg, int]],
        stop: asyncio.Event | None,
        *,
        whole_attempts: int | None = None,
    ) -> bool:
        """The batch handler over `good` (`max_attempts` times, or `whole_attempts`); when it keeps
        failing, the batch is halved and each half tried once, down to single messages: only the
        messages that crash the handler on their own are dead-lettered, not the batch they came in
        (each was tried `max_attempts` times with its batch, and once more at every halving).
        `held` is everything not yet acked (for the ack timers). False: stopping (handed back)."""
        batch_handler = self.batch_handler
        assert batch_handler is not None
        acks = [(msg, d.stream_seq) for msg, d in good]
        single = len(good) == 1
        ok = await self.attempt(
            acks,
            held,
            lambda: batch_handler([d for _, d in good]),
            stop,
            attempts=whole_attempts,
            dead_letter_on_failure=single,
        )
        if not ok or self.last_failure is None or single:
            return ok
        self.stats.split += 1
        middle = len(good) // 2  # `held` begins with `good`: the second half holds what follows it
        if not await self.attempt_batch(good[:middle], held, stop, whole_attempts=1):
            return False
        return await self.attempt_batch(good[middle:], held[middle:], stop, whole_attempts=1)

    async def _decode_or_divert(self, msg: Msg) -> Delivery | None:
        pos = position(msg)  # from the ack subject: no metadata object per message
        if pos.delivered > self.options.max_redeliveries:
            await self._dead(msg, "redelivered_too_often", f"delivered {pos.delivered} times without an ack")
            return None
        if self.fast_decode is not None:
            delivery = self.fast_decode(msg, pos)
            if delivery is not None:
                return delivery
        try:
            envelope = decode(msg.headers, msg.data, max_bytes=self.options.max_bytes)
        except UnknownEventType as exc:
            log.debug("skipping unknown event type", type=exc.ce_type, subject=msg.subject)
            self.stats.skipped += 1
            await msg.ack()
            return None
        except DecodeError as exc:
            await self._dead(msg, exc.reason, exc.detail)
            return None
        return Delivery(envelope, msg.subject, pos.stream_seq, pos.delivered)

    async def _ack(self, msg: Msg, stream_seq: int) -> None:
        await msg.ack()
        self.stats.handled += 1
        self.stats.last_acked_seq = stream_seq

    async def _dead(self, msg: Msg, reason: str, detail: str) -> None:
        log.warning("dead-lettering message", stream=self.options.stream, subject=msg.subject, reason=reason)
        await dead_letter(self.js, msg, stream=self.options.stream, consumer=self.name, reason=reason, detail=detail)
        self.stats.dead += 1
        self.stats.reasons[reason] = self.stats.reasons.get(reason, 0) + 1

    async def unsubscribe(self) -> None:
        if self._puller is not None:
            await self._puller.close()
            self._puller = None
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
