"""Lossless publishing: every record reaches its stream exactly once, in order, across NATS outages.

One pump task publishes everything, so order is kept:
- connected and nothing spooled: records go straight out (async publish, acks awaited per batch);
- a publish that fails or is not acknowledged in time, and everything queued after it, goes to the
  on-disk spool; so does everything submitted while NATS is unreachable;
- once connected again, the spool is flushed oldest first, and only then do new records go direct.

Every record carries its `Nats-Msg-Id` (node + sequence), so a record that reached the stream but
whose ack was lost is dropped by JetStream when it is sent again (within the stream's duplicate
window, 120 s for TELEMETRY).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.js import JetStreamContext

from node_agent.spool import Record, Spool
from services.runtime.logs import get_logger

log = get_logger("chamber.agent.outbox")


class Outbox:
    def __init__(
        self,
        spool: Spool,
        *,
        ack_timeout_s: float = 5.0,
        batch: int = 4000,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.spool = spool
        self.ack_timeout_s = ack_timeout_s
        self.batch = batch
        self.on_reconnect = on_reconnect
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self.published = 0
        self._queue: list[Record] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._needs_setup = True
        self._last_drop_report = (0, 0)

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
            if stop.is_set() and (not self._queue or not self.connected):
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
        if not self.spool.empty():
            self._to_spool()  # keep order: what is queued now comes after what was spooled
            return await self._flush_oldest_segment()
        if not self._queue:
            return False
        records, self._queue = self._queue[: self.batch], self._queue[self.batch :]
        ok = await self._publish(records)
        if ok < len(records):
            self._queue[:0] = records[ok:]
            self._to_spool()
            self._needs_setup = True
        return ok > 0

    async def _flush_oldest_segment(self) -> bool:
        oldest = self.spool.oldest()
        if oldest is None:
            return False
        n, records = oldest
        ok = await self._publish(records)
        self.spool.done(n, ok)
        if ok:
            log.info("spool flushed", records=ok, left=len(self.spool), bytes_left=self.spool.bytes)
        if ok < len(records):
            self._needs_setup = True
        return ok > 0

    async def _publish(self, records: list[Record]) -> int:
        """Publish in order; return how many from the start of `records` are surely in the stream."""
        js = self.js
        assert js is not None
        futures: list[asyncio.Future] = []
        for r in records:
            if not self.connected:
                break
            try:
                futures.append(await js.publish_async(r.subject, r.body, headers=r.headers))
            except Exception as exc:  # disconnected mid-batch, buffer full: the rest goes to the spool
                log.warning("publish failed", error=repr(exc))
                break
        if not futures:
            return 0
        # Wait for the acks, but give up early when the connection drops: they will not come.
        deadline = asyncio.get_running_loop().time() + self.ack_timeout_s
        pending: set[asyncio.Future] = set(futures)
        done: set[asyncio.Future] = set()
        while pending:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0 or not self.connected:
                break
            finished, pending = await asyncio.wait(pending, timeout=min(left, 0.2))
            done |= finished
        for f in pending:
            f.cancel()
        ok = 0
        for f in futures:
            if f in done and not f.cancelled() and f.exception() is None:
                ok += 1
            else:
                break
        for f in futures[ok:]:  # retrieve the exceptions so asyncio does not log them
            if f.done() and not f.cancelled():
                f.exception()
        self.published += ok
        return ok

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
