"""Telemetry partitions at run time: how many are configured, which partition streams exist, and
which (stream, filter) pairs a telemetry consumer reads so that it sees every partition.

$CHAMBER_TELEMETRY_PARTITIONS (set by `--telemetry-partitions`, and by the chart from
`nats.telemetryPartitions`, which also writes the server's mapping) says how many; default 1.
See `events.partitions` for the layout.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from services.cli.errors import UsageError
from services.runtime.logs import get_logger

ENV = "CHAMBER_TELEMETRY_PARTITIONS"
# A probe carries a stream name no stream has: JetStream refuses to store it whatever the subject.
PROBE_HEADERS = {"Nats-Expected-Stream": "chamber-probe-never-stored"}
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


async def mapped_subject(nc: Any, subject: str, *, timeout_s: float = 1.0) -> str | None:
    """The subject the server's mapping turns `subject` into, learnt by sending it a probe that no
    stream stores and reading it back (None when it does not come back, e.g. no permission)."""
    got: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def on(msg: Any) -> None:
        if not got.done():
            got.set_result(msg.subject)

    subs = []
    try:
        subs = [await nc.subscribe(subject, cb=on), await nc.subscribe(f"{subject}.>", cb=on)]
        await nc.flush(timeout=timeout_s)
        await nc.publish(subject, b"", headers=PROBE_HEADERS)
        return await asyncio.wait_for(got, timeout_s)
    except Exception:  # a diagnosis must not fail the caller: it says what it could not learn
        return None
    finally:
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


def explain_unrouted(subject: str, mapped: str | None, existing: list[int], configured: int) -> str:
    """One line for a publish that found no stream: what the server maps, what streams exist, the fix."""
    have = len(existing)
    streams = f"{partition_stream(0)}..{partition_stream(have - 1)}" if have else "none"
    tail = mapped.rsplit(".", 1)[-1] if mapped and mapped.startswith(f"{subject}.") else ""
    if tail.isdigit() and int(tail) not in existing:
        p = int(tail)
        return (
            f"telemetry partitions disagree: the NATS server maps {subject} to partition {p} ({mapped}), so its "
            f"mapping has at least {p + 1} partitions, but only {have} partition streams exist ({streams}). "
            "Samples are spooled on this node (nothing is lost) until they agree: give the services "
            f"{ENV} (chart: nats.telemetryPartitions) equal to the server mapping's count, which adds the "
            f"streams, or map partition({max(have, 1)}, node) on the server."
        )
    return (
        f"no JetStream stream takes {mapped or subject} (the server answered 'no responders'); telemetry "
        f"partition streams: {have} ({streams}), {ENV} here: {configured}. Samples are spooled on this node "
        "until a stream takes them: compare the server's mapping with `chamber streams`."
    )


async def diagnose_unrouted(nc: Any, subject: str) -> str:
    """Why a publish to `subject` found no stream, as `explain_unrouted` says it."""
    mapped = await mapped_subject(nc, subject)
    try:
        existing = await existing_partitions(nc.jetstream())
    except Exception:  # cannot list streams: the count says none
        existing = []
    try:
        configured = configured_partitions()
    except UsageError:
        configured = 0
    return explain_unrouted(subject, mapped, existing, configured)
