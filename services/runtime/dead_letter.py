"""Poison messages: copy to `chamber.dead.<stream>` with the reason, then terminate the original.

The copy keeps the original bytes and every header, so nothing is lost, but JetStream's own headers
(`Nats-*`: `Nats-Expected-Last-Subject-Sequence`, `Nats-Rollup`, `Nats-Msg-Id`, ...) would be acted on
again by the server when the copy is stored: an expected-sequence check that held for the original
fails on the dead-letter subject, and a rollup would purge DEAD. They travel renamed
(`chamber-dead-orig-<name>`) and `replay_headers` puts back the ones a republish may carry.

A copy that cannot be stored (the role may not publish there, the DEAD stream is missing) does not
hold the consumer up: the original is terminated all the same, it stays in its own stream (every
Chamber stream keeps messages by limits, not by acknowledgement), and the failure is logged with the
reason. A consumer that stopped on a message it cannot dead-letter would stop for good.
"""

from __future__ import annotations

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from events import subjects
from services.runtime.logs import get_logger

DEAD_REASON = "chamber-dead-reason"
DEAD_DETAIL = "chamber-dead-detail"
DEAD_SUBJECT = "chamber-dead-subject"
DEAD_STREAM_SEQ = "chamber-dead-stream-seq"
DEAD_CONSUMER = "chamber-dead-consumer"
DEAD_ORIGINAL = "chamber-dead-orig-"  # prefix of a JetStream header kept under another name
DEAD_HEADERS = (DEAD_REASON, DEAD_DETAIL, DEAD_SUBJECT, DEAD_STREAM_SEQ, DEAD_CONSUMER)
# What a replay may carry again: the id (the source stream still drops a copy it already holds).
# Expected-sequence checks are not restored: the stream has moved on since.
REPLAYED_SERVER_HEADERS = ("Nats-Msg-Id",)
DETAIL_MAX = 1000

log = get_logger("chamber.runtime.dead_letter")


def _is_server_header(name: str) -> bool:
    return name.lower().startswith("nats-")


def dead_headers(
    original: dict[str, str] | None, *, subject: str, stream: str, seq: int, consumer: str, reason: str, detail: str
) -> dict[str, str]:
    """The copy's headers: the original's (JetStream's own renamed) plus why it was refused."""
    headers: dict[str, str] = {}
    for name, value in (original or {}).items():
        headers[f"{DEAD_ORIGINAL}{name}" if _is_server_header(name) else name] = value
    headers.update(
        {
            DEAD_REASON: reason,
            DEAD_DETAIL: detail[:DETAIL_MAX],
            DEAD_SUBJECT: subject,
            DEAD_STREAM_SEQ: str(seq),
            DEAD_CONSUMER: consumer,
            # one copy per stream message, even if two deliveries (or two services) dead-letter it
            "Nats-Msg-Id": f"dead:{stream}:{seq}",
        }
    )
    return headers


def replay_headers(dead: dict[str, str] | None) -> dict[str, str]:
    """The headers to republish a dead letter with: the original's, without the reason headers and
    without the server checks that no longer hold."""
    out: dict[str, str] = {}
    for name, value in (dead or {}).items():
        if name in DEAD_HEADERS or _is_server_header(name):
            continue
        if name.startswith(DEAD_ORIGINAL):
            original = name[len(DEAD_ORIGINAL) :]
            if original in REPLAYED_SERVER_HEADERS:
                out[original] = value
            continue
        out[name] = value
    return out


async def dead_letter(js: JetStreamContext, msg: Msg, *, stream: str, consumer: str, reason: str, detail: str) -> bool:
    """Copy `msg` to DEAD and terminate it. True when the copy was stored."""
    seq = msg.metadata.sequence.stream if msg.reply else 0
    headers = dead_headers(
        msg.headers, subject=msg.subject, stream=stream, seq=seq, consumer=consumer, reason=reason, detail=detail
    )
    stored = True
    try:
        await js.publish(subjects.dead(stream), msg.data, headers=headers)
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
        raise  # shutting down: the message comes back to the next process
    except Exception as exc:  # refused, timed out, no DEAD stream: the consumer must still go on
        stored = False
        log.error(
            "dead letter not stored; the message stays in its stream",
            stream=stream,
            subject=msg.subject,
            stream_seq=seq,
            reason=reason,
            error=repr(exc),
        )
    if msg.reply:
        await msg.term()
    return stored
