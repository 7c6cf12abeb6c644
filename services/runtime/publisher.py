"""Publish events with their CloudEvents envelope, `Nats-Msg-Id` and the current trace context."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from nats.js import JetStreamContext
from nats.js.api import PubAck

from events import Event, encode, subject_for
from services.runtime.tracing import configure_tracing, current_traceparent, produce_span, tracing_configured

ACK_TIMEOUT_S = 10.0


class Publisher:
    def __init__(self, js: JetStreamContext, *, source: str) -> None:
        self.js = js
        self.source = source
        if not tracing_configured():  # every process that publishes gets a provider: events carry traceparent
            configure_tracing(source.rsplit("/", 1)[-1] or "publisher")

    async def publish(
        self,
        event: Event,
        *,
        id: str | None = None,
        time: float | None = None,
        subject: str | None = None,
        expected_last_subject_seq: int | None = None,
    ) -> PubAck:
        """Publish one event and wait for the stream's ack (deduplicated by id within the window)."""
        subject = subject or subject_for(event)
        with produce_span(subject):
            headers, body = self._encode(event, id, time)
        if expected_last_subject_seq is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expected_last_subject_seq)
        return await self.js.publish(subject, body, headers=headers)

    async def publish_many(
        self, events: Iterable[tuple[Event, str | None, float | None]], *, window: int = 1000
    ) -> list[PubAck]:
        """Publish (event, id, time) triples with up to `window` acks in flight (batched acks)."""
        futures: list[asyncio.Future[PubAck]] = []
        acks: list[PubAck] = []
        for event, event_id, when in events:
            subject = subject_for(event)
            with produce_span(subject):
                headers, body = self._encode(event, event_id, when)
            futures.append(await self.js.publish_async(subject, body, headers=headers))
            if len(futures) >= window:
                acks.extend(await self._acks(futures))
                futures.clear()
        acks.extend(await self._acks(futures))
        return acks

    async def _acks(self, futures: list[asyncio.Future[PubAck]]) -> list[PubAck]:
        """nats-py may never resolve an ack whose server went away: give up after ACK_TIMEOUT_S (the
        caller retries; ids de-duplicate what did land)."""
        try:
            return await asyncio.wait_for(asyncio.gather(*futures), ACK_TIMEOUT_S)
        except TimeoutError:
            for f in futures:
                f.cancel()
            raise

    def _encode(self, event: Event, event_id: str | None, when: float | None) -> tuple[dict[str, str], bytes]:
        traceparent, tracestate = current_traceparent()
        return encode(event, source=self.source, id=event_id, time=when, traceparent=traceparent, tracestate=tracestate)
