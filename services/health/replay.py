"""Shell helpers shared by discovery and health: rebuild state from the log, then go live.

A restarted service replays its input streams with ephemeral consumers; it makes no decision until
each has caught up (what the stream held at start is folded), so a half-rebuilt state never emits.
After that, its own events coming back on FLEET are skipped: they were folded when decided.
"""

from __future__ import annotations

import contextlib
import dataclasses

from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from services.runtime.consumer import BatchHandler, Consumer, ConsumerOptions


class DeliverFrom(Consumer):
    """A consumer with a deliver policy (new, last per subject), through the public option."""

    def __init__(
        self, js: JetStreamContext, options: ConsumerOptions, *, policy: DeliverPolicy, batch_handler: BatchHandler
    ) -> None:
        super().__init__(js, dataclasses.replace(options, deliver=policy), batch_handler=batch_handler)
        self.policy = policy


class CatchUp:
    """Tracks whether the replay consumers have folded everything their streams held at start."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.consumers: list[Consumer] = []
        self.done = False

    def watch(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)

    async def check(self) -> bool:
        if self.done:
            return True
        for consumer in self.consumers:
            if not consumer.name:
                return False  # not started yet
            try:
                info = await self.js.consumer_info(consumer.options.stream, consumer.name)
            except Exception:
                return False
            if info.num_pending or info.num_ack_pending:
                return False
        self.done = True
        return True


async def last_seq(js: JetStreamContext, stream: str) -> int:
    with contextlib.suppress(Exception):
        info = await js.stream_info(stream)
        return int(info.state.last_seq)
    return 0
