"""Poison messages: copy to `chamber.dead.<stream>` with the reason, then terminate the original."""

from __future__ import annotations

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from events import subjects

DEAD_REASON = "chamber-dead-reason"
DEAD_DETAIL = "chamber-dead-detail"
DEAD_SUBJECT = "chamber-dead-subject"
DEAD_STREAM_SEQ = "chamber-dead-stream-seq"
DEAD_CONSUMER = "chamber-dead-consumer"


async def dead_letter(js: JetStreamContext, msg: Msg, *, stream: str, consumer: str, reason: str, detail: str) -> None:
    """Keep the original bytes and headers (so nothing is lost) and say why it was refused."""
    headers = {k: v for k, v in (msg.headers or {}).items() if k != "Nats-Msg-Id"}
    seq = msg.metadata.sequence.stream if msg.reply else 0
    headers.update(
        {
            DEAD_REASON: reason,
            DEAD_DETAIL: detail[:1000],
            DEAD_SUBJECT: msg.subject,
            DEAD_STREAM_SEQ: str(seq),
            DEAD_CONSUMER: consumer,
            # one copy per stream message, even if two deliveries race to dead-letter it
            "Nats-Msg-Id": f"dead:{stream}:{seq}",
        }
    )
    await js.publish(subjects.dead(stream), msg.data, headers=headers)
    await msg.term()
