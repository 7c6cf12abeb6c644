"""Telemetry partitions at run time: how many are configured, which partition streams exist, and
which (stream, filter) pairs a telemetry consumer reads so that it sees every partition.

$CHAMBER_TELEMETRY_PARTITIONS (set by `--telemetry-partitions`, and by the chart from
`nats.telemetryPartitions`, which also writes the server's mapping) says how many; default 1.
See `events.partitions` for the layout.
"""

from __future__ import annotations

import os
from typing import Any

from nats.js.errors import NotFoundError

from events.partitions import (
    MAX_PARTITIONS,
    SAMPLE_SUBJECT,
    PartitionError,
    check_partitions,
    partition_stream,
    partition_subject,
    server_mapping,
)
from events.streams import TELEMETRY
from services.errors import UsageError
from services.runtime.logs import get_logger

ENV = "CHAMBER_TELEMETRY_PARTITIONS"
log = get_logger("chamber.runtime.partitions")


def configured_partitions(environ: dict[str, str] | None = None) -> int:
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return 1
    return parse_partitions(raw, source=ENV)


def parse_partitions(raw: str | int, *, source: str = "--telemetry-partitions") -> int:
    try:
        return check_partitions(int(raw))
    except ValueError as exc:
        detail = str(exc) if isinstance(exc, PartitionError) else f"a whole number is needed, got {raw!r}"
        raise UsageError(f"{source}: {detail}") from None


async def existing_partitions(js: Any) -> list[int]:
    """Indexes of the TELEMETRY_P<i> streams that exist (always 0..k-1: Chamber creates them in order).
    Probed by stream info, which every role may read (the agent included)."""
    found: list[int] = []
    for i in range(MAX_PARTITIONS):
        try:
            await js.stream_info(partition_stream(i))
        except NotFoundError:
            break
        found.append(i)
    return found


async def telemetry_inputs(js: Any, *, samples_only: bool = False) -> list[tuple[str, str]]:
    """(stream, filter subject) for every stream holding telemetry: TELEMETRY, then each partition.
    `samples_only` narrows to node samples (TELEMETRY still holds those of before partitioning)."""
    inputs = [(TELEMETRY.name, "chamber.telemetry.sample.>" if samples_only else "chamber.telemetry.>")]
    inputs += [(partition_stream(i), partition_subject(i)) for i in await existing_partitions(js)]
    return inputs


def explain_change(configured: int, existing: list[int]) -> str | None:
    """A sentence for the log when the streams on the server do not match the configured count."""
    have = len(existing)
    if (configured == 1 and have == 0) or have == configured:
        return None
    extra = [partition_stream(i) for i in existing if i >= configured or configured == 1]  # 1: no mapping
    if configured > 1 and have < configured:
        return (
            f"telemetry partitions changed from {have or 1} to {configured}: adding partition streams. The "
            f"NATS server must map {SAMPLE_SUBJECT} with partition({configured}, node) "
            f"({server_mapping(configured)[SAMPLE_SUBJECT]}); until it does, samples keep their old streams. "
            "Nothing is lost: every consumer reads every partition stream."
        )
    return (
        f"telemetry partitions changed from {have} to {configured}: {', '.join(extra)} receive no new samples "
        f"once the NATS mapping says partition({configured}, node) (or none, for 1), and are read by every "
        "consumer until their messages expire with TELEMETRY's max age; nothing is lost. Set the server "
        "mapping and CHAMBER_TELEMETRY_PARTITIONS together (the chart does)."
    )
