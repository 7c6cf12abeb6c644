"""What every service shares: NATS connection, streams, consumer loop, dead letters, snapshots,
tracing, logs and lifecycle. Services import from here, never from nats directly in their cores."""

from services.runtime.connection import connect
from services.runtime.consumer import Consumer, ConsumerOptions, Delivery, TransientError
from services.runtime.dead_letter import DEAD_REASON, dead_letter
from services.runtime.lifecycle import run_until_stopped
from services.runtime.publisher import Publisher
from services.runtime.snapshots import Snapshot, SnapshotStore
from services.runtime.streams import ensure_streams

__all__ = [
    "DEAD_REASON",
    "Consumer",
    "ConsumerOptions",
    "Delivery",
    "Publisher",
    "Snapshot",
    "SnapshotStore",
    "TransientError",
    "connect",
    "dead_letter",
    "ensure_streams",
    "run_until_stopped",
]
