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
    partition_of,
    partition_stream,
    partition_subject,
    server_mapping,
)
from events.streams import TELEMETRY
from services.errors import UsageError
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
    if mapped is None and have and subject.startswith("chamber.telemetry.sample."):
        # unmapped, a sample would land in TELEMETRY: no stream means a partition past the streams
        return (
            f"telemetry partitions disagree: the NATS server maps {subject} to a partition with no stream, so "
            f"its mapping has more than the {have} partition streams that exist ({streams}). Samples are "
            f"spooled on this node (nothing is lost) until they agree: give the services {ENV} (chart: "
            "nats.telemetryPartitions) equal to the server mapping's count (`chamber streams` shows it), "
            f"or map partition({have}, node) on the server."
        )
    return (
        f"no JetStream stream takes {mapped or subject} (the server answered 'no responders'); telemetry "
        f"partition streams: {have} ({streams}), {ENV} here: {configured}. Samples are spooled on this node "
        "until a stream takes them: compare the server's mapping with `chamber streams`."
    )


PROBE_CLUSTER = "chamber-probe"  # a cluster token no fleet uses


async def server_partitions(nc: Any, *, probes: int = 16, timeout_s: float = 1.0) -> int | None:
    """How many partitions the server's mapping of node samples has (1: no mapping), learnt from
    probes to made-up nodes that no stream stores; None when they do not come back (no permission)."""
    prefix = f"chamber.telemetry.sample.{PROBE_CLUSTER}"
    seen: dict[str, str] = {}
    done = asyncio.Event()

    async def on(msg: Any) -> None:
        tokens = msg.subject.split(".")
        seen[tokens[4]] = tokens[5] if len(tokens) > 5 else ""
        if len(seen) >= probes:
            done.set()

    sub = None
    try:
        sub = await nc.subscribe(f"{prefix}.>", cb=on)
        await nc.flush(timeout=timeout_s)
        for i in range(probes):
            await nc.publish(f"{prefix}.probe-{i}", b"", headers=PROBE_HEADERS)
        await asyncio.wait_for(done.wait(), timeout_s)
    except Exception:  # no permission, no answer: nothing learnt
        return None
    finally:
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
    if all(p == "" for p in seen.values()):
        return 1
    if not all(p.isdigit() for p in seen.values()):
        return None
    # the smallest count whose hash puts every probe where the server did (16 probes: unambiguous)
    fits = (n for n in range(2, MAX_PARTITIONS + 1) if all(partition_of(k, n) == int(p) for k, p in seen.items()))
    return next(fits, None)


def explain_mapping(server: int, configured: int, existing: list[int]) -> str | None:
    """A line for the log when the server's mapping and Chamber's partition streams disagree."""
    have = len(existing)
    if server == configured and (server == 1 or have >= server):
        return None
    if server > 1 and have < server:
        return (
            f"telemetry partitions disagree: the NATS server maps node samples to {server} partitions, but "
            f"{have} partition streams exist ({ENV} here: {configured}); agents whose nodes land in partitions "
            f"{have}..{server - 1} spool their samples until the streams exist. Fix: run the services with "
            f"{ENV}={server} (chart: nats.telemetryPartitions), or map partition({max(have, 1)}, node) on the server."
        )
    return (
        f"telemetry partitions differ: the NATS server maps node samples to {server} partition(s) "
        f"(1: no mapping), {ENV} here is {configured}, {have} partition streams exist. Nothing is lost (the "
        "streams the mapping no longer names stop receiving and are still read); set both to the same count."
    )


async def check_server_mapping(nc: Any) -> str | None:
    """Compare the server's mapping with the configured count and the streams; log and return the
    disagreement (None: they agree, or the mapping could not be learnt)."""
    server = await server_partitions(nc)
    if server is None:
        return None
    problem = explain_mapping(server, configured_partitions(), await existing_partitions(nc.jetstream()))
    if problem is not None:
        log.error("telemetry partitions", detail=problem, server=server)
    return problem


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
