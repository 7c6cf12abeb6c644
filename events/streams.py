"""The JetStream streams of the design: what each holds and for how long."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
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
class Source:
    """Another stream this one copies (JetStream `sources`), its subjects rewritten `src` -> `dest`."""

    stream: str
    src: str
    dest: str


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
    # With `max_msgs_per_subject` and `max_age`: a subject at its count refuses new messages until its
    # oldest ages out, so at most that many are accepted per subject in any `max_age` window.
    discard_new_per_subject: bool = False
    sources: tuple[Source, ...] = ()

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

# --- what agents publish: through a gate that bounds each node's rate --------------------------------
# NATS has no per-user publish rate. Agents therefore publish into gate streams, never into TELEMETRY
# or FAULTS directly (their NATS users may not): `chamber.ingest.<kind>.<cluster>.<node>`. A gate keeps
# each message GATE_WINDOW_S and refuses a subject's next message while it holds GATE_PER_WINDOW of
# them (discard new, per subject), so the server accepts at most GATE_PER_WINDOW messages per node
# and kind in any GATE_WINDOW_S, whatever the agent does: ten a second on average, ten times the
# agent's default rate, half what the recorder stores per subject. TELEMETRY and FAULTS copy what
# a gate accepted (`sources`, the `chamber.ingest.` prefix taken off) and de-duplicate it by message id
# over their own windows, so the gate's short one loses nothing. A refused publish is the agent's to
# retry (its outbox does, lossless). The simulated fleet publishes through the gates too (it runs the
# agent's code); services publish straight into the streams, as before.
#
# Sizes: a gate's message limit may not exceed its target stream's (the server refuses the source
# otherwise). Agents' telemetry is capped at 256 KiB, fifteen times the largest 8-GPU sample (a full
# one with process lists, 17.5 KB); faults at FAULTS' 16 KiB. A gate that is full refuses everyone
# (discard new), so its byte cap is far above its traffic: ten seconds of 1,000 nodes at one 18 KB
# sample a second is 180 MiB, while one node can hold at most 4 kinds x 100 x 256 KiB = 100 MiB of it.
INGEST_PREFIX = "chamber.ingest."
GATE_WINDOW_S = 10.0
GATE_PER_WINDOW = 100
AGENT_TELEMETRY_MAX_MSG = 256 * 1024


GATE_PREFIX = "AGENT_"
_GATE_LIMITS = {  # target family -> (message size limit, byte cap), shared by a family's partition streams
    "TELEMETRY": (AGENT_TELEMETRY_MAX_MSG, 512 * MIB),
    "FAULTS": (FAULTS.max_msg_size, 64 * MIB),
}


def family(name: str) -> str:
    """A stream name without its partition suffix: `TELEMETRY_P3` -> `TELEMETRY` (others unchanged)."""
    head, sep, tail = name.rpartition("_P")
    return head if sep and tail.isdigit() else name


def gate_for(target: StreamSpec) -> StreamSpec | None:
    """The gate agents publish into for `target` (TELEMETRY, its partitions, FAULTS), None if agents
    do not publish into it. Its subjects are the target's under the ingest prefix."""
    limits = _GATE_LIMITS.get(family(target.name))
    if limits is None:
        return None
    max_msg_size, max_bytes = limits
    return StreamSpec(
        GATE_PREFIX + target.name,
        tuple(INGEST_PREFIX + s.removeprefix("chamber.") for s in target.subjects),
        f"what agents publish for {target.name}: at most {GATE_PER_WINDOW} per node and kind in {GATE_WINDOW_S:g} s",
        GATE_WINDOW_S,
        GATE_WINDOW_S,  # the server requires a duplicate window no longer than max_age
        max_msg_size=max_msg_size,
        max_bytes=max_bytes,
        max_msgs_per_subject=GATE_PER_WINDOW,
        discard_new=True,
        discard_new_per_subject=True,
    )


def with_gates(specs: tuple[StreamSpec, ...]) -> tuple[StreamSpec, ...]:
    """The streams with their gates, each gate before the stream that copies it (`sources`); the
    copy takes the ingest prefix off, so consumers see the subjects agents name."""
    gates: list[StreamSpec] = []
    out: list[StreamSpec] = []
    for spec in specs:
        gate = gate_for(spec)
        if gate is None:
            out.append(spec)
            continue
        domain = spec.name.split("_")[0].lower()  # TELEMETRY_P3 -> telemetry: the subjects' second token
        source = Source(gate.name, f"{INGEST_PREFIX}{domain}.>", f"chamber.{domain}.>")
        gates.append(gate)
        out.append(replace(spec, sources=(*spec.sources, source)))
    return (*gates, *out)


def _gate_of(target: StreamSpec) -> StreamSpec:
    gate = gate_for(target)
    assert gate is not None, target.name
    return gate


AGENT_TELEMETRY = _gate_of(TELEMETRY)
AGENT_FAULTS = _gate_of(FAULTS)
GATES: tuple[StreamSpec, ...] = (AGENT_TELEMETRY, AGENT_FAULTS)


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
