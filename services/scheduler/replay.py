"""Rebuilding state by replay: a service folds its input streams from the start (ephemeral
consumers) and decides nothing until every consumer has caught up with its stream."""

from __future__ import annotations

import contextlib

from nats.js import JetStreamContext

from services.runtime import Consumer


async def caught_up(js: JetStreamContext, consumers: list[Consumer]) -> bool:
    """True once every consumer has started and holds nothing pending or unacknowledged."""
    for consumer in consumers:
        if not consumer.name:
            return False
        info = None
        with contextlib.suppress(Exception):
            info = await js.consumer_info(consumer.options.stream, consumer.name)
        if info is None or info.num_pending or info.num_ack_pending:
            return False
    return True
