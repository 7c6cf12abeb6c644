"""Re-run a logged scheduling cycle: `chamber scheduler replay --positions FILE --now T`.

The scheduler logs each cycle that decided something (`cycle`, services/scheduler/service.py) with
the stream positions it had folded, its time (`at`) and the mark of the cycle before it (`since`:
what an incremental cycle starts from; null for a full one). Here the same manifest (inputs,
initial state with the service's settings, `evolve`) folds every input from the start up to those
positions, in the host's replay order (stream timestamp, input, sequence), and the same pure
`schedule(state, now, since)` runs again: it decides the same events with the same ids, because the
fold is deterministic and the cores fold any interleaving of their streams to one state
(tests/conformance). What it cannot see: facts a scheduler with `--kubernetes` folds from its
workload listings rather than from the log.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from events.codec import DEFAULT_MAX_BYTES, DecodeError, UnknownEventType, decode_event
from services.runtime.consumer import ephemeral_name
from services.runtime.decider import Decider, Input
from services.runtime.pull import BatchPuller, Position, position
from services.scheduler.core import CycleMark, SchedulerState, events_for, schedule
from services.scheduler.core.policy import Policy

S = TypeVar("S")
BATCH = 2000
FETCH_TIMEOUT_S = 2.0


class ReplayError(Exception):
    """The record cannot be replayed (a user's mistake: said without a traceback)."""


# -- the mark in a log line ---------------------------------------------------------------------
def mark_record(mark: CycleMark | None) -> dict[str, Any] | None:
    """A cycle mark as plain JSON values (infinity as null: JSON has none)."""
    if mark is None:
        return None
    out: dict[str, Any] = msgspec.to_builtins(mark)
    if math.isinf(mark.guard_at):
        out["guard_at"] = None
    return out


def mark_from_record(record: Mapping[str, Any] | None) -> CycleMark | None:
    if record is None:
        return None
    values = dict(record)
    if values.get("guard_at") is None:
        values["guard_at"] = math.inf
    try:
        return msgspec.convert(values, CycleMark)
    except msgspec.ValidationError as exc:
        raise ReplayError(f"the cycle's `since` mark does not read: {exc}") from None


# -- folding up to positions ----------------------------------------------------------------------
@dataclass
class _Reader:
    index: int
    spec: Input
    until: int  # the last sequence to fold
    puller: BatchPuller | None = None
    buffer: deque[tuple[Position, Msg]] = field(default_factory=deque)
    done: bool = False

    async def open(self, nc: Client) -> None:
        if self.until <= 0:
            self.done = True
            return
        js = nc.jetstream()
        filters = list(self.spec.subjects)
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=1,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
            inactive_threshold=30.0,
            name=ephemeral_name(),
        )
        info = await js.add_consumer(self.spec.stream, config)
        self.puller = BatchPuller(nc, self.spec.stream, info.name)
        await self.puller.start()

    async def refill(self) -> None:
        """The next batch up to `until`; done once it is reached or the stream has no more."""
        assert self.puller is not None
        while not self.buffer and not self.done:
            msgs = await self.puller.fetch(BATCH, FETCH_TIMEOUT_S)
            if not msgs and self.puller.ended_empty:
                self.done = True  # the stream ends before `until` (trimmed, or another server)
            for msg in msgs:
                pos = position(msg)
                if pos.stream_seq > self.until:
                    self.done = True
                    break
                self.buffer.append((pos, msg))
                if pos.stream_seq == self.until:
                    self.done = True
                    break

    async def close(self) -> None:
        if self.puller is not None:
            await self.puller.close(hand_back=False)


async def fold_to(nc: Client, decider: Decider[S], positions: Mapping[str, int]) -> tuple[S, int]:
    """The decider's state with every input folded up to its position, in the host's replay order;
    returns it and the count of events folded. An input the positions do not name is not read."""
    state = decider.initial()
    readers = [_Reader(i, spec, int(positions.get(spec.stream, 0))) for i, spec in enumerate(decider.inputs)]
    folded = 0
    try:
        for reader in readers:
            await reader.open(nc)
        while True:
            for reader in readers:
                if not reader.buffer and not reader.done:
                    await reader.refill()
            heads = [r for r in readers if r.buffer]
            if not heads:
                return state, folded
            first = min(heads, key=lambda r: (r.buffer[0][0].timestamp_ns, r.index))
            _, msg = first.buffer.popleft()
            folded += _fold_one(decider, state, msg)
    finally:
        for reader in readers:
            await reader.close()


def _fold_one(decider: Decider[S], state: S, msg: Msg) -> int:
    """As the host folds a message: unknown types skipped, poison and failing events left out."""
    try:
        event, event_id = decode_event(msg.headers, msg.data, max_bytes=DEFAULT_MAX_BYTES)
    except (UnknownEventType, DecodeError):
        return 0
    try:
        if decider.evolve_with_id:
            decider.evolve(state, event, event_id)  # type: ignore[call-arg]
        else:
            decider.evolve(state, event)
    except Exception:  # the host dead-letters it and folds on
        return 0
    return 1


# -- the cycle again ------------------------------------------------------------------------------
def rerun(state: SchedulerState, now: float, since: CycleMark | None, policy: Policy) -> dict[str, Any]:
    """The cycle `schedule` decides from this state at `now`: its events' types, jobs and ids."""
    cycle = schedule(state, now, since, policy=policy)
    decisions = [
        {"id": event_id, "event": type(event).__name__, "job_id": getattr(event, "job_id", "")}
        for event, event_id in events_for(cycle.decisions, now)
    ]
    return {"at": now, "full": cycle.full, "considered": cycle.considered, "decisions": decisions}


def cycle_record(text: str) -> dict[str, Any]:
    """The logged cycle in FILE: one JSON object, or a JSON-lines log (its last line with positions)."""
    candidates = [text, *reversed(text.splitlines())]
    for chunk in candidates:
        try:
            record = json.loads(chunk)  # Python's json, as the logs write it (infinity as `Infinity`)
        except ValueError:
            continue  # a log line that is not JSON
        if isinstance(record, dict) and isinstance(record.get("positions"), dict):
            return record
    raise ReplayError("no logged cycle in the file: it needs a JSON line with `positions` (the scheduler's `cycle`)")
