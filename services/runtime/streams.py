"""Create or update the design's streams, idempotently (safe for every service to call at start)."""

from __future__ import annotations

from collections.abc import Iterable

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from events.streams import STREAMS, StreamSpec, retention
from services.runtime.logs import get_logger

log = get_logger("chamber.runtime.streams")


def stream_config(spec: StreamSpec) -> StreamConfig:
    max_age, max_bytes = retention(spec)  # TELEMETRY's may be set by the operator
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
        discard=DiscardPolicy.OLD,
    )


async def ensure_streams(js: JetStreamContext, specs: Iterable[StreamSpec] = STREAMS) -> list[str]:
    """Add missing streams and update drifted ones; returns what changed ("added X", "updated X")."""
    changed: list[str] = []
    for spec in specs:
        wanted = stream_config(spec)
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            await js.add_stream(wanted)
            changed.append(f"added {spec.name}")
            continue
        have = info.config
        if (
            sorted(have.subjects or []) != sorted(wanted.subjects or [])
            or (have.max_age or 0) != wanted.max_age
            or (have.max_bytes or -1) != wanted.max_bytes
            or have.duplicate_window != wanted.duplicate_window
            or have.max_msg_size != wanted.max_msg_size
            or have.description != wanted.description
        ):
            await js.update_stream(wanted)
            changed.append(f"updated {spec.name}")
    if changed:
        log.info("streams ensured", changed=changed)
    return changed
