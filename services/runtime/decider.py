"""One host for every decider: a service is a manifest, the host does the rest once.

A service declares a `Decider`: its inputs (streams, optional subject filters), initial state,
`evolve`, `decide(state, now)` and its tick, snapshot codec and optional leader lease. The host:

- starts from the latest snapshot and the stream positions it covers (the tracking record), then
  folds the tail of every input; without a usable snapshot it folds from the start;
- folds all inputs in ONE deterministic order (below), in one task, so the state never depends on
  which stream's consumer ran ahead;
- decides "caught up" in one place (`caught_up`): every input consumer has nothing left to deliver
  and everything delivered is folded;
- runs `decide` on its tick only when caught up and leading, publishes the decisions with their
  deterministic ids (JetStream de-duplicates a decision published twice), and never folds them
  itself: its own decisions enter the state only when they come back from the log, like anyone
  else's, so any number of replicas fold the same log to the same state;
- logs the stream positions each cycle decided on, so a past decision can be re-run from them;
- serves the manifest's commands (`commands`, one path: services/runtime/command_path.py): waits
  until caught up, validates against the folded state, appends with the entity's expected subject
  sequence (`append`), and answers once the event is folded back;
- saves a snapshot (state + positions) every `snapshot_every_s` and when it stops.

Fold order. Each input is one ephemeral pull consumer (no acks: the snapshot, not the consumer, is
the tracking record). Messages are merged by (stream timestamp, input index, stream sequence): the
server stamps each message when it stores it, so the same log always merges the same way. A merge
step folds the smallest head only while no input is "behind" — has messages the server counted as
pending but not yet delivered to us — so replay from the start or from a snapshot folds in exactly
that order. Live, a message stored on one stream after another stream's message was already folded
is folded when it arrives (its timestamp is later anyway, except for clock differences between
stream leaders in a cluster); the cores do not depend on it: a decision event carries the facts it
was decided with, and the conformance suite folds random interleavings to one state.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import os
import pickle
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, DiscardPolicy, PubAck
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from events import Event, subject_for
from events.codec import DEFAULT_MAX_BYTES, H_MSG_ID, DecodeError, UnknownEventType, ce_value, decode_event
from events.streams import stream_for
from services.runtime.backoff import Backoff
from services.runtime.collector import paused_collector
from services.runtime.command_path import CommandPath
from services.runtime.commands import Command, CommandConflict
from services.runtime.consumer import FETCH_BACKOFF, ephemeral_name
from services.runtime.dead_letter import dead_letter
from services.runtime.host import ServiceContext
from services.runtime.lease import LeaderLease
from services.runtime.logs import get_logger
from services.runtime.pull import BatchPuller, Position, position
from services.runtime.snapshot_codec import packages_of, safe_loads, shape_digest
from services.runtime.snapshots import Snapshot, SnapshotStore

log = get_logger("chamber.runtime.decider")
S = TypeVar("S")
_YIELD_EVERY = 5000  # messages folded between two yields to the event loop during a long replay
APPEND_ATTEMPTS = 8  # about 10 s of retries: longer than a JetStream leader election
WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed Nats-Expected-Last-Subject-Sequence


DELIVER_MODES = {"all": DeliverPolicy.BY_START_SEQUENCE, "last_per_subject": DeliverPolicy.LAST_PER_SUBJECT}
DELIVER_MODES["new"] = DeliverPolicy.NEW


@dataclass(frozen=True)
class Input:
    stream: str
    subjects: tuple[str, ...] = ()  # empty: every subject of the stream
    # "all": from the start (or the snapshot's position); "last_per_subject": the latest message of
    # every subject, then live (a current picture, e.g. each node's last sample; not a resume point);
    # "new": only what arrives after the consumer is made (perf's telemetry: a rate is measured from
    # fresh samples, replaying an hour of them would only delay readiness). Neither is a resume point.
    deliver: str = "all"

    def __post_init__(self) -> None:
        if self.deliver not in DELIVER_MODES:
            raise ValueError(f"Input({self.stream!r}).deliver must be one of {sorted(DELIVER_MODES)}")


@dataclass(frozen=True)
class SnapshotCodec(Generic[S]):
    """How a state becomes bytes and back. `format` names encoding and version: a snapshot of
    another format is ignored (the host replays from the start instead)."""

    format: str
    encode: Callable[[S], bytes]
    decode: Callable[[bytes], S]


def pickle_codec(*shapes: type, version: int) -> SnapshotCodec[Any]:
    """Snapshots as pickle (it keeps the shared references and indexes of a state as they are),
    loaded through an allow-list of the core's own classes (`snapshot_codec.SafeUnpickler`: a
    snapshot naming anything else is refused, never run), and named by the core's `version` and the
    fields of the `shapes`: a snapshot of another state version is refused and the host replays from
    the start; one written by a build that changed only comments or code outside the state restores."""
    packages = packages_of(shapes)
    return SnapshotCodec(
        format=f"pickle-{pickle.DEFAULT_PROTOCOL}-v{version}-{shape_digest(shapes)}",
        encode=lambda state: pickle.dumps(state, protocol=pickle.DEFAULT_PROTOCOL),
        decode=lambda data: safe_loads(data, packages),
    )


def snapshot_format(codec: SnapshotCodec[S] | None, initial: S) -> str:
    """The codec's format and a digest of the initial state, which holds the service's settings
    (retention, period, half-life...): a snapshot taken under other settings is refused, as its
    state was folded under them (a job dropped by a shorter retention would not come back)."""
    if codec is None:
        return ""
    return f"{codec.format}-{hashlib.sha256(codec.encode(initial)).hexdigest()[:8]}"


Decisions = Sequence[tuple[Event, str]]  # (event, deterministic id)


@dataclass(frozen=True)
class Decider(Generic[S]):
    name: str
    inputs: tuple[Input, ...]
    initial: Callable[[], S]
    evolve: Callable[[S, Event], object]  # may mutate the state in place
    decide: Callable[[S, float], Decisions] | None = None
    tick_s: float = 1.0
    snapshot: SnapshotCodec[S] | None = None
    snapshot_every_s: float = 300.0
    lease: str = ""  # a leader lease name: only its holder decides; empty: always decide
    lease_ttl_s: float = 15.0
    echo_timeout_s: float = 10.0  # decide again if own decisions did not come back by then
    batch: int = 1000
    evolve_with_id: bool = False  # call evolve(state, event, event_id) (a core that de-duplicates by id)
    # Called with each event folded once the host is ready (live, not replay): a shell that acts on the
    # outside world from the log (health patching Kubernetes Nodes) does it here, whoever decided.
    on_event: Callable[[Event], object] | None = None
    # Also decide right after a live batch is folded, not only on the tick (health answers a fault in
    # milliseconds rather than up to `tick_s`); the tick still runs, for decisions that only time makes.
    decide_on_fold: bool = False
    # The verbs it answers (chamber.cmd.<name>.<verb>): pure reads and validations, served by the host.
    commands: tuple[Command[S, Any], ...] = ()


@dataclass
class _Source:
    index: int
    spec: Input
    consumer: str = ""
    puller: BatchPuller | None = None
    buffer: deque[tuple[Position, Msg]] = field(default_factory=deque)
    pending: int = 0  # what the server still had for us after the last message we saw
    received: int = 0  # messages this consumer delivered to us (its consumer sequence, on our side)


@dataclass
class HostStats:
    taken: int = 0  # messages read from the inputs since start (folded, skipped or dead-lettered)
    folded: int = 0
    skipped: int = 0
    dead: int = 0
    cycles: int = 0
    decisions: int = 0
    snapshots: int = 0
    restored_from: dict[str, int] = field(default_factory=dict)
    # stream -> (first sequence not folded, first sequence the stream still has): history trimmed
    # before this service folded it (no snapshot covers it); the state misses what was there
    trimmed: dict[str, tuple[int, int]] = field(default_factory=dict)
    ready_after_s: float | None = None


class DeciderHost(Generic[S]):
    def __init__(self, decider: Decider[S], ctx: ServiceContext, *, store: SnapshotStore | None = None) -> None:
        self.decider = decider
        self.ctx = ctx
        self.state: S = decider.initial()
        self.snapshot_format = snapshot_format(decider.snapshot, self.state)
        self.positions: dict[str, int] = {}
        self.sources = [_Source(i, spec) for i, spec in enumerate(decider.inputs)]
        self.store = store or SnapshotStore(ctx.js)
        self.lease: LeaderLease | None = None
        self.ready = False  # caught up once since start: commands and reads are answered
        self.caught_up_event = asyncio.Event()  # set with `ready`, for whoever waits on it
        self.synced = False  # leading and caught up since leadership began: decisions allowed
        self.lead_epoch = 0  # bumped each time deciding (re)starts: a service drops per-cycle memos then
        self.stats = HostStats()
        self.awaiting: set[str] = set()
        self.awaiting_since = 0.0
        self._folded = asyncio.Condition()
        self._background: set[asyncio.Task[object]] = set()
        self._started = time.monotonic()
        self._last_snapshot = time.monotonic()
        self._changed_since_snapshot = False
        self._deciding: asyncio.Task[None] | None = None
        self._decide_again = False  # folded since the last decision pass began
        # The timer and the after-fold pass both call `tick`: one at a time, else both could pass the
        # "caught up" check of a new leader and publish the same decisions twice (JetStream drops the
        # duplicates, but core subscribers saw both; a flaky health e2e test caught it).
        self._tick_lock = asyncio.Lock()

    # -- wiring --------------------------------------------------------------------------------
    def install(self) -> None:
        """Register the host's tasks on the service context (call from the service's `setup`)."""
        d, ctx = self.decider, self.ctx
        if d.lease.strip():
            holder = f"{os.environ.get('POD_NAME') or socket.gethostname()}:{os.getpid()}"
            lease = LeaderLease(ctx.js, d.lease.strip(), holder, ttl_s=d.lease_ttl_s, service=ctx.name)
            self.lease = lease
            ctx.task(lambda: lease.run(ctx.stop, self._on_leadership))
        if ctx.health_state is not None:  # /readyz answers 503 and /metrics says so until caught up
            ctx.health_state.replaying = self.replaying
        ctx.task(self._run)
        CommandPath(self).install()
        ctx.every(d.tick_s, self.tick)
        ctx.every(min(d.tick_s, 0.25), self._check_ready)  # ready soon after catching up, whatever the tick
        if d.snapshot is not None:
            ctx.every(min(d.snapshot_every_s, 30.0), self._maybe_snapshot)

    @property
    def leading(self) -> bool:
        return self.lease is None or self.lease.is_leader

    async def _on_leadership(self, leading: bool) -> None:
        self.synced = False  # a new leader folds whatever the previous one published first
        self.awaiting.clear()

    # -- start: snapshot + positions -----------------------------------------------------------
    async def restore(self) -> None:
        """Load the latest snapshot and the positions it covers. Every outcome is logged once: the
        restore with its positions and how long it took, or why the host folds from the start."""
        codec = self.decider.snapshot
        if codec is None:
            return
        name = self.decider.name
        began = time.monotonic()
        try:
            snap = await self.store.load(name)
        except Exception as exc:  # a broken store must not keep the service from replaying
            log.warning("snapshot unreadable; folding from the start", service=name, error=repr(exc))
            return
        if snap is None:
            log.info("no snapshot; folding from the start", service=name)
            return
        if snap.format != self.snapshot_format:
            log.info(
                "snapshot of another state version or settings; folding from the start",
                service=name,
                have=snap.format,
                want=self.snapshot_format,
            )
            return
        try:
            state = codec.decode(snap.state)
        except Exception as exc:
            log.warning("snapshot does not decode; folding from the start", service=name, error=repr(exc))
            return
        self.state, self.positions = state, dict(snap.positions)
        self.stats.restored_from = dict(snap.positions)
        log.info(
            "state restored from snapshot",
            service=name,
            positions=snap.positions,
            bytes=len(snap.state),
            seconds=round(time.monotonic() - began, 3),
        )

    async def _open(self, source: _Source) -> None:
        spec = source.spec
        from_position = spec.deliver == "all"
        start = self.positions.get(spec.stream, 0) + 1
        filters = list(spec.subjects)
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,  # the snapshot is the tracking record; nothing to redeliver
            deliver_policy=DELIVER_MODES[spec.deliver],
            opt_start_seq=start if from_position else None,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
            inactive_threshold=60.0,  # the server removes it when we are gone
            max_deliver=-1,
            name=ephemeral_name(),  # created by name: the roles refuse the unnamed form on event streams
        )
        # with its stream's replicas: an R1 consumer dies with its server, and the fold with it
        stream = await self.ctx.js.stream_info(spec.stream)
        config.num_replicas = stream.config.num_replicas or 1
        first = stream.state.first_seq or 0
        c = stream.config
        # nothing ages it out: no age, and its other limits (if any) refuse new messages, never drop old
        # ones; a per-subject limit rolls its subjects (DISPATCH's heartbeats), so the head moves on its own
        unbounded = (c.max_bytes or -1) < 0 and (c.max_msgs or -1) < 0
        rolls = (c.max_msgs_per_subject or -1) > 0
        kept = not c.max_age and not rolls and (c.discard == DiscardPolicy.NEW or unbounded)
        if kept and from_position and start < first and start <= (stream.state.last_seq or 0):
            # The snapshot is the base of replay: trimming below it is safe, trimming above it is not.
            self.stats.trimmed[spec.stream] = (start, first)
            log.error(
                "history trimmed before this service folded it: the state misses those events",
                service=self.decider.name,
                stream=spec.stream,
                folded_up_to=start - 1,
                stream_starts_at=first,
            )
        info = await self.ctx.js.add_consumer(spec.stream, config)
        source.consumer = info.name
        source.pending = info.num_pending or 0
        source.received = 0
        source.buffer.clear()
        if source.puller is not None:
            await source.puller.close(hand_back=False)
        source.puller = BatchPuller(self.ctx.nc, spec.stream, info.name, eager=True)
        await source.puller.start()

    # -- the fold loop -------------------------------------------------------------------------
    async def _run(self) -> None:
        stop = self.ctx.stop
        await self.restore()
        backoff = 0.0
        try:
            if not await self._open_all():
                return
            while not stop.is_set():
                if backoff:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=backoff)
                try:
                    await self._step()
                    backoff = 0.0
                except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                    return
                except (nats.errors.Error, APIError) as exc:  # server restarting, consumer gone...
                    log.warning("fold loop: fetch failed", service=self.decider.name, error=repr(exc))
                    backoff = FETCH_BACKOFF.next(backoff)
                    if "409" in str(exc) or isinstance(exc, APIError):
                        await self._reopen()
        finally:
            for source in self.sources:
                if source.puller is not None:
                    await source.puller.close(hand_back=False)
            if self.decider.snapshot is not None and self.ready:
                with contextlib.suppress(Exception):
                    await self.save_snapshot(time.time())

    async def _open_all(self) -> bool:
        """Open every input; a bus that goes away or restarts meanwhile is waited for, not fatal
        (False: asked to stop first)."""
        wait = 0.0
        while not self.ctx.stop.is_set():
            try:
                for source in self.sources:
                    await self._open(source)
                return True
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                return False
            except (nats.errors.Error, APIError) as exc:
                wait = FETCH_BACKOFF.next(wait)
                log.warning("opening the inputs failed, retrying", service=self.decider.name, error=repr(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.ctx.stop.wait(), timeout=wait)
        return False

    async def _reopen(self) -> None:
        """Consumers lost (server restart without their state): resume each from what was folded."""
        with contextlib.suppress(Exception):
            for source in self.sources:
                await self._open(source)

    async def _step(self) -> None:
        """Take what arrived, ask for more where a buffer is empty, fold what the merge allows."""
        batch = self.decider.batch
        for source in self.sources:
            puller = source.puller
            assert puller is not None
            for msg in puller.take():
                source.buffer.append((position(msg), msg))
                source.received += 1
            if not source.buffer and puller.ended_empty:  # the server had nothing more for us
                source.pending = 0  # (purged, or all filtered)
            if len(source.buffer) <= batch:  # the next batch travels while this one is folded
                await puller.request(batch, 1.0)
        folded = await self._merge()
        if folded:
            async with self._folded:
                self._folded.notify_all()
            if self.decider.decide_on_fold and self.ready:
                self._decide_again = True
                if self._deciding is None or self._deciding.done():
                    self._deciding = asyncio.get_running_loop().create_task(self._decide_now())
            await asyncio.sleep(0)  # let commands and ticks in between batches
            return
        pullers = [s.puller.wake for s in self.sources if s.puller is not None]
        waits = [asyncio.ensure_future(w.wait()) for w in pullers]
        stop = asyncio.ensure_future(self.ctx.stop.wait())
        try:
            await asyncio.wait([*waits, stop], timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in (*waits, stop):
                w.cancel()

    async def _merge(self) -> int:
        """Fold the smallest head by (timestamp, input, sequence) while no input is behind.

        The smallest head's input is folded in one run up to the next input's head: no other buffer
        changes meanwhile (only `_step` fills them), so this is the one-message-at-a-time merge
        without its per-message scan of every input."""
        sources = self.sources
        n = 0
        while True:
            best: _Source | None = None
            best_key: tuple[int, int] = (0, 0)
            limit: tuple[int, int] | None = None  # the second smallest head
            for s in sources:
                if not s.buffer:
                    if s.pending > 0:
                        return n  # this input has older messages on their way: wait for them
                    continue
                key = (s.buffer[0][0].timestamp_ns, s.index)
                if best is None or key < best_key:
                    if best is not None:
                        limit = best_key
                    best, best_key = s, key
                elif limit is None or key < limit:
                    limit = key
            if best is None:
                return n
            n += self._fold_run(best, limit, _YIELD_EVERY - n % _YIELD_EVERY)
            if n % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a long replay still answers health checks and commands

    def _fold_run(self, source: _Source, limit: tuple[int, int] | None, budget: int) -> int:
        """Decode and evolve `source`'s messages while they come before `limit` (at most `budget`):
        synchronous, no task or await per message, the loop's names bound once."""
        buffer, index, stream = source.buffer, source.index, source.spec.stream
        evolve, with_id, state = self.decider.evolve, self.decider.evolve_with_id, self.state
        positions, awaiting = self.positions, self.awaiting
        on_event = self.decider.on_event if self.ready else None
        taken = folded = 0
        with paused_collector():  # one synchronous run: services/runtime/collector.py
            while buffer and taken < budget:
                item = buffer.popleft()
                pos, msg = item
                if limit is not None and (pos.timestamp_ns, index) >= limit:
                    buffer.appendleft(item)  # the next input's head comes first
                    break
                taken += 1
                source.pending = pos.pending  # what the server still had after this one
                positions[stream] = pos.stream_seq
                try:
                    event, event_id = decode_event(msg.headers, msg.data, max_bytes=DEFAULT_MAX_BYTES)
                except UnknownEventType:
                    self.stats.skipped += 1
                    continue
                except DecodeError as exc:
                    self._dead_letter(source, msg, exc.reason, exc.detail)
                    continue
                try:
                    if with_id:
                        evolve(state, event, event_id)  # type: ignore[call-arg]
                    else:
                        evolve(state, event)
                except Exception as exc:
                    # A core bug on a well-formed event: it would fail again at every replay, so the
                    # service would crash-loop on it. Every replica and every replay skips it alike.
                    self._dead_letter(source, msg, "evolve_failed", f"{type(exc).__name__}: {exc}")
                    continue
                folded += 1
                if awaiting:
                    awaiting.discard(event_id)
                if on_event is not None:
                    self._on_event(event)
        self.stats.taken += taken
        if folded:
            self.stats.folded += folded
            self._changed_since_snapshot = True
        return taken

    def _on_event(self, event: Event) -> None:
        assert self.decider.on_event is not None
        try:
            self.decider.on_event(event)
        except Exception as exc:  # acting on one event must not stop the fold
            log.warning("on_event failed", service=self.decider.name, event_type=type(event).__name__, error=repr(exc))

    def _dead_letter(self, source: _Source, msg: Msg, reason: str, detail: str) -> None:
        """Copy a poison message to chamber.dead.<stream> with the reason (in the background)."""
        self.stats.dead += 1
        log.warning("dead-lettering message", stream=source.spec.stream, subject=msg.subject, reason=reason)
        task = asyncio.get_running_loop().create_task(
            dead_letter(
                self.ctx.js,
                msg,
                stream=source.spec.stream,
                consumer=f"{self.decider.name}-host",
                reason=reason,
                detail=detail,
            )
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- caught up -----------------------------------------------------------------------------
    async def caught_up(self) -> bool:
        """The one definition: every input's consumer has nothing pending on the server, and
        everything it delivered has reached us and been folded. Counted by the consumer's own
        sequence, not the stream's: a filtered consumer's delivered stream sequence moves past the
        messages its filter skipped, which never come to us."""
        for source in self.sources:
            if not source.consumer or source.buffer or (source.puller is not None and source.puller.ready):
                return False
            try:
                info = await self.ctx.js.consumer_info(source.spec.stream, source.consumer)
            except Exception:
                return False
            delivered = info.delivered.consumer_seq if info.delivered is not None else 0
            if info.num_pending or (delivered or 0) > source.received:
                return False  # still on the server, or on the wire to us
        return True

    def progress(self) -> tuple[int, int]:
        """(messages read since start, that plus what the servers still hold for our consumers)."""
        return self.stats.taken, self.stats.taken + sum(s.pending for s in self.sources)

    @property
    def resyncing(self) -> bool:
        """A new leader folding what the previous one published before it decides (`_tick`)."""
        return self.decider.decide is not None and self.lease is not None and self.leading and not self.synced

    def replaying(self) -> str | None:
        """Why this service is not serving yet: "replaying: folded N of M" until caught up once, and
        again while a new leader re-syncs; None when caught up."""
        if self.ready and not self.resyncing:
            return None
        if not all(s.consumer for s in self.sources):
            return "replaying: opening the inputs"
        done, total = self.progress()
        what = "replaying" if not self.ready else "replaying (new leader re-syncing)"
        return f"{what}: folded {done} of {total}"

    def inject(self, item: object) -> None:
        """Fold a fact from outside the log (e.g. a Kubernetes listing) at this point of the fold."""
        self.decider.evolve(self.state, item)  # type: ignore[arg-type]
        self._changed_since_snapshot = True

    async def wait_folded(self, stream: str, seq: int, timeout: float = 5.0) -> bool:
        """Wait until `stream` has been folded up to `seq` (read your own writes)."""

        async def reached() -> None:
            async with self._folded:
                await self._folded.wait_for(lambda: self.positions.get(stream, 0) >= seq)

        try:
            await asyncio.wait_for(reached(), timeout)
        except TimeoutError:
            return False
        return True

    # -- tick: decide ----------------------------------------------------------------------------
    async def _check_ready(self, now: float) -> None:
        if not self.ready:
            await self._become_ready()

    async def _become_ready(self) -> bool:
        if self.ready:
            return True
        if not await self.caught_up():
            return False
        if not self.ready:
            self.ready = True
            self.caught_up_event.set()
            self.stats.ready_after_s = time.monotonic() - self._started
            log.info(
                "caught up",
                service=self.decider.name,
                folded=self.stats.folded,
                positions=self.positions,
                seconds=round(self.stats.ready_after_s, 3),
            )
            gc.collect()
            gc.freeze()  # the rebuilt state lives on: keep the collector from walking it every cycle
        return True

    async def _decide_now(self) -> None:
        """Decision passes while batches keep being folded (one at a time; the tick is the fallback)."""
        while self._decide_again and not self.ctx.stop.is_set():
            self._decide_again = False
            try:
                await self.tick(time.time())
            except Exception as exc:  # the tick retries; a failed pass must not go unseen or kill anything
                log.warning("decision after fold failed", service=self.decider.name, error=repr(exc))
                return

    async def tick(self, now: float) -> None:
        async with self._tick_lock:
            await self._tick(now)

    async def _tick(self, now: float) -> None:
        if not await self._become_ready():
            return
        decide = self.decider.decide
        if decide is None:
            return
        if not self.leading:
            self.synced = False
            return
        if not self.synced:
            if not await self.caught_up():
                return
            self.synced = True
            self.lead_epoch += 1
            self.awaiting.clear()
            log.info("leading: deciding", service=self.decider.name, positions=self.positions)
        if self.awaiting:
            if now - self.awaiting_since < self.decider.echo_timeout_s:
                return
            log.warning("own decisions did not come back; deciding again", missing=len(self.awaiting))
            self.awaiting.clear()
        positions = dict(self.positions)
        with paused_collector():  # synchronous: services/runtime/collector.py
            out = decide(self.state, now)
        self.stats.cycles += 1
        if not out or not self.leading:  # the lease may have lapsed while deciding
            return
        self.awaiting = {eid for _, eid in out}
        self.awaiting_since = now
        acks = await self.ctx.publisher.publish_many((event, eid, now) for event, eid in out)
        for (_, eid), ack in zip(out, acks, strict=True):
            if ack.duplicate:  # already in the log (a replayed decision): it will not come back
                self.awaiting.discard(eid)
        self.stats.decisions += len(out)
        # The positions this cycle decided on: `chamber explain` / the simulator re-run it from them.
        log.info("cycle", service=self.decider.name, positions=positions, decisions=len(out), at=now)

    # -- commands --------------------------------------------------------------------------------
    async def entity_seq(self, stream: str, subject: str, timeout: float = 5.0) -> int:
        """The last sequence of an entity's subject (0: none yet), once this host has folded it: a
        command validated against the state now sees the entity's latest event, and appending with
        `expected_subject_seq` set to it refuses the command if anything reached the entity since
        (of two concurrent commands on one entity, exactly one wins)."""
        try:
            msg = await self.ctx.js.get_last_msg(stream, subject)
        except NotFoundError:
            return 0
        seq = int(msg.seq or 0)
        if not await self.wait_folded(stream, seq, timeout):
            raise CommandConflict(f"{subject} is not folded up to {seq} yet; try again")
        return seq

    async def append(self, event: Event, *, id: str, expected_subject_seq: int | None, wait: bool = True) -> int:
        """Publish a command's event; with `expected_subject_seq` (0: a new entity) the stream refuses
        it when the subject moved on (`CommandConflict`). With `wait`, returns once it is folded."""
        backoff = Backoff(first_s=0.2, max_s=2.0)
        for attempt in range(1, APPEND_ATTEMPTS + 1):
            try:
                ack = await self.ctx.publisher.publish(event, id=id, expected_last_subject_seq=expected_subject_seq)
                break
            except APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    raise
                # The stream checks the expected sequence before it de-duplicates: an earlier try that
                # landed but whose ack was lost makes this one "wrong last sequence". It is ours if
                # the subject's last message carries our id.
                landed = await self._landed(event, id) if attempt > 1 else None
                if landed is None:
                    raise CommandConflict(str(exc.description)) from None
                ack = landed
                break
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, NoStreamResponseError) as exc:
                # a stream electing a new leader (a server just died): try again; the id de-duplicates
                # a try that did land but whose ack was lost
                if attempt == APPEND_ATTEMPTS:
                    raise
                log.warning("append not acknowledged, retrying", stream_subject=id, attempt=attempt, error=repr(exc))
                await asyncio.sleep(backoff.for_attempt(attempt))
        if ack.duplicate and expected_subject_seq is not None and attempt == 1:
            raise CommandConflict("the same command was appended already")
        if wait:
            await self.wait_folded(ack.stream, ack.seq)
        return ack.seq

    async def _landed(self, event: Event, id: str) -> PubAck | None:
        """The ack of an earlier try of this append, if it is the last message on its subject."""
        subject = subject_for(event)
        spec = stream_for(subject)
        if spec is None:
            return None
        try:
            last = await self.ctx.js.get_last_msg(spec.name, subject)
        except NotFoundError:
            return None
        if (last.headers or {}).get(H_MSG_ID) != ce_value(id):
            return None
        log.info("append landed on an earlier try", stream=spec.name, seq=last.seq, id=id)
        return PubAck(stream=spec.name, seq=int(last.seq or 0), duplicate=True)

    # -- snapshots -------------------------------------------------------------------------------
    async def _maybe_snapshot(self, now: float) -> None:
        if not self.ready or not self._changed_since_snapshot:
            return
        if time.monotonic() - self._last_snapshot < self.decider.snapshot_every_s:
            return
        await self.save_snapshot(now)

    async def save_snapshot(self, now: float) -> int:
        codec = self.decider.snapshot
        if codec is None:
            return 0
        # Encoded in one go on the event loop: no fold runs in between, so state and positions agree.
        snap = Snapshot(
            service=self.decider.name,
            taken_at=now,
            positions=dict(self.positions),
            state=codec.encode(self.state),
            format=self.snapshot_format,
        )
        size = await self.store.save(snap)
        self._last_snapshot = time.monotonic()
        self._changed_since_snapshot = False
        self.stats.snapshots += 1
        log.info("snapshot saved", service=self.decider.name, positions=snap.positions, bytes=size)
        return size

    def health(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "leading": self.leading,
            "replaying": self.replaying(),
            "positions": dict(self.positions),
        }
