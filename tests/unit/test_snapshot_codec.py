"""Snapshots load through an allow-list and are named by the core's STATE_VERSION, not its source
(services/runtime/snapshot_codec.py, services/runtime/state_codec.py)."""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from events import JobCompleted, JobScheduled, JobSubmitted, Placement
from services.billing import core as billing
from services.billing import service as billing_service
from services.runtime.decider import SnapshotCodec, pickle_codec, snapshot_format
from services.runtime.snapshot_codec import RefusedSnapshot, safe_loads
from services.runtime.state_codec import facts_codec
from tests.scheduler_builders import a_job


class RunsACommand:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.path}",)


def test_a_snapshot_that_names_a_function_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    data = pickle.dumps({"state": RunsACommand(str(marker))})
    with pytest.raises(RefusedSnapshot, match="system"):
        safe_loads(data, ["services.billing"])
    assert not marker.exists()
    pickle.loads(data)  # what a plain pickle load would have done
    assert marker.exists()


def test_a_function_of_the_core_itself_is_refused_too() -> None:
    data = pickle.dumps([billing.evolve])
    with pytest.raises(RefusedSnapshot, match=r"services\.billing\.core\.evolve"):
        safe_loads(data, ["services.billing"])


def test_a_billing_state_round_trips_through_its_codec() -> None:
    state = billing.BillingState()
    job = a_job("j1", at=10.0)
    placed = JobScheduled(
        job_id="j1",
        at=20.0,
        team="vision",
        pool="default",
        placements=[Placement(cluster="c1", node="n1", gpu_indices=[0, 1])],
    )
    for event in (job, placed, JobCompleted(job_id="j1", at=30.0)):
        billing.evolve(state, event, f"id-{event.ce_type()}")
    assert isinstance(job, JobSubmitted)
    codec = billing_service.snapshot_codec()
    assert codec.decode(codec.encode(state)) == state


FOLD_MODULE = """
from dataclasses import dataclass, field
from collections import deque
{comment}
@dataclass
class S:
    n: int = 0
    seen: deque[str] = field(default_factory=lambda: deque(maxlen=2))
{extra}
def evolve(s, e):
    s.n += 1
"""


def _load_fold_module(tmp_path: Path, *, comment: str = "", extra: str = "") -> object:
    (tmp_path / "foldmod.py").write_text(FOLD_MODULE.format(comment=comment, extra=extra))
    sys.modules.pop("foldmod", None)
    return importlib.import_module("foldmod")


@pytest.mark.parametrize("codec_of", ["pickle", "msgspec"])
def test_a_build_that_only_changes_a_comment_restores_the_last_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec_of: str
) -> None:
    """The format names the core's STATE_VERSION and the state's fields, never its source."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def codec(module: object, version: int = 1) -> SnapshotCodec[Any]:
        state_type = module.S  # type: ignore[attr-defined]
        if codec_of == "pickle":
            return pickle_codec(state_type, version=version)
        return facts_codec(state_type, version=version)

    old = _load_fold_module(tmp_path)
    state = old.S()  # type: ignore[attr-defined]
    for e in ("a", "b", "c"):
        old.evolve(state, e)  # type: ignore[attr-defined]
        state.seen.append(e)
    written, old_format = codec(old).encode(state), snapshot_format(codec(old), old.S())  # type: ignore[attr-defined]

    new = _load_fold_module(tmp_path, comment="# a comment the new release added")
    assert snapshot_format(codec(new), new.S()) == old_format  # type: ignore[attr-defined]
    restored = codec(new).decode(written)
    assert (restored.n, list(restored.seen), restored.seen.maxlen) == (3, ["b", "c"], 2)

    bumped = snapshot_format(codec(new, version=2), new.S())  # type: ignore[attr-defined]
    assert bumped != old_format  # the fold changed meaning: its first start folds from the start
    if codec_of == "pickle":  # a field added or dropped refuses a pickle; msgspec reads it by name
        wider = _load_fold_module(tmp_path, extra="    m: int = 0")
        assert snapshot_format(codec(wider), wider.S()) != old_format  # type: ignore[attr-defined]


def test_the_gateway_restores_into_the_state_its_api_holds() -> None:
    """The HTTP handlers keep a reference to the read model: a restore must fill that very object."""
    from services.gateway import core as gateway
    from services.gateway import service as gateway_service

    built = gateway.GatewayState()
    gateway.evolve(built, a_job("j1", at=10.0))
    served = gateway.GatewayState()
    codec = gateway_service.snapshot_codec(served)
    restored = codec.decode(codec.encode(built))
    assert restored is served and set(served.jobs) == {"j1"}
