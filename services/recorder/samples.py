"""The hottest stream, consumed cheaply: a batched pull and a bulk decode.

Fetch: the runtime Consumer's batched pull (one request per batch, `services/runtime/pull.py`), bounded
in bytes as well as in messages (`ConsumerOptions.fetch_max_bytes`): 2,000 samples of 18 KB are 36 MB
asked for in one go per consumer, and the pull path collapsed under it (measured by
`bench/ingest.py --old-form`: 298 messages/s fetched and acked without a byte bound, 4,331/s with
4 MiB, on the same loaded 2 cores). With the bound (8 MiB) a batch of compact samples is still up to
2,000 messages and one of 18 KB samples about 460.

Decode: the node samples of a batch are decoded together, straight into warehouse columns, on a
worker thread (`bulk_samples`), and handed to `table_handler`; the loop only reads each message's
headers and position. When the bulk decode refuses the batch (some sample is not well-formed), the
batch takes the per-message path: each sample is decoded into the lean struct the warehouse needs
(the Consumer's `fast_decode` hook), and one that fails takes the runtime's full decode path, which
dead-letters it with the reason.

Everything else (acks after the batch is stored, in-process retries, dead letters) is the runtime
Consumer's, through its public `process` and `attempt`. A bulk batch the store keeps refusing takes
the per-message path too, whose halving finds the samples that fail on their own.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

import msgspec
import pyarrow as pa
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from events import NodeSample
from events.codec import H_ID, H_SOURCE, H_SPECVERSION, H_TIME, H_TYPE, SPECVERSION, Envelope, ce_unvalue
from events.streams import TELEMETRY
from services.recorder.bulk_samples import BatchRefused, sample_table
from services.recorder.rows import LeanNodeSample
from services.runtime.consumer import BatchHandler, Consumer, ConsumerOptions, Delivery
from services.runtime.logs import get_logger
from services.runtime.pull import Position, position

SAMPLE_TYPE = NodeSample.ce_type()
_lean = msgspec.json.Decoder(LeanNodeSample)
# A fetch's byte bound. It must exceed the largest message (or that message would never be delivered).
FETCH_MAX_BYTES = 8 * 1024 * 1024
MIN_FETCH_MAX_BYTES = TELEMETRY.max_msg_size + 64 * 1024  # the largest message, with its headers
log = get_logger("chamber.recorder.samples")

# Stores a batch's GPU-sample rows; `suspect`: some message was delivered before (check stored ids).
TableHandler = Callable[[pa.Table, bool], Awaitable[None]]

# What one TELEMETRY subject (one node's samples, or its inventories...) may bring into the warehouse
# a minute: twenty a second, twenty times the agent's default. Counted by the time the server stored
# each message, which no agent can set, so a recorder catching up on a backlog is not held back.
PER_SUBJECT_PER_MINUTE = 1200
_MINUTE_NS = 60 * 10**9


class SubjectRate:
    """Messages per subject per minute of the server's clock. Past `per_minute` in a minute, a
    subject's further messages are refused (the recorder acknowledges them without storing them):
    a flooding agent cannot fill the warehouse's disk or take its insert time. Shared by every
    sample consumer of one recorder."""

    def __init__(self, per_minute: int = PER_SUBJECT_PER_MINUTE) -> None:
        self.per_minute = per_minute
        self._counts: dict[str, tuple[int, int]] = {}  # subject -> (minute, messages admitted in it)
        self.refused: dict[str, int] = {}  # subject -> messages refused since start

    def admit(self, subject: str, stored_ns: int) -> bool:
        minute = stored_ns // _MINUTE_NS
        seen, count = self._counts.get(subject, (minute, 0))
        if minute > seen:
            count = 0
        elif minute < seen:  # an older message arriving late (another consumer's batch): let it in
            return True
        if count < self.per_minute:
            self._counts[subject] = (minute, count + 1)
            return True
        refused = self.refused.get(subject, 0)
        if count == self.per_minute:  # the first refusal of this minute
            log.warning(
                "telemetry over its rate: the excess is not stored",
                subject=subject,
                per_minute=self.per_minute,
                refused_so_far=refused,
            )
        self._counts[subject] = (minute, count + 1)
        self.refused[subject] = refused + 1
        return False


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


class SampleConsumer(Consumer):
    """The runtime Consumer with a byte-bounded pull, a bulk path for well-formed samples (`process`)
    and the lean decode as its `fast_decode` hook."""

    def __init__(
        self,
        js: JetStreamContext,
        options: ConsumerOptions,
        *,
        nc: Client,
        batch_handler: BatchHandler,
        table_handler: TableHandler,
        fetch_max_bytes: int = FETCH_MAX_BYTES,
        rate: SubjectRate | None = None,
    ) -> None:
        """`rate`: what each subject may bring in a minute (None: no limit)."""
        if fetch_max_bytes < MIN_FETCH_MAX_BYTES:
            raise ValueError(f"fetch_max_bytes must be at least {MIN_FETCH_MAX_BYTES} (the largest message)")
        options = dataclasses.replace(options, fetch_max_bytes=fetch_max_bytes)
        super().__init__(js, options, batch_handler=batch_handler, nc=nc, fast_decode=self._lean_delivery)
        self.table_handler = table_handler
        self.fetch_max_bytes = fetch_max_bytes
        self.bulk_refused = 0  # batches that took the per-message path
        self.rate = rate

    async def process(self, msgs: list[Msg], stop: asyncio.Event | None = None) -> None:
        """Well-formed samples in bulk; anything else (other types, odd headers, redelivered too
        often, a refused bulk decode) through the per-message path."""
        if self.rate is not None:
            msgs = await self._within_rate(msgs, self.rate)
        o = self.options
        bulk: list[tuple[Msg, int]] = []
        bodies: list[bytes] = []
        ids: list[str] = []
        rest: list[Msg] = []
        suspect = False
        for msg in msgs:
            event_id = _sample_id(msg, o.max_bytes)
            if event_id is not None:
                stream_seq, delivered, _, _ = position(msg)
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
                stored = lambda: handler(table, suspect)  # noqa: E731 - one call, named for the line below
                if not await self.attempt(bulk, bulk, stored, stop, dead_letter_on_failure=False):
                    for msg in rest:  # stopping with the store failing: hand these back too
                        await msg.nak()
                    return
                if self.last_failure is not None:  # the per-message path finds the samples that fail
                    rest = [msg for msg, _ in bulk] + rest
        if rest:
            await super().process(rest, stop)

    @staticmethod
    async def _within_rate(msgs: list[Msg], rate: SubjectRate) -> list[Msg]:
        """The messages `rate` admits; the others are acknowledged here, unstored. A redelivered
        message was admitted once already (its batch failed to store): it is not counted again."""
        kept = []
        for msg in msgs:
            _, delivered, stored_ns, _ = position(msg)
            if delivered > 1 or rate.admit(msg.subject, stored_ns):
                kept.append(msg)
            else:
                await msg.ack()
        return kept

    def _lean_delivery(self, msg: Msg, pos: Position) -> Delivery | None:
        """A well-formed sample as the lean struct the warehouse needs; None: the standard decode
        (which names what is wrong and dead-letters it)."""
        event_id = _sample_id(msg, self.options.max_bytes)
        if event_id is None:
            return None
        headers = msg.headers or {}
        try:
            sample = _lean.decode(msg.data)
        except msgspec.DecodeError:
            return None
        envelope = Envelope(
            event=sample,  # type: ignore[arg-type]
            id=event_id,
            source=headers[H_SOURCE],
            type=SAMPLE_TYPE,
            time=headers.get(H_TIME, ""),
            headers=headers,
        )
        return Delivery(envelope, msg.subject, pos.stream_seq, pos.delivered)
