"""One pull request per batch, on nats-py's public API only.

nats-py's `PullSubscription.fetch` waits for each message of a batch with its own task and timer,
which costs more than folding the message. Here one request on the JetStream API subject
(`<prefix>.CONSUMER.MSG.NEXT.<stream>.<consumer>`, part of the JetStream wire protocol) asks for a
whole batch, and a plain core-NATS subscription collects the replies into a list; the batch is handed
on when it is full or the request ends (drained: 404, expired: 408, refused: anything else).

What this relies on from nats-py is public: `Client.subscribe(subject, cb=...)`, `Client.new_inbox()`,
`Client.publish(subject, payload, reply=...)`, and a delivered `Msg`'s `subject`, `reply`, `headers`
and `data`. `tests/unit/test_nats_api_pin.py` fails if one of them moves; pyproject pins the minor.

A JetStream ack subject (`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.
<timestamp ns>.<pending>`) carries a message's position; `position` reads it without nats-py's
metadata object (a frozen dataclass and a datetime per message).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import NamedTuple

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

DEFAULT_API_PREFIX = "$JS.API"
_STATUS = "Status"
_DESCRIPTION = "Description"
_HEARTBEAT = "100"
_ENDED = ("404", "408")  # drained (no_wait), or the long poll expired
_FULL = "409"  # with "Message Size Exceeds MaxBytes": the request's byte bound is reached, an end too
_GRACE_S = 1.0  # beyond the pull's own expiry before a silent request is given up (lost in a reconnect)
_json = msgspec.json.Encoder()


class Position(NamedTuple):  # a tuple: made per message on the hot path, cheaper than a dataclass
    stream_seq: int
    delivered: int
    timestamp_ns: int
    pending: int  # messages left in the stream for this consumer after this one


_new_tuple = tuple.__new__


def position(msg: Msg) -> Position:
    """Where a message sits, from its ack subject (the short form, or nats-py's metadata otherwise)."""
    reply = msg.reply or ""
    tokens = reply.split(".")
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        # tuple.__new__ directly: a NamedTuple's own __new__ is a Python frame per message
        return _new_tuple(Position, (int(tokens[5]), int(tokens[4]), int(tokens[7]), int(tokens[8])))
    meta = msg.metadata  # the longer form, with domain and account hash
    ts = int(meta.timestamp.timestamp() * 1e9) if meta.timestamp else 0
    return Position(meta.sequence.stream, meta.num_delivered, ts, meta.num_pending)


def _at_tail(reply: str) -> bool:
    """Nothing pending after this message (the short ack subject ends in its pending count); a
    longer form is taken as at the tail, so a live message is never held back."""
    return reply.endswith(".0") or reply.count(".") != 8


class BatchPuller:
    """Batches from one durable or ephemeral pull consumer, one request each.

    `eager`: wake the reader as soon as a message arrives at the tail of the stream (a decider
    folding live events wants them now); otherwise, and while replaying (the server says more is
    pending after the message), only when the batch is full or the request ends (the recorder's bulk
    path). Waking once per batch instead of per message is what lets a replay fold whole batches.
    """

    def __init__(
        self,
        nc: Client,
        stream: str,
        consumer: str,
        *,
        api_prefix: str = DEFAULT_API_PREFIX,
        eager: bool = False,
        max_bytes: int | None = None,
    ) -> None:
        """`max_bytes`: a request's byte bound besides its message count (the server ends it there)."""
        self.nc = nc
        self.max_bytes = max_bytes
        self.next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.eager = eager
        self.wake = asyncio.Event()  # set when messages are ready or the open request ended
        self._inbox: Subscription | None = None
        self._ready: list[Msg] = []
        self._asked = 0  # messages the open request may still deliver; 0: none open
        self._asked_at = 0.0
        self._expires_s = 0.0
        self._refused = ""
        self._batch = 0
        self._got = 0  # messages the open (or last) request delivered
        self.ended_empty = False  # the last request ended having delivered nothing: nothing was there

    async def start(self) -> None:
        self._inbox = await self.nc.subscribe(self.nc.new_inbox(), cb=self._collect)

    async def _collect(self, msg: Msg) -> None:
        if not msg.data and msg.headers and _STATUS in msg.headers:
            status = msg.headers[_STATUS]
            if status == _HEARTBEAT:
                return
            ended = status in _ENDED or (status == _FULL and "MaxBytes" in msg.headers.get(_DESCRIPTION, ""))
            if not ended:  # 409 (consumer deleted, leader change...), 503 (JetStream away)
                self._refused = f"{status} {msg.headers.get(_DESCRIPTION, '')}".strip()
            elif self._got == 0 and status in _ENDED:
                self.ended_empty = True
            self._asked = 0
            self.wake.set()
            return
        self._got += 1
        self._ready.append(msg)
        self._asked = max(0, self._asked - 1)
        if self._asked == 0 or len(self._ready) >= self._batch or (self.eager and _at_tail(msg.reply)):
            self.wake.set()

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def requesting(self) -> bool:
        """A request is open: the server may still deliver on it."""
        return self._asked > 0

    async def request(self, batch: int, timeout: float) -> None:
        """Ask for up to `batch` messages unless a request is open (or one was lost: asked again)."""
        inbox = self._inbox
        if inbox is None:
            raise nats.errors.ConnectionClosedError
        self._batch = batch
        loop = asyncio.get_running_loop()
        if self._asked and loop.time() - self._asked_at > self._expires_s + _GRACE_S:
            self._asked = 0  # the request was lost (reconnect): ask again
        if self._asked == 0 and len(self._ready) < batch:
            self._asked = batch - len(self._ready)
            self._asked_at, self._expires_s = loop.time(), timeout
            self._got, self.ended_empty = 0, False
            self.wake.clear()
            # no_wait with expires: what is there now (ended by a 404 once drained), or, when there is
            # nothing, a long poll that ends at the timeout (408).
            request: dict[str, object] = {"batch": self._asked, "no_wait": True, "expires": int(timeout * 1e9)}
            if self.max_bytes:
                request["max_bytes"] = self.max_bytes
            await self.nc.publish(self.next_subject, _json.encode(request), reply=inbox.subject)

    def take(self) -> list[Msg]:
        """What has arrived; raises when the server refused the request and nothing came."""
        msgs, self._ready = self._ready, []
        self.wake.clear()  # set again by the next arrival or the end of the open request
        refused, self._refused = self._refused, ""
        if refused and not msgs:  # an error, so the caller backs off instead of asking again at once
            raise nats.errors.Error(f"pull request refused: {refused}")
        return msgs

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        """Up to about `batch` messages: what one pull request brought within `timeout` seconds."""
        await self.request(batch, timeout)
        if not self._ready or (not self.eager and self._asked):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=timeout + _GRACE_S)
        return self.take()

    async def close(self, *, hand_back: bool = True) -> None:
        """Stop; what was delivered but not handled is handed back (nak) so a successor gets it now."""
        inbox, self._inbox = self._inbox, None
        if inbox is not None:
            with contextlib.suppress(Exception):
                await inbox.unsubscribe()
        if hand_back:
            for msg in self._ready:
                with contextlib.suppress(Exception):
                    await msg.nak()
        self._ready = []
