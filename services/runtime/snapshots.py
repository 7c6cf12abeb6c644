"""Snapshots of a service's derived state, with the stream positions they cover.

A snapshot is the service's tracking record: a restarted service loads it and replays each input
stream from `positions[stream] + 1`, instead of from the start of history. The state is opaque
bytes (each service chooses its encoding). Snapshots live in a JetStream object store, which chunks
them, so a fleet-sized state is not bound by the server's message size.
"""

from __future__ import annotations

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from events.subjects import token
from services.runtime.buckets import open_object_store
from services.runtime.manifest import snapshot_bucket

BUCKET = "chamber_snapshots"  # the one store of earlier versions (their snapshots are not read)


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    taken_at: float
    positions: dict[str, int]  # stream name -> last sequence folded into `state`
    state: bytes
    format: str = "json"  # the state's encoding and version: a mismatch means "replay from the start"


class SnapshotStore:
    """Each service's snapshot in its own object store (`chamber_snapshots_<service>`): a service's
    NATS role may write only its own (`services/runtime/manifest.py`). `bucket` puts every
    service's in one store instead (tools, tests)."""

    def __init__(self, js: JetStreamContext, *, bucket: str | None = None) -> None:
        self.js = js
        self.bucket = bucket
        self._stores: dict[str, ObjectStore] = {}

    def bucket_for(self, service: str) -> str:
        return self.bucket or snapshot_bucket(service)

    async def _open(self, service: str) -> ObjectStore:
        name = self.bucket_for(service)
        if name not in self._stores:
            self._stores[name] = await open_object_store(self.js, name, description="service state snapshots")
        return self._stores[name]

    async def save(self, snapshot: Snapshot) -> int:
        """Store the snapshot (replacing the previous one); returns its size in bytes."""
        store = await self._open(snapshot.service)
        data = msgspec.msgpack.encode(snapshot)
        await store.put(token(snapshot.service), data)
        return len(data)

    async def delete(self, service: str) -> bool:
        """Remove the service's snapshot (its next start folds from the start); False if none."""
        store = await self._open(service)
        try:
            await store.delete(token(service))
        except (ObjectNotFoundError, NotFoundError):
            return False
        return True

    async def load(self, service: str) -> Snapshot | None:
        store = await self._open(service)
        try:
            result = await store.get(token(service))
        except (ObjectNotFoundError, NotFoundError):
            return None
        if not result.data:
            return None
        return msgspec.msgpack.decode(result.data, type=Snapshot)
