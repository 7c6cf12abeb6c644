"""The conformance suite every decider core passes (issue 14, item 4).

A `CoreSpec` says how to build, fold, decide and compare one core. The checks:
- `interleavings_fold_to_one_state`: any merge of the input streams that keeps each stream's own
  order folds to the same state (the host's merge is one of them; a live race is another);
- `snapshot_restore_continue`: folding a prefix, snapshotting (the service's own codec), restoring
  and folding the rest equals folding everything;
- `decide_only_reads`: `decide` leaves the state as it found it;
- `restart_mid_cycle`: a decision published but not yet folded when the process died is decided
  again with the same id (so JetStream de-duplicates it), and once folded is never decided again.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from events import Event, subject_for
from events.streams import stream_for

S = TypeVar("S")


def stream_of(event: Event) -> str:
    spec = stream_for(subject_for(event))
    assert spec is not None, f"no stream for {type(event).__name__}"
    return spec.name


@dataclass(frozen=True)
class CoreSpec(Generic[S]):
    name: str
    initial: Callable[[], S]
    evolve: Callable[[S, Event], object]
    snapshot: Callable[[S], S]  # encode + decode through the service's snapshot codec
    decide: Callable[[S, float], Sequence[tuple[Event, str]]] | None = None
    skip: frozenset[str] = field(default_factory=frozenset)  # fields that are caches, not facts


def canon(value: Any, skip: frozenset[str] = frozenset()) -> Any:
    """A comparable, order-free picture of a state: dataclasses by their fields (minus `skip` and
    private ones), dicts and sets sorted, floats rounded against summation-order noise."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple(
                (f.name, canon(getattr(value, f.name), skip))
                for f in dataclasses.fields(value)
                if not f.name.startswith("_") and f.name not in skip
            ),
        )
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        items = [(canon(k, skip), canon(v, skip)) for k, v in value.items()]
        return ("dict", tuple(sorted(items, key=repr)))
    if isinstance(value, set | frozenset):
        return ("set", tuple(sorted((canon(v, skip) for v in value), key=repr)))
    if isinstance(value, list | tuple):
        return tuple(canon(v, skip) for v in value)
    if isinstance(value, float):
        return round(value, 6)
    if hasattr(value, "__struct_fields__"):  # msgspec structs (event payloads kept in state)
        return (type(value).__name__, tuple((f, canon(getattr(value, f), skip)) for f in value.__struct_fields__))
    return value


def fold(spec: CoreSpec[S], log: Sequence[Event], state: S | None = None) -> S:
    s = spec.initial() if state is None else state
    for e in log:
        spec.evolve(s, e)
    return s


def interleave(log: Sequence[Event], seed: int) -> list[Event]:
    """A random merge of the log's streams that keeps each stream's own order."""
    queues: dict[str, list[Event]] = {}
    for e in log:
        queues.setdefault(stream_of(e), []).append(e)
    rng = random.Random(seed)
    heads = {k: 0 for k in queues}
    out: list[Event] = []
    while len(out) < len(log):
        k = rng.choice(sorted(k for k in queues if heads[k] < len(queues[k])))
        out.append(queues[k][heads[k]])
        heads[k] += 1
    return out


def interleavings_fold_to_one_state(spec: CoreSpec[S], log: Sequence[Event], seed: int) -> None:
    want = canon(fold(spec, log), spec.skip)
    got = canon(fold(spec, interleave(log, seed)), spec.skip)
    assert got == want


def snapshot_restore_continue(spec: CoreSpec[S], log: Sequence[Event], cut: int) -> None:
    cut = min(cut, len(log))
    restored = spec.snapshot(fold(spec, log[:cut]))
    assert canon(fold(spec, log[cut:], restored), spec.skip) == canon(fold(spec, log), spec.skip)


def decide_only_reads(spec: CoreSpec[S], log: Sequence[Event], now: float) -> None:
    assert spec.decide is not None
    state = fold(spec, log)
    before = canon(state, spec.skip)
    spec.decide(state, now)
    assert canon(state, spec.skip) == before


def restart_mid_cycle(spec: CoreSpec[S], log: Sequence[Event], now: float) -> None:
    assert spec.decide is not None
    state = fold(spec, log)
    first = list(spec.decide(spec.snapshot(state), now))
    # Died after publishing, before folding: the restarted process decides the same ids again.
    again = list(spec.decide(spec.snapshot(state), now))
    assert [i for _, i in again] == [i for _, i in first]
    # Restarted after the decisions reached the log: folding them, it decides none of them again.
    folded = fold(spec, [e for e, _ in first], spec.snapshot(state))
    later = {i for _, i in spec.decide(folded, now + 1.0)}
    assert not later & {i for _, i in first}


def no_reference_cycles(spec: CoreSpec[S], log: Sequence[Event], now: float) -> None:
    """Folding the log, deciding and folding the decisions back, then dropping it all leaves no cyclic
    garbage: the decider host freezes what a large section leaves alive (services/runtime/collector.py),
    and a frozen object that later becomes part of an unreachable cycle would never be freed."""
    import gc

    def run() -> None:
        state = fold(spec, log)
        for k in range(3 if spec.decide is not None else 0):
            assert spec.decide is not None
            fold(spec, [e for e, _ in spec.decide(state, now + 30.0 * k)], state)
        # (not the snapshot codec: building one, msgspec's type inspection leaves cycles of its own,
        # once per codec, and the host builds its codec once)

    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage
    try:
        run()
        gc.collect()
        cyclic = sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    assert cyclic == [], f"{spec.name} leaves reference cycles: {cyclic}"
