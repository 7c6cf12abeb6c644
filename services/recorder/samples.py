"""A cheaper decode for the hottest subject: node samples go straight into the lean struct the
warehouse needs, skipping the full event's nested fields (about 5x cheaper per message).

Everything else — acks after the batch is stored, in-process retries, dead letters — is the runtime
Consumer's. A message that is not a well-formed sample (or fails the lean decode) takes the runtime's
full decode path, which dead-letters it with the reason.
"""

from __future__ import annotations

import msgspec
from nats.aio.msg import Msg

from events import NodeSample
from events.codec import H_ID, H_SOURCE, H_SPECVERSION, H_TIME, H_TYPE, SPECVERSION, Envelope
from services.recorder.rows import LeanNodeSample
from services.runtime.consumer import Consumer, Delivery

SAMPLE_TYPE = NodeSample.ce_type()
_lean = msgspec.json.Decoder(LeanNodeSample)


class SampleConsumer(Consumer):
    async def _decode_or_divert(self, msg: Msg) -> Delivery | None:
        headers = msg.headers or {}
        meta = msg.metadata
        if (
            headers.get(H_TYPE) == SAMPLE_TYPE
            and headers.get(H_SPECVERSION) == SPECVERSION
            and headers.get(H_ID)
            and headers.get(H_SOURCE)
            and len(msg.data) <= self.options.max_bytes
            and meta.num_delivered <= self.options.max_redeliveries
        ):
            try:
                sample = _lean.decode(msg.data)
            except msgspec.DecodeError:
                pass  # the full path below names what is wrong and dead-letters it
            else:
                envelope = Envelope(
                    event=sample,  # type: ignore[arg-type]
                    id=headers[H_ID],
                    source=headers[H_SOURCE],
                    type=SAMPLE_TYPE,
                    time=headers.get(H_TIME, ""),
                    headers=headers,
                )
                return Delivery(envelope, msg.subject, meta.sequence.stream, meta.num_delivered)
        return await super()._decode_or_divert(msg)
