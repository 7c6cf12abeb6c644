"""Upcasters: older major versions of an event type, brought up to the current one by the codec.

A breaking change is a new major type (DESIGN.md, "Evolution"). The old major stays in the log (JOBS
is kept), so the codec decodes it by upcasting its JSON body step by step (v1 -> v2 -> ...) to the
type this build knows; the cores then fold one shape only and never special-case history. Each step
is a pure function of the old body: it may rename, fill or drop fields, never consult other events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from events.base import parse_event_type
from events.commands import DEFAULT_POOL

Body = dict[str, Any]
Step = Callable[[Body], Body]
_STEPS: dict[str, tuple[str, Step]] = {}  # old type -> (the next major's type, the step)


def upcaster(old: str, new: str) -> Callable[[Step], Step]:
    """Register `step` as turning a body of type `old` into one of `new` (its next major)."""
    parsed_old, parsed_new = parse_event_type(old), parse_event_type(new)
    assert parsed_old and parsed_new and parsed_old[:2] == parsed_new[:2] and parsed_new[2] == parsed_old[2] + 1

    def register(step: Step) -> Step:
        assert old not in _STEPS, f"two upcasters from {old}"
        _STEPS[old] = (new, step)
        return step

    return register


def can_upcast(ce_type: str) -> bool:
    return ce_type in _STEPS


def upcast(ce_type: str, body: Body) -> tuple[str, Body]:
    """The body brought up through every registered step, with the type it ends at."""
    while ce_type in _STEPS:
        ce_type, step = _STEPS[ce_type]
        body = step(body)
        body["type"] = ce_type  # the tag msgspec checks against the struct
    return ce_type, body


@upcaster("io.chamber.jobs.scheduled.v1", "io.chamber.jobs.scheduled.v2")
@upcaster("io.chamber.jobs.resumed.v1", "io.chamber.jobs.resumed.v2")
def _pool_becomes_required(body: Body) -> Body:
    """v2 always names the pool the job was admitted in. v1 named it only from the release that added
    the field; before, the fold guessed it from the quota state at that point of the replay (which
    depended on which stream's consumer ran ahead, issue 14). A v1 body without a pool is upcast to
    the default pool: a fixed answer, the same on every replay; only a job that was running in a team
    pool across that upgrade is counted in `default` until it ends."""
    return {**body, "pool": body.get("pool") or DEFAULT_POOL}


def lineage(ce_type: str) -> frozenset[str]:
    """`ce_type` and every older type upcast to it (a warehouse holds rows of each)."""
    older = {old for old, (new, _) in _STEPS.items() if new == ce_type}
    return frozenset({ce_type}.union(*(lineage(o) for o in older)))
