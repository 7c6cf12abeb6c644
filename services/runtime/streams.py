"""Create or update the design's streams, idempotently. The operator's set-up (`services/runtime/setup.py`)
creates and updates them; a service or agent only creates a missing one (on a bus without roles, a
developer's), never changes one: its NATS role may not."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from functools import partial

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig, StreamSource, SubjectTransform
from nats.js.errors import APIError, NotFoundError

from events.partitions import stream_specs
from events.streams import TELEMETRY, StreamSpec, family, retention
from services.runtime.backoff import Backoff
from services.runtime.logs import get_logger
from services.runtime.partitions import configured_partitions, existing_partitions, explain_change
from services.runtime.replicas import ReplicasUnavailable, remember, replicas_for

log = get_logger("chamber.runtime.streams")


# JetStream's answers when a stream's replicas cannot be placed: "replicas > 1 not supported in
# non-clustered mode", "no suitable peers for placement", "insufficient resources".
_NOT_CLUSTERED = 10074
_PLACEMENT_ERRORS = {_NOT_CLUSTERED, 10005, 10023}


def stream_config(spec: StreamSpec, replicas: int = 1, *, byte_shares: int = 1) -> StreamConfig:
    """`byte_shares`: how many streams split the spec's byte cap (TELEMETRY and its partition streams
    share the one configured cap, so the total on disk stays what the operator set; so do their gates)."""
    max_age, max_bytes = retention(spec)  # TELEMETRY's may be set by the operator
    if max_bytes and byte_shares > 1:
        max_bytes = max(max_bytes // byte_shares, 1)
    return StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=RetentionPolicy(spec.retention.value),
        storage=StorageType(spec.storage.value),
        max_age=max_age or 0,
        max_bytes=max_bytes or -1,
        duplicate_window=spec.duplicate_window_s,
        max_msg_size=spec.max_msg_size,
        max_msgs_per_subject=spec.max_msgs_per_subject or -1,
        discard=DiscardPolicy.NEW if spec.discard_new else DiscardPolicy.OLD,
        discard_new_per_subject=spec.discard_new_per_subject,
        sources=[
            StreamSource(name=s.stream, subject_transforms=[SubjectTransform(src=s.src, dest=s.dest)])
            for s in spec.sources
        ]
        or None,
        num_replicas=replicas,
    )


def _sources(config: StreamConfig) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """A config's sources as comparable values: (stream, ((src, dest), ...))."""
    return sorted((s.name, tuple((t.src, t.dest) for t in s.subject_transforms or ())) for s in config.sources or ())


async def ensure_streams(
    js: JetStreamContext,
    specs: Iterable[StreamSpec] | None = None,
    *,
    replicas: int | None = None,
    update: bool = True,
) -> list[str]:
    """Add missing streams and update drifted ones; returns what changed ("added X", "updated X").
    `update=False` (services, agents): a drifted stream is only logged, for the set-up to fix.

    `specs` default: the design's streams, TELEMETRY split into the configured partitions (keeping
    partition streams of an earlier, larger count: see `events.partitions`).
    `replicas` (default: `replicas_for(js)`, from configuration and the cluster) is a floor: a stream
    with fewer is raised to it, one an operator raised higher keeps its count (never lowered).
    TELEMETRY's byte cap is the total over TELEMETRY and its partition streams among `specs`: each of
    the k telemetry streams gets cap / k."""
    if replicas is None:
        replicas = replicas_for(js, known_peers=await _known_peers(js), fresh=True)
        remember(js, replicas)
    if specs is None:
        specs = await _design_streams(js)
    specs = list(specs)
    shares = Counter(family(s.name) for s in specs)
    changed: list[str] = []
    for spec in specs:
        wanted = stream_config(spec, replicas, byte_shares=shares[family(spec.name)])
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            await _placed(partial(js.add_stream, wanted), spec.name, replicas)
            changed.append(f"added {spec.name}")
            continue
        have = info.config
        wanted.num_replicas = max(replicas, have.num_replicas or 1)
        if (
            sorted(have.subjects or []) != sorted(wanted.subjects or [])
            or (have.max_age or 0) != wanted.max_age
            or (have.max_bytes or -1) != wanted.max_bytes
            or have.duplicate_window != wanted.duplicate_window
            or have.max_msg_size != wanted.max_msg_size
            or (have.max_msgs_per_subject or -1) != wanted.max_msgs_per_subject
            or (have.discard or DiscardPolicy.OLD) != wanted.discard
            or bool(have.discard_new_per_subject) != bool(wanted.discard_new_per_subject)
            or _sources(have) != _sources(wanted)
            or have.description != wanted.description
            or (have.num_replicas or 1) != wanted.num_replicas
        ):
            if not update:
                log.warning("stream differs from the design; `chamber setup` updates it", stream=spec.name)
                continue
            await _placed(partial(js.update_stream, wanted), spec.name, wanted.num_replicas)
            changed.append(f"updated {spec.name}")
    if changed:
        log.info("streams ensured", changed=changed, replicas=replicas)
    return changed


