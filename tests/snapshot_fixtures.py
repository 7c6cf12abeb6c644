"""Snapshots written by a release, kept in tests/data/snapshots_v1/ so that later builds prove they
restore them (tests/unit/test_snapshot_fixtures.py).

One small, fixed history (two nodes, quotas, jobs, a fault, and each core's own decisions folded back
as the host does) is folded by every decider core; each core's state is written through its
service's snapshot codec, in the envelope the snapshot store keeps (services/runtime/snapshots.py).

Regenerate only when a core bumps its STATE_VERSION (the old snapshot is then refused on purpose):
    python -m tests.snapshot_fixtures
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from events import Event
from services.billing import service as billing_service
from services.gateway import core as gateway
from services.gateway import service as gateway_service
from services.health import service as health_service
from services.quota import service as quota_service
from services.runtime.decider import SnapshotCodec, snapshot_format
from services.runtime.snapshots import Snapshot
from services.scheduler import service as scheduler_service
from tests.conformance.harness import CoreSpec, fold
from tests.conformance.test_cores import BILLING, GATEWAY, QUOTA, SCHEDULER
from tests.conformance.test_fleet_cores import HEALTH, POLICY
from tests.health_builders import a_fault, an_inventory
from tests.scheduler_builders import a_job, a_node, a_quota, done

FIXTURES = Path(__file__).parent / "data" / "snapshots_v1"
NOW = 1_000.0


def codecs() -> dict[str, tuple[CoreSpec[Any], SnapshotCodec[Any]]]:
    """Each core's conformance spec (initial state, fold) and its service's snapshot codec."""
    return {
        "scheduler": (SCHEDULER, scheduler_service.snapshot_codec()),
        "quota": (QUOTA, quota_service.snapshot_codec()),
        "billing": (BILLING, billing_service.snapshot_codec()),
        "gateway": (GATEWAY, gateway_service.snapshot_codec(gateway.GatewayState())),
        "health": (HEALTH, health_service.snapshot_codec(POLICY)),
    }


def history() -> list[Event]:
    """The fixed log: facts first, then two rounds of every core's decisions folded back."""
    log: list[Event] = [
        a_node("n1", at=1.0),
        a_node("n2", at=1.0),
        an_inventory("n1", at=2.0),
        an_inventory("n2", at=2.0),
        a_quota("vision", 8),
        a_quota("nlp", 8),
        a_job("j1", team="vision", gpus=8, at=10.0),
        a_job("j2", team="nlp", gpus=8, at=11.0),
        a_job("j3", team="nlp", gpus=8, at=12.0),
    ]
    for round_ in range(2):
        now = NOW + 100.0 * round_
        for spec, _ in codecs().values():
            if spec.decide is not None:
                log += [event for event, _ in spec.decide(fold(spec, log), now)]
        if round_ == 0:
            log += [done("j1", at=now + 50.0), a_fault("n2", xid=79, at=now + 60.0)]
    return log


def write(directory: Path = FIXTURES) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    log = history()
    out = []
    for name, (spec, codec) in codecs().items():
        snap = Snapshot(
            service=name,
            taken_at=NOW,
            positions={"JOBS": len(log)},
            state=codec.encode(fold(spec, log)),
            format=snapshot_format(codec, spec.initial()),
        )
        path = directory / f"{name}.snapshot"
        path.write_bytes(msgspec.msgpack.encode(snap))
        out.append(path)
    return out


if __name__ == "__main__":
    for path in write():
        print(f"{path}  {path.stat().st_size} bytes")
