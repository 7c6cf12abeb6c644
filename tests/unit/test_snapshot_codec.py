"""Snapshots load through an allow-list and are named by build (services/runtime/snapshot_codec.py)."""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from pathlib import Path

import pytest

from events import JobCompleted, JobScheduled, JobSubmitted, Placement
from services.billing import core as billing
from services.billing import service as billing_service
from services.runtime.snapshot_codec import RefusedSnapshot, build_digest, safe_loads
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


def test_the_build_digest_changes_with_the_source_of_the_fold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same fields, another fold: a snapshot of the old build must not be taken for the new one."""
    module = tmp_path / "foldmod.py"
    module.write_text(
        "from dataclasses import dataclass\n@dataclass\nclass S:\n    n: int = 0\ndef evolve(s, e): s.n += 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    first = build_digest([importlib.import_module("foldmod").S])
    module.write_text(
        "from dataclasses import dataclass\n@dataclass\nclass S:\n    n: int = 0\ndef evolve(s, e): s.n += 2\n"
    )
    del sys.modules["foldmod"]
    assert build_digest([importlib.import_module("foldmod").S]) != first
    assert build_digest([billing.BillingState]) == build_digest([billing.BillingState])  # stable within a build


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
