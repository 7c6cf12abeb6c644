"""The JetStream streams of the design: what each holds and for how long."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

MINUTE = 60.0
HOUR = 3600.0
DAY = 24 * HOUR
MIB = 1024 * 1024

# TELEMETRY keeps what the live services need, not history (the warehouse is the history): minutes,
# and a byte cap so a burst or a stalled recorder cannot fill the disk (the oldest go first).
TELEMETRY_MAX_AGE_S = 15 * MINUTE
TELEMETRY_MAX_BYTES = 1024 * MIB
# Operators change both with these, set alike for every process (`chamber up` flags, Helm values).
ENV_TELEMETRY_MAX_AGE = "CHAMBER_TELEMETRY_MAX_AGE_S"
ENV_TELEMETRY_MAX_BYTES = "CHAMBER_TELEMETRY_MAX_BYTES"


class Retention(StrEnum):
    LIMITS = "limits"
    INTEREST = "interest"
    WORK_QUEUE = "workqueue"


class Storage(StrEnum):
    FILE = "file"
    MEMORY = "memory"


@dataclass(frozen=True)
class StreamSpec:
    """One stream. `max_age_s` None keeps messages forever (domain history is the source of truth)."""

    name: str
    subjects: tuple[str, ...]
    description: str
    max_age_s: float | None
    duplicate_window_s: float
    retention: Retention = Retention.LIMITS
    storage: Storage = Storage.FILE
    max_msg_size: int = 1024 * 1024
    max_bytes: int | None = None  # None: no byte cap
    # At most this many messages per subject (per node for FAULTS): one publisher that floods its
    # subject only pushes out its own older messages, never another node's.
    max_msgs_per_subject: int | None = None
    # Full: refuse new messages instead of dropping the oldest (domain history is never lost).
    discard_new: bool = False

    def covers(self, subject: str) -> bool:
        return any(_matches(pattern, subject) for pattern in self.subjects)


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


# Decision streams keep a longer duplicate window so that a service that replays after a crash
# re-emits its decisions with the same ids and JetStream drops them.
# Per subject, a node keeps at most TELEMETRY_PER_SUBJECT messages of each kind (sample, inventory,
# fabric, steps): more than its 15 minutes at the agent's default one sample a second, so the limit
# never drops a sample that age would have kept; a node that publishes faster (a flood) pushes out
# only its own older messages, never another node's, and leaves at most that many for consumers to
# work through.
TELEMETRY_PER_SUBJECT = 2000
TELEMETRY = StreamSpec(
    "TELEMETRY",
    ("chamber.telemetry.>",),
    "GPU samples and node inventories from agents",
    TELEMETRY_MAX_AGE_S,
    120,
    max_bytes=TELEMETRY_MAX_BYTES,
    max_msgs_per_subject=TELEMETRY_PER_SUBJECT,
)
# Every stream has a byte cap (`chamber up` prints them with its disk budget). FAULTS and DEAD are
# bounded like TELEMETRY (the oldest go first) and per subject, and FAULTS messages are small: a GPU
# fault event is under 2 KiB, so a node's agent can keep at most FAULTS_PER_NODE x 16 KiB there
# (32 MiB), however fast it publishes. The domain streams keep their history: when full, they
# refuse new events (publishers see the error) rather than drop old ones. JetStream reserves each
# cap on the server's store: together (8 GiB with TELEMETRY's default) they fit the chart's 10 GiB
# volume with room for the KV buckets and snapshot stores.
FAULTS_PER_NODE = 2000
FAULTS = StreamSpec(
    "FAULTS",
    ("chamber.faults.>",),
    "GPU faults from on-node detectors",
    30 * DAY,
    600,
    max_msg_size=16 * 1024,
    max_bytes=256 * MIB,
    max_msgs_per_subject=FAULTS_PER_NODE,
)
FLEET = StreamSpec(
    "FLEET",
    ("chamber.fleet.>",),
    "nodes discovered, updated, lost, isolated, restored",
    None,
    600,
    max_bytes=1024 * MIB,
    discard_new=True,
)
JOBS = StreamSpec(
    "JOBS",
    ("chamber.jobs.>",),
    "job lifecycle and scheduling decisions",
    None,
    600,
    max_bytes=4096 * MIB,
    discard_new=True,
)
QUOTA = StreamSpec(
    "QUOTA",
    ("chamber.quota.>",),
    "pools, team quotas, fair-share factors, budgets",
    None,
    600,
    max_bytes=256 * MIB,
    discard_new=True,
)
BILLING = StreamSpec(
    "BILLING",
    ("chamber.billing.>",),
    "prices, accrued cost, budgets exceeded",
    None,
    600,
    max_bytes=1024 * MIB,
    discard_new=True,
)
# Multi-cluster dispatch (events/dispatch.py): offers, decisions, copy statuses, heartbeats. The
# per-subject limit rolls each cluster's heartbeat subject (its last DISPATCH_PER_SUBJECT beats); a
# workload's subjects carry a handful of events each, so the rest is kept as domain history.
DISPATCH_PER_SUBJECT = 1000
DISPATCH = StreamSpec(
    "DISPATCH",
    ("chamber.dispatch.>",),
    "multi-cluster dispatch: workloads offered, dispatched, recalled; copy statuses; cluster heartbeats",
    None,
    600,
    max_bytes=256 * MIB,
    max_msgs_per_subject=DISPATCH_PER_SUBJECT,
    discard_new=True,
)
# A dead letter is the original plus a few headers: a little more room than the largest message.
DEAD = StreamSpec(
    "DEAD",
    ("chamber.dead.>",),
    "poison messages, with the reason in a header",
    30 * DAY,
    120,
    max_msg_size=1024 * 1024 + 64 * 1024,
    max_bytes=512 * MIB,
    max_msgs_per_subject=100_000,  # per source stream: a poisoned stream does not erase another's
)

STREAMS: tuple[StreamSpec, ...] = (TELEMETRY, FAULTS, FLEET, JOBS, QUOTA, BILLING, DISPATCH, DEAD)


def stream_for(subject: str) -> StreamSpec | None:
    return next((s for s in STREAMS if s.covers(subject)), None)


def telemetry_retention(environ: Mapping[str, str] = os.environ) -> tuple[float, int]:
    """TELEMETRY's (max age in seconds, byte cap): the defaults, or what the environment sets.

    Raises ValueError naming the variable when a value is not a positive number."""
    age = _positive(environ, ENV_TELEMETRY_MAX_AGE, TELEMETRY_MAX_AGE_S)
    cap = int(_positive(environ, ENV_TELEMETRY_MAX_BYTES, TELEMETRY_MAX_BYTES))
    return age, cap


def retention(spec: StreamSpec, environ: Mapping[str, str] = os.environ) -> tuple[float | None, int | None]:
    """A stream's (max age, byte cap) as configured: TELEMETRY's (and its partitions') from
    `telemetry_retention`, every other stream's from its spec."""
    if spec.name.startswith(TELEMETRY.name):
        return telemetry_retention(environ)
    return spec.max_age_s, spec.max_bytes


def _positive(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{name}={raw!r}: expected a positive number (default {default:g})")
    return value
