"""The hottest stream, consumed cheaply: a batched pull and a bulk decode.

Fetch: nats-py's `fetch` waits for each message of a batch with its own task and timer (`next_msg`),
which cost more than decoding and storing the message. Here one pull request asks the durable for a
whole batch and a plain subscription callback collects the messages into a list; the batch is handed
on when it is full or the request ends (drained, expired, refused, or its bytes reached). Acks stay
per message and after the store, exactly as in the runtime Consumer.

A batch is bounded in bytes as well as in messages (the pull request's `max_bytes`): 2,000 samples of
18 KB are 36 MB asked for in one go per consumer, and the pull path collapsed under it (measured by
`bench/ingest.py --old-form`: 298 messages/s fetched and acked without a byte bound, 4,331/s with
4 MiB, on the same loaded 2 cores). With the bound (8 MiB) a batch of compact samples is still up to
2,000 messages and one of 18 KB samples about 460.

Decode: the node samples of a batch are decoded together, straight into warehouse columns, on a
worker thread (`bulk_samples`), and handed to `table_handler`; the loop only reads each message's
headers and position. When the bulk decode refuses the batch (some sample is not well-formed), the
batch takes the per-message path: each sample is decoded into the lean struct the warehouse needs,
and one that fails takes the runtime's full decode path, which dead-letters it with the reason.

Everything else — acks after the batch is stored, in-process retries, dead letters — is the runtime
Consumer's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import msgspec
import nats.errors
import pyarrow as pa
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from events import NodeSample
from events.codec import H_ID, H_SOURCE, H_SPECVERSION, H_TIME, H_TYPE, SPECVERSION, Envelope, ce_unvalue
from events.streams import TELEMETRY
from services.recorder.bulk_samples import BatchRefused, sample_table
from services.recorder.rows import LeanNodeSample
from services.runtime.consumer import BatchHandler, Consumer, ConsumerOptions, Delivery
from services.runtime.logs import get_logger

SAMPLE_TYPE = NodeSample.ce_type()
_lean = msgspec.json.Decoder(LeanNodeSample)
_json = msgspec.json.Encoder()
_STATUS = "Status"
_DESCRIPTION = "Description"
_HEARTBEAT = "100"
_ENDED = ("404", "408")  # drained (no_wait), or the long poll expired
_FULL = "409"  # with "Message Size Exceeds MaxBytes": the request's bytes are reached, an end too
# A fetch's byte bound. It must exceed the largest message (or that message would never be delivered).
FETCH_MAX_BYTES = 8 * 1024 * 1024
MIN_FETCH_MAX_BYTES = TELEMETRY.max_msg_size + 64 * 1024  # the largest message, with its headers
# Grace beyond the pull's own expiry before a silent request is given up on (e.g. lost in a reconnect).
_GRACE_S = 1.0
log = get_logger("chamber.recorder.samples")

# Stores a batch's GPU-sample rows; `suspect`: some message was delivered before (check stored ids).
TableHandler = Callable[[pa.Table, bool], Awaitable[None]]


def _sample_id(msg: Msg, max_bytes: int) -> str | None:
    """The event id of a message whose headers say it is a well-formed node sample, else None."""
    headers = msg.headers
    if (
        headers
        and headers.get(H_TYPE) == SAMPLE_TYPE
        and headers.get(H_SPECVERSION) == SPECVERSION
        and headers.get(H_SOURCE)
        and len(msg.data) <= max_bytes
    ):
        return ce_unvalue(headers.get(H_ID) or "") or None
    return None


def _position(msg: Msg) -> tuple[int, int]:
    """(stream sequence, times delivered) from the ack subject, without nats-py's full metadata (a
    frozen dataclass and a datetime per message): `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...`."""
    tokens = msg.reply.split(".")
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[5]), int(tokens[4])
    meta = msg.metadata  # the longer form, with domain and account
    return meta.sequence.stream, meta.num_delivered


class SampleConsumer(Consumer):
    _inbox: Subscription | None = None

    def __init__(
        self,
        js: JetStreamContext,
        options: ConsumerOptions,
        *,
        batch_handler: BatchHandler,
        table_handler: TableHandler,
        fetch_max_bytes: int = FETCH_MAX_BYTES,
    ) -> None:
        if fetch_max_bytes < MIN_FETCH_MAX_BYTES:
            raise ValueError(f"fetch_max_bytes must be at least {MIN_FETCH_MAX_BYTES} (the largest message)")
        super().__init__(js, options, batch_handler=batch_handler)
        self.table_handler = table_handler
        self.fetch_max_bytes = fetch_max_bytes
        self.bulk_refused = 0  # batches that took the per-message path

    async def start(self) -> None:
        await super().start()  # creates or finds the durable
        nc = self.js._nc
        self._ready: list[Msg] = []
        self._asked = 0  # messages the open pull request may still deliver; 0: none open
        self._wake = asyncio.Event()
        self._refused = ""
        self._next_subject = f"{self.js._prefix}.CONSUMER.MSG.NEXT.{self.options.stream}.{self.name}"
        self._inbox = await nc.subscribe(nc.new_inbox(), cb=self._collect)

    async def _collect(self, msg: Msg) -> None:
        if not msg.data and msg.headers and _STATUS in msg.headers:
            status = msg.headers[_STATUS]
            if status == _HEARTBEAT:
                return
            ended = status in _ENDED or (status == _FULL and "MaxBytes" in msg.headers.get(_DESCRIPTION, ""))
            if not ended:  # 409 (consumer deleted, leader change...), 503 (JetStream away)
                self._refused = f"{status} {msg.headers.get(_DESCRIPTION, '')}".strip()
            self._asked = 0
            self._wake.set()
            return
        self._ready.append(msg)
        self._asked = max(0, self._asked - 1)
        if self._asked == 0 or len(self._ready) >= self.options.batch:
            self._wake.set()

    async def fetch(self) -> list[Msg]:
        """Up to about a batch: what one pull request brought within the fetch timeout."""
        if self._inbox is None:
            raise nats.errors.ConnectionClosedError
        o = self.options
        if len(self._ready) < o.batch and self._asked == 0:
            self._asked = o.batch - len(self._ready)
            self._wake.clear()
            # no_wait with expires: what is there now (ended by a 404 once drained), or, when there is
            # nothing, a long poll that ends at the fetch timeout (408).
            request = {
                "batch": self._asked,
                "max_bytes": self.fetch_max_bytes,
                "no_wait": True,
                "expires": int(o.fetch_timeout_s * 1e9),
            }
            await self.js._nc.publish(self._next_subject, _json.encode(request), reply=self._inbox.subject)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=o.fetch_timeout_s + _GRACE_S)
            except TimeoutError:
                self._asked = 0  # the request was lost (reconnect): ask again next time
        msgs, self._ready = self._ready, []
        refused, self._refused = self._refused, ""
        if refused and not msgs:  # an error, so the run loop backs off instead of asking again at once
            raise nats.errors.Error(f"pull request refused: {refused}")
        return msgs

    async def unsubscribe(self) -> None:
        """Hand back what was delivered but not processed, so a successor gets it at once."""
        inbox, self._inbox = self._inbox, None
        if inbox is not None:
            with contextlib.suppress(Exception):
                await inbox.unsubscribe()
            for msg in self._ready:
                with contextlib.suppress(Exception):
                    await msg.nak()
            self._ready = []
        await super().unsubscribe()

    async def process(self, msgs: list[Msg], stop: asyncio.Event | None = None) -> None:
        """Well-formed samples in bulk; anything else (other types, odd headers, redelivered too
        often, a refused bulk decode) through the per-message path."""
        o = self.options
        bulk: list[tuple[Msg, int]] = []
        bodies: list[bytes] = []
        ids: list[str] = []
        rest: list[Msg] = []
        suspect = False
        for msg in msgs:
            event_id = _sample_id(msg, o.max_bytes)
            if event_id is not None:
                stream_seq, delivered = _position(msg)
                if delivered <= o.max_redeliveries:
                    bulk.append((msg, stream_seq))
                    bodies.append(msg.data)
                    ids.append(event_id)
                    suspect = suspect or delivered > 1
                    continue
            rest.append(msg)
        if bulk:
            try:
                table = await asyncio.to_thread(sample_table, bodies, ids)
            except Exception as exc:  # BatchRefused, or anything unforeseen: the per-message path decides
                self.bulk_refused += 1
                log.info(
                    "batch takes the per-message decode",
                    reason=str(exc),
                    messages=len(bulk),
                    exc_info=not isinstance(exc, BatchRefused),
                )
                rest = [msg for msg, _ in bulk] + rest
            else:
                handler = self.table_handler
                if not await self._attempt(bulk, bulk, lambda: handler(table, suspect), stop):
                    for msg in rest:  # stopping with the store failing: hand these back too
                        await msg.nak()
                    return
        if rest:
            await super().process(rest, stop)

    async def _decode_or_divert(self, msg: Msg) -> Delivery | None:
        event_id = _sample_id(msg, self.options.max_bytes)
        meta = msg.metadata
        if event_id is not None and meta.num_delivered <= self.options.max_redeliveries:
            headers = msg.headers or {}
            try:
                sample = _lean.decode(msg.data)
            except msgspec.DecodeError:
                pass  # the full path below names what is wrong and dead-letters it
            else:
                envelope = Envelope(
                    event=sample,  # type: ignore[arg-type]
                    id=event_id,
                    source=headers[H_SOURCE],
                    type=SAMPLE_TYPE,
                    time=headers.get(H_TIME, ""),
                    headers=headers,
                )
                return Delivery(envelope, msg.subject, meta.sequence.stream, meta.num_delivered)
        return await super()._decode_or_divert(msg)