async def ensure_bucket_replicas(js: JetStreamContext, *, replicas: int | None = None) -> list[str]:
    """Raise Chamber's KV buckets (leases, snapshots, views: streams `KV_chamber_*`) to the configured
    replicas, never lowering one; a bucket made on one server keeps working when the fleet grows into a
    cluster. Needs the stream list, so services run it, not agents."""
    if replicas is None:
        replicas = replicas_for(js)
    changed: list[str] = []
    for info in await js.streams_info():
        config = info.config
        if not (config.name or "").startswith("KV_chamber_") or (config.num_replicas or 1) >= replicas:
            continue
        config.num_replicas = replicas
        await _placed(partial(js.update_stream, config), config.name or "", replicas)
        changed.append(f"updated {config.name}")
    if changed:
        log.info("bucket replicas raised", changed=changed, replicas=replicas)
    return changed


async def _design_streams(js: JetStreamContext) -> tuple[StreamSpec, ...]:
    configured = configured_partitions()
    existing = await existing_partitions(js)
    change = explain_change(configured, existing)
    if change and (existing or await _exists(js, TELEMETRY.name)):  # a fresh install changes nothing
        log.warning("telemetry partitions", detail=change, configured=configured, existing=len(existing))
    return stream_specs(configured, existing=len(existing))


async def check_own_streams(js: JetStreamContext, specs: Iterable[StreamSpec]) -> list[str]:
    """`ensure_streams(update=False)` for the streams a process outside the control plane uses, and
    no other: its role may read no other stream's info (a node agent, a member cluster's actuator).
    The replica count comes from configuration and the server, not from other streams' info."""
    return await ensure_streams(js, specs, replicas=replicas_for(js), update=False)


async def _known_peers(js: JetStreamContext) -> int:
    """Servers the cluster evidently has: the replicas of the design's existing streams."""
    known = 0
    for name in ("JOBS", TELEMETRY.name):
        try:
            known = max(known, (await js.stream_info(name)).config.num_replicas or 1)
        except NotFoundError:
            continue
    return known


async def _exists(js: JetStreamContext, stream: str) -> bool:
    try:
        await js.stream_info(stream)
    except NotFoundError:
        return False
    return True


_PLACEMENT_BACKOFF = Backoff(first_s=0.2, max_s=2.0)  # a cluster still forming: peers within seconds


async def _placed(call: Callable[[], Awaitable[object]], stream: str, replicas: int, *, wait_s: float = 30.0) -> None:
    """Run a stream add/update; a placement refusal becomes a message naming the numbers. A cluster
    still forming (servers not yet peers) refuses placement for a moment: that is retried."""
    deadline = time.monotonic() + wait_s
    delay = 0.0
    while True:
        try:
            await call()
            return
        except nats.errors.TimeoutError:
            # no answer: a cluster still electing its JetStream meta leader leaves the API silent for
            # a few seconds. Adding or updating a stream with the same config again is idempotent.
            if time.monotonic() >= deadline:
                raise
            log.info("stream set-up not answered, retrying", stream=stream, replicas=replicas)
            delay = _PLACEMENT_BACKOFF.next(delay)
            await asyncio.sleep(delay)
        except APIError as exc:
            if exc.err_code not in _PLACEMENT_ERRORS:
                raise
            if exc.err_code != _NOT_CLUSTERED and time.monotonic() < deadline:
                log.info("stream placement refused, retrying", stream=stream, replicas=replicas, error=exc.description)
                delay = _PLACEMENT_BACKOFF.next(delay)
                await asyncio.sleep(delay)
                continue
            raise ReplicasUnavailable(
                f"stream {stream} needs {replicas} replicas but the NATS cluster cannot place them "
                f"({exc.description}); run at least {replicas} JetStream servers or lower --replicas"
            ) from None
