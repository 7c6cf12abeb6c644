"""Lossless publishing: every record reaches its stream exactly once, in order, across NATS outages.

One pump task publishes everything, so order is kept:
- connected and nothing spooled: records go straight out (async publish, acks awaited per batch);
- a publish that fails or is not acknowledged in time, and everything queued after it, goes to the
  on-disk spool; so does everything submitted while NATS is unreachable;
- once connected again, the spool is flushed oldest first, and only then do new records go direct.

Every record carries its `Nats-Msg-Id` (node + sequence), so a record that reached the stream but
whose ack was lost is dropped by JetStream when it is sent again (within the stream's duplicate
window, 120 s for TELEMETRY).

A publish that no stream takes (the server answers "no responders": e.g. its subject mapping sends
samples to a partition stream that does not exist) is spooled like any other failure, and diagnosed:
one log line says what the server maps, which streams exist and the fix, and `problem` holds it for
the health report until a publish goes through again.

Records go to the node's gate streams (`chamber.ingest.…`, events/streams.py), which accept at most
GATE_PER_WINDOW per node and kind in any GATE_WINDOW_S. A record over that rate is refused and kept
(spooled, in order); the outbox then waits `throttle_s` and sends small batches until one goes
through whole, so a backlog after an outage drains at the gate's rate without hammering it.

A record the server refuses for good (larger than its stream's `max_msg_size`, or than the server's
`max_payload`) would be refused again at every retry and hold back everything after it: it is
dropped, counted in `refused` and logged, and the records after it go on. Every other refusal is
retried (spooled), so nothing is lost to a passing condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext

from events import subjects
from node_agent.spool import Record, Spool
from services.runtime.logs import get_logger
from services.runtime.partitions import diagnose_unrouted

log = get_logger("chamber.agent.outbox")
DIAGNOSE_EVERY_S = 30.0  # a stuck publish is re-diagnosed at most this often (the log line only on change)
# JetStream's answers that the same bytes get at every retry: "message size exceeds maximum allowed"
# (over the stream's `max_msg_size`) and "header size exceeds maximum allowed of 64k".
REFUSED_FOR_GOOD = frozenset({10054, 10097})
# A stream's limits refused the message for now ("maximum messages per subject exceeded": a gate's
# window is full; "maximum bytes exceeded"): the same record goes through once the window moves on.
STORE_REFUSED = 10077
PROBE_BATCH = 20  # records per batch after a refusal, until one batch goes through whole


class _Batch:
    __slots__ = ("acked", "done", "expected", "failed", "number", "ok", "refused", "throttled", "unrouted")

    def __init__(self, number: int, size: int) -> None:
        self.number = number
        self.ok = bytearray(size)  # 1 where the stream acknowledged the record
        self.acked = 0
        self.expected = size
        self.failed = False
        self.unrouted = -1  # the first record no stream took ("no responders"), -1: none
        self.refused: dict[int, str] = {}  # records refused for good (done with, not stored): index -> why
        self.throttled = ""  # why a stream's limits refused a record for now ("": none did)
        self.done = asyncio.Event()

    def settle(self, i: int) -> None:
        """Record `i` needs no more sending (stored, or refused for good)."""
        if not self.ok[i]:
            self.ok[i] = 1
            self.acked += 1


class Outbox:
    def __init__(
        self,
        spool: Spool,
        *,
        ack_timeout_s: float = 5.0,
        batch: int = 4000,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
        throttle_s: float = 1.0,
    ) -> None:
        self.spool = spool
        self.ack_timeout_s = ack_timeout_s
        self.batch = batch
        self.throttle_s = throttle_s
        self.throttled = 0  # records sent again because a stream's limits refused them (or one before them)
        self._resume_at = float("-inf")  # after a refusal for now: nothing is sent before this
        self._probing = False  # after a refusal for now: small batches until one goes through whole
        self.on_reconnect = on_reconnect
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self.published = 0
        self.refused = 0  # records the server refused for good (too large): dropped, not retried
        self._queue: list[Record] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._needs_setup = True
        self._last_drop_report = (0, 0)
        self._ack_sub: Subscription | None = None
        self._ack_prefix = ""
        self._batch = 0
        self._acks: _Batch | None = None
        self.problem: str | None = None  # why publishing is stuck, for the health report
        self._diagnosed_at = float("-inf")

    def attach(self, nc: Client) -> None:
        """Publish through this connection (set once it first connects)."""
        self.nc = nc
        self.js = nc.jetstream()
        self._wake.set()

    def submit(self, records: list[Record]) -> None:
        """Hand records over; never blocks and never fails (the pump does the rest)."""
        if records:
            self._queue.extend(records)
            self._idle.clear()
            self._wake.set()

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    async def drained(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or spooled (tests, shutdown)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return self._idle.is_set()

    async def run(self, stop: asyncio.Event, *, retry_s: float = 0.25) -> None:
        while True:
            self._wake.clear()
            progressed = await self._step()
            if stop.is_set() and (not self._queue or not self.connected or self._waiting()):
                self._to_spool()
                return
            if not self._queue and self.spool.empty():
                self._idle.set()
            if progressed and (self._queue or not self.spool.empty()):
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), retry_s)

    async def _step(self) -> bool:
        """One round; True when something reached the stream."""
        if not self.connected:
            self._to_spool()
            return False
        if self._needs_setup and self.on_reconnect is not None:
            try:
                await self.on_reconnect()
            except Exception as exc:
                log.warning("stream setup failed, will retry", error=repr(exc))
                self._to_spool()
                return False
        self._needs_setup = False
        if self._waiting():
            return False
        if not self.spool.empty():
            self._to_spool()  # keep order: what is queued now comes after what was spooled
            return await self._flush_oldest_segment()
        if not self._queue:
            return False
        size = self._batch_size()
        records, self._queue = self._queue[:size], self._queue[size:]
        ok = await self._publish(records)
        if ok < len(records):
            self._queue[:0] = records[ok:]
            self._to_spool()
            self._needs_setup = not self._probing  # refused for now: the streams are there
        return ok > 0

    async def _flush_oldest_segment(self) -> bool:
        oldest = self.spool.oldest()
        if oldest is None:
            return False
        n, records = oldest
        records = records[: self._batch_size()]
        ok = await self._publish(records)
        self.spool.done(n, ok)
        if ok:
            log.info("spool flushed", records=ok, left=len(self.spool), bytes_left=self.spool.bytes)
        if ok < len(records):
            self._needs_setup = not self._probing
        return ok > 0

    def _waiting(self) -> bool:
        return asyncio.get_running_loop().time() < self._resume_at

    def _batch_size(self) -> int:
        return PROBE_BATCH if self._probing else self.batch

    async def _publish(self, records: list[Record]) -> int:
        """Publish in order; return how many from the start of `records` are surely in the stream.

        Each message asks JetStream for its ack on `<inbox>.<batch>.<i>`, one wildcard subscription
        counts them: nats-py's publish_async (a future, a semaphore slot and a parsed PubAck per
        message) costs more than the rest of a node sample together.
        """
        nc = self.nc
        assert nc is not None
        if self._ack_sub is None:
            self._ack_prefix = nc.new_inbox()
            self._ack_sub = await nc.subscribe(f"{self._ack_prefix}.>", cb=self._on_ack)
        self._batch += 1
        batch = _Batch(self._batch, len(records))
        self._acks = batch
        prefix = f"{self._ack_prefix}.{batch.number}."
        sent = 0
        for i, r in enumerate(records):
            if not self.connected:
                break
            try:
                if _wire_bytes(r) > nc.max_payload:  # the server would close the connection on it
                    raise MaxPayloadError
                await nc.publish(subjects.ingest(r.subject), r.body, reply=f"{prefix}{i}", headers=r.headers)
            except MaxPayloadError:
                batch.refused[i] = f"{_wire_bytes(r)} bytes with headers: over max_payload ({nc.max_payload})"
                batch.settle(i)
            except Exception as exc:  # disconnected mid-batch, buffer full: the rest goes to the spool
                log.warning("publish failed", error=repr(exc))
                break
            sent += 1
        if not sent:
            return 0
        batch.expected = sent
        if batch.acked < sent:
            with contextlib.suppress(Exception):
                # nats-py annotates `timeout: int` but hands it to asyncio.wait_for: a float is fine
                await nc.flush(timeout=self.ack_timeout_s)  # type: ignore[arg-type]
        # Wait for the acks, but give up early when the connection drops: they will not come.
        deadline = asyncio.get_running_loop().time() + self.ack_timeout_s
        while batch.acked < sent and not batch.failed:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0 or not self.connected:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(batch.done.wait(), min(left, 0.2))
        self._acks = None
        ok = batch.ok.find(0)
        ok = sent if ok < 0 or ok > sent else ok
        refused = [i for i in sorted(batch.refused) if i < ok]
        self.refused += len(refused)
        for i in refused:
            r = records[i]
            log.error("record refused for good, dropped", subject=r.subject, msg_id=r.msg_id, bytes=len(r.body),
                      reason=batch.refused[i], refused_total=self.refused)  # fmt: skip
        self.published += ok - len(refused)
        if batch.throttled:
            if not self._probing:
                log.warning("over the node's rate: the server refused records, sending them again later",
                            reason=batch.throttled, sent=sent, stored=ok, wait_s=self.throttle_s)  # fmt: skip
            self.throttled += sent - ok
            self._probing = True
            self._resume_at = asyncio.get_running_loop().time() + self.throttle_s
        elif ok == len(records) and self._probing:
            self._probing = False
            log.info("publishing at full batches again", throttled_total=self.throttled)
        if batch.unrouted >= 0:
            await self._diagnose(records[batch.unrouted].subject)
        elif ok == len(records) and self.problem is not None:
            log.info("publishing again", was=self.problem)
            self.problem = None
        return ok

    async def _diagnose(self, subject: str) -> None:
        now = asyncio.get_running_loop().time()
        if self.nc is None or now - self._diagnosed_at < DIAGNOSE_EVERY_S:
            return
        self._diagnosed_at = now
        problem = await diagnose_unrouted(self.nc, subject)
        if problem != self.problem:
            log.error("no stream takes this node's records", detail=problem)
        self.problem = problem

    async def _on_ack(self, msg: Msg) -> None:
        batch = self._acks
        number, _, index = msg.subject.rpartition(".")
        if batch is None or not number.endswith(f".{batch.number}"):
            return  # a late ack of an earlier batch: that record was already handed to the spool
        i = int(index)
        # A PubAck is `{"stream":...,"seq":...}` (with `"duplicate":true` when JetStream dropped a repeat);
        # an error is `{"error":...}`; no stream for the subject is an empty 503.
        if msg.data and b'"error"' not in msg.data:
            batch.settle(i)
        elif (refusal := _error(msg.data)) is not None and refusal[0] in REFUSED_FOR_GOOD:
            batch.refused[i] = refusal[1]
            batch.settle(i)
        else:
            if refusal is not None and refusal[0] == STORE_REFUSED:
                batch.throttled = refusal[1]
            batch.failed = True
            if not msg.data and (msg.headers or {}).get("Status") == "503":
                batch.unrouted = i if batch.unrouted < 0 else min(batch.unrouted, i)
            elif not batch.throttled:
                log.warning("publish refused", subject=msg.subject, reply=msg.data[:200].decode(errors="replace"))
        if batch.failed or batch.acked >= batch.expected:
            batch.done.set()

    def _to_spool(self) -> None:
        if self._queue:
            records, self._queue = self._queue, []
            self.spool.append(records)
            s = self.spool.stats
            dropped = (s.dropped_samples, s.dropped_faults)
            if dropped != self._last_drop_report:
                self._last_drop_report = dropped
                log.warning(
                    "spool full: dropped oldest records",
                    dropped_samples=s.dropped_samples,
                    dropped_inventories=s.dropped_inventories,
                    dropped_faults=s.dropped_faults,
                    max_bytes=self.spool.max_bytes,
                )


def _wire_bytes(r: Record) -> int:
    """Body and headers as the server counts them against `max_payload` (`NATS/1.0\r\n`, a
    `key: value\r\n` line each, a blank line)."""
    return len(r.body) + 12 + sum(len(k) + len(v) + 4 for k, v in r.headers.items())


def _error(reply: bytes) -> tuple[int, str] | None:
    """A JetStream error reply's (err_code, description), None if it is not one."""
    try:
        error = json.loads(reply)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(error, dict):
        return None
    return int(error.get("err_code") or 0), str(error.get("description", "refused"))
