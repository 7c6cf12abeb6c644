"""Open or create a JetStream KV bucket or object store: the one copy every service uses."""

from __future__ import annotations

from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from services.runtime.replicas import replicas_for


async def open_kv(js: JetStreamContext, bucket: str, **config: Any) -> KeyValue:
    """The bucket, created with `config` (history, ttl, description...) when it does not exist yet.
    Two processes racing to create it both end with the same bucket."""
    try:
        return await js.key_value(bucket)
    except (BucketNotFoundError, NotFoundError):
        pass
    config.setdefault("replicas", replicas_for(js))  # follow the cluster (services/runtime/replicas.py)
    try:
        return await js.create_key_value(bucket=bucket, **config)
    except Exception:  # created by another process in between (same config): open that one
        return await js.key_value(bucket)


async def bucket_keys(js: JetStreamContext, bucket: str, keys: str = ">") -> list[str]:
    """Every key of a KV bucket matching `keys` (a subject filter: `c1.*.>`) that has a subject in
    its stream, deleted keys included (a delete leaves a marker; reading such a key raises
    KeyNotFoundError). From the stream's subjects, not `KeyValue.keys()`: that watcher ends at the
    first entry the server reports with nothing pending, which missed keys while others kept
    changing, and its `filters` match substrings, not subject wildcards."""
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"{prefix}{keys}")
    return sorted(subject[len(prefix) :] for subject in info.state.subjects or {})


async def live_keys(js: JetStreamContext, kv: KeyValue, bucket: str, keys: str = ">") -> list[str]:
    """The bucket's keys that hold a value now (deleted ones left out): one read per key."""
    from nats.js.errors import KeyNotFoundError

    live = []
    for key in await bucket_keys(js, bucket, keys):
        try:
            await kv.get(key)
        except KeyNotFoundError:
            continue
        live.append(key)
    return live


async def open_object_store(js: JetStreamContext, bucket: str, **config: Any) -> ObjectStore:
    try:
        return await js.object_store(bucket)
    except (BucketNotFoundError, NotFoundError):
        pass
    config.setdefault("replicas", replicas_for(js))
    try:
        return await js.create_object_store(bucket=bucket, **config)
    except Exception:
        return await js.object_store(bucket)
