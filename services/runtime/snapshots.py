"""Snapshots of a service's derived state, with the stream positions they cover (JetStream KV).

A restarted service loads its snapshot and replays from `positions[stream] + 1`, instead of from
the start of history. The state is opaque bytes: each service chooses its own encoding.
"""

from __future__ import annotations

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from events.subjects import token
from services.runtime.replicas import replicas_for

BUCKET = "chamber_snapshots"


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    taken_at: float
    positions: dict[str, int]  # stream name -> last sequence folded into `state`
    state: bytes
    format: str = "json"


class SnapshotStore:
    def __init__(self, js: JetStreamContext, *, bucket: str = BUCKET) -> None:
        self.js = js
        self.bucket = bucket
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(self.bucket)
            except BucketNotFoundError:
                self._kv = await self.js.create_key_value(bucket=self.bucket, history=3, replicas=replicas_for(self.js))
        return self._kv

    async def save(self, snapshot: Snapshot) -> int:
        """Store the snapshot; returns the KV revision."""
        kv = await self._bucket()
        return await kv.put(token(snapshot.service), msgspec.json.encode(snapshot))

    async def load(self, service: str) -> Snapshot | None:
        kv = await self._bucket()
        try:
            entry = await kv.get(token(service))
        except KeyNotFoundError:
            return None
        if entry.value is None:
            return None
        return msgspec.json.decode(entry.value, type=Snapshot)
