"""Discovery and health through the conformance suite (tests/conformance/harness.py), on fleet logs
that the two cores produced themselves: agents' inventories and samples (TELEMETRY), faults (FAULTS),
and the FLEET stream both write, each decision folded back into both as the decider host does, and
operators' confirm / dismiss / restore commands in between."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import structs

from events import Event
from events.faults import FaultKind, Severity
from services.discovery import core as discovery
from services.health import core as health
from services.health import service as health_service
from services.health.policy import Budget, Policy, load_policy
from tests.conformance.harness import (
    CoreSpec,
    decide_only_reads,
    interleavings_fold_to_one_state,
    no_reference_cycles,
    restart_mid_cycle,
    snapshot_restore_continue,
)
from tests.health_builders import T0, a_fault, a_sample, an_inventory

_POLICY = load_policy()
# A small budget, so that storms are held and operators confirm or dismiss them.
POLICY: Policy = structs.replace(_POLICY, budget=Budget(max_share=0.25, min_nodes=1, window_s=3600.0))
_health_codec = health_service.snapshot_codec(POLICY)


def _health_decide(state: health.HealthState, now: float) -> list[tuple[Event, str]]:
    return [(d.event, health.event_id(d)) for d in health.decide(state, now) if d.event is not None]


def discovery_decide(state: discovery.DiscoveryState, now: float) -> list[tuple[Event, str]]:
    return [(e, discovery.event_id(e)) for e in discovery.decide(state, now)]


def _discovery_initial() -> discovery.DiscoveryState:
    return discovery.new_state(suspect_after_intervals=3, lost_after_s=120.0)


HEALTH = CoreSpec[health.HealthState](
    name="health",
    initial=lambda: health.new_state(POLICY),
    evolve=health.evolve,  # type: ignore[arg-type]
    snapshot=lambda s: _health_codec.decode(_health_codec.encode(s)),
    decide=_health_decide,
)

DISCOVERY = CoreSpec[discovery.DiscoveryState](
    name="discovery",
    initial=_discovery_initial,
    evolve=discovery.evolve,  # type: ignore[arg-type]
    snapshot=lambda s: _pickled(s),
    decide=discovery_decide,
)


def _pickled(state: Any) -> Any:
    import pickle

    return pickle.loads(pickle.dumps(state))


XIDS = [13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95]
KINDS = [FaultKind.ECC_DBE, FaultKind.ROW_REMAP_PENDING, FaultKind.THERMAL, FaultKind.NVLINK, FaultKind.PCIE]


def a_fleet_log(seed: int, steps: int, nodes: int, forgets: bool = False) -> tuple[list[Event], float]:
    """A log as a fleet writes it, in the order things happened: agents' inventories and samples,
    detectors' faults, operators' commands, and discovery's and health's decisions made on what they
    had folded so far. A seeded walk: long logs with many decisions, still reproducible.

    `forgets`: operators also forget lost nodes (`chamber fleet forget`). Those logs are not folded in
    random interleavings: a NodeForgotten is folded in log order. The host merges its inputs by the
    time the server stored each message, and a node is forgotten only once lost, after at least
    `lost_after_s` without a word from its agent (no sample, inventory or fault), so everything it
    said before comes first; what it says after is a node anew, stored later. A random interleaving
    models clock differences between stream leaders, of milliseconds, not of `lost_after_s`."""
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(nodes)]
    log: list[Event] = []
    disc, hs = _discovery_initial(), health.new_state(POLICY)

    def happen(*events: Event) -> None:
        for e in events:
            log.append(e)
            discovery.evolve(disc, e)
            health.evolve(hs, e)

    now = T0
    silent: set[str] = set()  # agents that stopped reporting (lost, then back)
    happen(*(an_inventory(n, n_gpus=4, at=now) for n in names))
    for step in range(steps):
        now += rng.choice([5.0, 20.0, 60.0, 400.0, 4000.0])
        kind = rng.choice(["sample"] * 4 + ["fault"] * 3 + ["cycle"] * 3 + ["operator", "silence", "inventory"])
        node = rng.choice(names)
        if kind == "sample":
            for n in names:
                if n not in silent:
                    dirty = {rng.randrange(4): 1} if rng.random() < 0.15 else {}
                    happen(a_sample(n, at=now, n_gpus=4, dbe=dirty, interval_s=10.0))
        elif kind == "fault" and not (forgets and node in silent):  # a silent agent reports no faults
            if rng.random() < 0.5:
                fault = a_fault(node, xid=rng.choice(XIDS), gpu=rng.randrange(4), at=now, fault_id=f"f{step}")
            else:
                gpu = rng.choice([None, 0, 1, 2, 3])
                fault = a_fault(node, kind=rng.choice(KINDS), gpu=gpu, at=now, fault_id=f"g{step}")
            severity = rng.choice([Severity.WARNING, Severity.CRITICAL])
            happen(_with_severity(fault, severity))
        elif kind == "cycle":
            happen(*(e for e, _ in discovery_decide(disc, now)))
            happen(*(e for e, _ in _health_decide(hs, now)))
        elif kind == "operator" and forgets and node in silent and rng.random() < 0.5:
            try:  # a lost node that left for good (its agent reports again later: discovered anew)
                happen(discovery.forget(disc, "c1", node, now, "alice"))
            except discovery.ForgetRefused:
                continue
        elif kind == "operator":
            command = rng.choice([health.confirm, health.dismiss, health.restore])
            gpu = rng.choice([None, 0, 1, 2, 3])
            try:
                decision = command(hs, "c1", node, gpu, now, "alice")
            except health.HealthRefusal:
                continue
            assert decision.event is not None
            happen(decision.event)
        elif kind == "silence":
            silent.symmetric_difference_update({node})
        elif kind == "inventory" and not (forgets and node in silent):
            happen(an_inventory(node, n_gpus=rng.choice([4, 4, 2]), at=now, labels={"rack": rng.choice("ab")}))
    now += 60.0
    happen(*(e for e, _ in discovery_decide(disc, now)))
    happen(*(e for e, _ in _health_decide(hs, now)))
    return log, now


fleet_logs = st.builds(a_fleet_log, st.integers(0, 2**32), st.integers(5, 80), st.integers(1, 5))
# the same, with operators forgetting lost nodes: every property but random interleavings (a_fleet_log)
fleet_logs_forgetting = st.builds(
    a_fleet_log, st.integers(0, 2**32), st.integers(5, 80), st.integers(1, 5), st.just(True)
)
any_fleet_logs = st.one_of(fleet_logs, fleet_logs_forgetting)


def _with_severity(fault: Any, severity: Severity) -> Any:
    return structs.replace(fault, severity=severity)


CORES = [HEALTH, DISCOVERY]
EXAMPLES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.name)
@EXAMPLES
@given(fleet_logs, st.integers(0, 2**32))
def test_random_interleavings_of_the_input_streams_fold_to_one_state(
    core: CoreSpec[Any], log: tuple[list[Event], float], seed: int
) -> None:
    interleavings_fold_to_one_state(core, log[0], seed)


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.name)
@EXAMPLES
@given(any_fleet_logs, st.integers(0, 300))
def test_snapshot_restore_continue_equals_folding_from_the_start(
    core: CoreSpec[Any], log: tuple[list[Event], float], cut: int
) -> None:
    snapshot_restore_continue(core, log[0], cut)


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.name)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_fleet_logs)
def test_folding_and_deciding_leave_no_reference_cycles(core: CoreSpec[Any], log: tuple[list[Event], float]) -> None:
    no_reference_cycles(core, log[0], log[1])


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.name)
@EXAMPLES
@given(any_fleet_logs)
def test_decide_does_not_change_the_state(core: CoreSpec[Any], log: tuple[list[Event], float]) -> None:
    decide_only_reads(core, log[0], log[1] + 30.0)


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.name)
@EXAMPLES
@given(any_fleet_logs)
def test_a_restart_in_the_middle_of_a_cycle_decides_nothing_twice(
    core: CoreSpec[Any], log: tuple[list[Event], float]
) -> None:
    restart_mid_cycle(core, log[0], log[1] + 30.0)


def test_the_generated_logs_exercise_every_decision_of_both_cores() -> None:
    """The suite above is only as good as its logs: together they hold every kind of decision."""
    kinds = {type(e).__name__ for seed in range(30) for f in (False, True) for e in a_fleet_log(seed, 80, 4, f)[0]}
    wanted = {"NodeDiscovered", "NodeUpdated", "NodeLost", "NodeForgotten", "NodeIsolated", "GpuIsolated"}
    wanted |= {"NodeRestored"}
    wanted |= {"GpuRestored", "IsolationHeld", "IsolationDismissed", "FaultRecorded", "IsolationExtended"}
    assert wanted <= kinds, wanted - kinds
