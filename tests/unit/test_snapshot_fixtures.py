"""Snapshots written by an earlier release (tests/data/snapshots_v1/) restore in this build: same
format (STATE_VERSION and settings), and the state folding the same history gives."""

from __future__ import annotations

import msgspec
import pytest

from services.runtime.decider import snapshot_format
from services.runtime.snapshots import Snapshot
from tests.conformance.harness import canon, fold
from tests.snapshot_fixtures import FIXTURES, codecs, history

SERVICES = sorted(codecs())


@pytest.mark.parametrize("service", SERVICES)
def test_a_snapshot_of_the_previous_release_restores(service: str) -> None:
    spec, codec = codecs()[service]
    snap = msgspec.msgpack.decode((FIXTURES / f"{service}.snapshot").read_bytes(), type=Snapshot)
    assert snap.format == snapshot_format(codec, spec.initial()), (
        f"{service}: the committed snapshot is refused by this build. If the fold's meaning changed, bump the "
        "core's STATE_VERSION and regenerate (python -m tests.snapshot_fixtures); if not, keep the format stable"
    )
    restored = codec.decode(snap.state)
    assert canon(restored, spec.skip) == canon(fold(spec, history()), spec.skip)


def test_the_fixtures_cover_every_decider_that_keeps_a_snapshot() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.snapshot")) == SERVICES
