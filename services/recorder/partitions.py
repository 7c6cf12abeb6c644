"""Which telemetry partitions this recorder consumes, shared out among the live recorders.

Every partition stream TELEMETRY_P<i> has a leader lease (`services.runtime.lease.LeaderLease`,
name `recorder-p<i>`): its holder runs the consumer of that partition. Each recorder also renews a
key in a KV bucket whose entries expire (`chamber_recorders`), so every recorder knows how many are
alive, and holds at most its fair share, ceil(partitions / recorders): a recorder that joins takes
free leases, one holding more than its share releases the surplus, and a recorder that dies lets its
leases expire, for the others to take. With one recorder it owns all partitions.

Ownership balances work, it does not guard correctness: every recorder uses the same durable
consumer on a partition, so even two recorders on one partition (during a hand-over) each get
different messages, and the warehouse writer de-duplicates redelivered batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import zlib
from collections.abc import Awaitable, Callable

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from events.partitions import partition_stream
from events.subjects import token
from services.runtime.buckets import live_keys
from services.runtime.consumer import Consumer
from services.runtime.host import ServiceContext
from services.runtime.lease import LeaderLease
from services.runtime.logs import get_logger
from services.runtime.partitions import existing_partitions
from services.runtime.replicas import replicas_for

log = get_logger("chamber.recorder.partitions")
MEMBERS_BUCKET = "chamber_recorders"
Start = Callable[[str], Awaitable[None]]
Stop = Callable[[str], Awaitable[None]]


def fair_share(partitions: int, members: int) -> int:
    return math.ceil(partitions / max(1, members))


def preference(holder: str, streams: list[str]) -> list[str]:
    """The order in which a recorder tries free partitions: rotated by its own hash, so recorders
    starting together reach for different partitions first."""
    if not streams:
        return []
    k = zlib.crc32(holder.encode()) % len(streams)
    return streams[k:] + streams[:k]


class PartitionOwnership:
    def __init__(
        self,
        js: JetStreamContext,
        streams: list[str],
        holder: str,
        *,
        start: Start,
        stop: Stop,
        ttl_s: float = 15.0,
    ) -> None:
        self.js = js
        self.streams = streams
        self.holder = holder
        self.ttl_s = ttl_s
        self._start, self._stop = start, stop
        self.leases = {
            s: LeaderLease(js, f"recorder-{s.lower()}", holder, ttl_s=ttl_s, service="recorder") for s in streams
        }
        self.owned: set[str] = set()
        self.members = 1
        self._kv: KeyValue | None = None

    async def _members(self) -> int:
        """Renew our membership and count the live recorders."""
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(MEMBERS_BUCKET)
            except BucketNotFoundError:
                self._kv = await self.js.create_key_value(
                    bucket=MEMBERS_BUCKET, history=1, ttl=self.ttl_s, replicas=replicas_for(self.js)
                )
        await self._kv.put(token(self.holder), b"")
        # from the stream's subjects: `KeyValue.keys()` missed keys while others changed
        return max(1, len(await live_keys(self.js, self._kv, MEMBERS_BUCKET)))

    async def round(self) -> None:
        """One pass: renew what we hold, give back the surplus, take free partitions up to our share."""
        self.members = await self._members()
        share = fair_share(len(self.streams), self.members)
        for stream in sorted(self.owned):
            lease = self.leases[stream]
            if not await lease.try_acquire_or_renew() or not lease.is_leader:
                await self._drop(stream, "lease lost")
        for stream in sorted(self.owned, reverse=True)[: max(0, len(self.owned) - share)]:
            await self.leases[stream].release()
            await self._drop(stream, "over fair share")
        for stream in preference(self.holder, self.streams):
            if len(self.owned) >= share:
                break
            if stream not in self.owned and await self.leases[stream].try_acquire_or_renew():
                self.owned.add(stream)
                log.info("partition taken", stream=stream, holder=self.holder, share=share, members=self.members)
                await self._start(stream)

    async def _drop(self, stream: str, why: str) -> None:
        self.owned.discard(stream)
        log.info("partition given up", stream=stream, holder=self.holder, why=why)
        await self._stop(stream)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(self.round(), timeout=self.ttl_s / 3)
                except (nats.errors.Error, TimeoutError) as exc:  # NATS away: leases lapse on their own
                    log.warning("partition round failed", holder=self.holder, error=repr(exc))
                    for stream in [s for s in self.owned if not self.leases[s].is_leader]:
                        await self._drop(stream, "lease lapsed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.ttl_s / 3)
        finally:
            for stream in sorted(self.owned):
                await self._drop(stream, "stopping")
                with contextlib.suppress(Exception):
                    await self.leases[stream].release()
            if self._kv is not None:
                with contextlib.suppress(Exception):
                    await self._kv.delete(token(self.holder))


async def own_partitions(
    ctx: ServiceContext,
    make_consumer: Callable[[str], Consumer],
    *,
    holder: str | None = None,
    ttl_s: float = 15.0,
) -> PartitionOwnership | None:
    """Run, in the service `ctx`, a consumer (`make_consumer(stream)`) on every telemetry partition
    this recorder owns, starting and stopping them as the ownership moves. None: no partitions."""
    streams = [partition_stream(i) for i in await existing_partitions(ctx.js)]
    if not streams:
        return None
    running: dict[str, tuple[Consumer, asyncio.Event, asyncio.Task[None]]] = {}
    handing_over: set[asyncio.Task[None]] = set()

    async def start(stream: str) -> None:
        consumer, stopped = make_consumer(stream), asyncio.Event()
        ctx.consumers.append(consumer)
        running[stream] = (consumer, stopped, asyncio.create_task(consumer.run(stopped)))

    async def stop(stream: str) -> None:
        consumer, stopped, task = running.pop(stream)
        stopped.set()  # the batch in hand is stored and acked first

        async def hand_over() -> None:
            with contextlib.suppress(Exception):
                await task
                # A pull request still open delivers until it expires: let it, then give what came
                # back to the next owner at once (nak) instead of after the ack wait.
                await asyncio.sleep(consumer.options.fetch_timeout_s + 0.2)
                for msg in getattr(consumer, "_ready", []):
                    await msg.nak()
                await consumer.unsubscribe()
            ctx.consumers.remove(consumer)

        pending = asyncio.create_task(hand_over())  # in the background: lease rounds stay short
        handing_over.add(pending)
        pending.add_done_callback(handing_over.discard)

    holder = holder or f"{os.environ.get('POD_NAME') or socket.gethostname()}:{os.getpid()}"
    ownership = PartitionOwnership(ctx.js, streams, holder, start=start, stop=stop, ttl_s=ttl_s)
    ctx.task(lambda: ownership.run(ctx.stop))
    return ownership
