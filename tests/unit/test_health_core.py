"""Health policy engine scenarios: given a fleet and faults, when the engine decides, then these events."""

from __future__ import annotations

import random

import pytest
from msgspec.structs import replace
from msgspec.structs import replace as with_

from events import GpuIsolated, GpuRestored, NodeIsolated, NodeRestored, NodeUpdated
from events.faults import FaultKind, Severity
from events.fleet import FaultRecorded, IsolationExtended, IsolationHeld, NodeLost, NodeStatus
from services.health.core import (
    Decision,
    HealthRefusal,
    HealthState,
    confirm,
    decide,
    event_id,
    evolve,
    new_state,
    restore,
)
from services.health.policy import Budget, Policy, load_policy
from tests.health_builders import T0, a_fault, a_fleet, a_sample

HOUR = 3600.0


@pytest.fixture(scope="module")
def default_policy() -> Policy:
    return load_policy()


def a_health_engine(policy: Policy, nodes: int = 4, **budget: float) -> HealthState:
    if budget:
        policy = replace(policy, budget=replace(policy.budget, **budget))
    state = new_state(policy)
    for event in a_fleet(nodes):
        evolve(state, event)
    return state


def step(state: HealthState, *inputs: object, now: float) -> list[Decision]:
    """Fold the inputs, decide at `now`, fold the decisions back (what the shell does)."""
    for item in inputs:
        evolve(state, item)
    decisions = decide(state, now)
    for d in decisions:
        evolve(state, d)
    return decisions


def events_of(decisions: list[Decision]) -> list[object]:
    return [d.event for d in decisions if d.event is not None]


def test_xid_79_isolates_the_whole_node_with_reason_and_fault_id(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    fault = a_fault("n001", xid=79, gpu=2)
    [decision] = step(state, fault, now=T0)
    assert decision.action == "isolate_node"
    event = decision.event
    assert isinstance(event, NodeIsolated)
    assert event.node == "n001" and event.fault_ids == [fault.fault_id]
    assert event.reason.startswith("xid-79: GPU has fallen off the bus")
    assert event.until == T0 + default_policy.probation.default_s


def test_a_dbe_on_one_gpu_isolates_only_that_gpu(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    fault = a_fault("n002", kind=FaultKind.ECC_DBE, gpu=3)
    [decision] = step(state, fault, now=T0)
    event = decision.event
    assert isinstance(event, GpuIsolated)
    assert (event.node, event.gpu_index, event.gpu_uuid) == ("n002", 3, "GPU-n002-03")
    assert event.reason.startswith("ecc_dbe: Volatile double-bit ECC error")
    assert state.nodes[("c1", "n002")].isolated is None


@pytest.mark.parametrize("fleet_first", [True, False])
def test_a_replay_without_the_inventory_knows_an_isolated_gpu_by_its_uuid_in_either_order(
    default_policy: Policy, fleet_first: bool
) -> None:
    # Discovery had not published the node's GPUs yet: the fault and the decision are all that name
    # the UUID, and a restarted service may fold FLEET (the decision) before FAULTS (the fault).
    fault = a_fault("n002", kind=FaultKind.ECC_DBE, gpu=5)
    [decision] = step(new_state(default_policy), fault, now=T0)
    assert isinstance(decision.event, GpuIsolated) and decision.event.gpu_uuid == "GPU-n002-05"
    rebuilt = new_state(default_policy)
    for item in [decision.event, fault] if fleet_first else [fault, decision.event]:
        evolve(rebuilt, item)
    node = rebuilt.nodes[("c1", "n002")]
    assert list(node.gpu_isolated) == [5] and node.gpus == {5: "GPU-n002-05"}
    assert events_of(step(rebuilt, now=T0)) == []


def test_an_application_xid_is_recorded_only_then_escalated_when_it_repeats_on_one_gpu(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    first = step(state, a_fault("n000", xid=13, gpu=1, at=T0, severity=Severity.WARNING), now=T0)
    assert [(d.action, type(d.event).__name__) for d in first] == [("record", "FaultRecorded")]
    assert first[0].reason.startswith("xid-13: Graphics Engine Exception") and first[0].fault_ids
    step(state, a_fault("n000", xid=13, gpu=1, at=T0 + 60), now=T0 + 60)
    [third] = step(state, a_fault("n000", xid=13, gpu=1, at=T0 + 120), now=T0 + 120)
    assert third.action == "isolate_gpu" and isinstance(third.event, GpuIsolated)
    assert len(third.fault_ids) == 3 and "seen 3 times in 3600s on GPU 1" in third.reason


def test_repeats_outside_the_window_do_not_escalate(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    for i in range(3):
        [d] = step(state, a_fault("n000", xid=13, gpu=1, at=T0 + i * 2 * HOUR), now=T0 + i * 2 * HOUR)
        assert d.action == "record"


def test_a_critical_nvlink5_fault_isolates_the_gpu_a_warning_only_records(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    [warn] = step(state, a_fault("n000", xid=149, gpu=0, severity=Severity.WARNING), now=T0)
    [crit] = step(state, a_fault("n001", xid=149, gpu=0, severity=Severity.CRITICAL), now=T0)
    assert (warn.action, crit.action) == ("record", "isolate_gpu")


def test_a_gpu_level_fault_that_names_no_gpu_isolates_the_node(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    fault = with_(a_fault("n000", kind=FaultKind.ECC_DBE, gpu=None), gpu_uuid=None)
    [d] = step(state, fault, now=T0)
    assert isinstance(d.event, NodeIsolated) and "names no GPU" in d.event.reason


def test_a_fault_naming_only_the_uuid_finds_the_gpu_index(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    fault = with_(a_fault("n000", kind=FaultKind.ECC_DBE, gpu=5), gpu_index=None)
    [d] = step(state, fault, now=T0)
    assert isinstance(d.event, GpuIsolated) and d.event.gpu_index == 5


def test_a_repeated_fault_id_is_decided_once(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    fault = a_fault("n000", xid=79)
    assert len(step(state, fault, now=T0)) == 1
    assert step(state, fault, now=T0 + 1) == []


def test_a_new_fault_on_an_isolated_target_restarts_its_probation(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    step(state, a_fault("n000", kind=FaultKind.ECC_DBE, gpu=1, at=T0), now=T0)
    [d] = step(state, a_fault("n000", kind=FaultKind.ECC_DBE, gpu=1, at=T0 + 600), now=T0 + 600)
    assert d.action == "extend" and isinstance(d.event, IsolationExtended) and d.event.until == T0 + 600 + HOUR
    iso = state.nodes[("c1", "n000")].gpu_isolated[1]
    assert iso.until == T0 + 600 + HOUR and len(iso.fault_ids) == 2


def test_faults_on_an_isolated_node_extend_the_node_isolation(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    step(state, a_fault("n000", xid=79, at=T0), now=T0)
    [d] = step(state, a_fault("n000", kind=FaultKind.ECC_DBE, gpu=4, at=T0 + 5), now=T0 + 5)
    assert d.action == "extend" and d.gpu_index is None
    assert state.nodes[("c1", "n000")].gpu_isolated == {}


# ------------------------------------------------------------------------------------ isolation budget


def test_the_isolation_budget_holds_a_storm_for_an_operator(default_policy: Policy) -> None:
    state = a_health_engine(default_policy, nodes=20, max_share=0.1, min_nodes=1)  # allowed: 2 nodes per hour
    faults = [a_fault(f"n{i:03d}", xid=79, at=T0 + i) for i in range(3)]
    decisions = step(state, *faults, now=T0 + 3)
    assert [d.action for d in decisions] == ["isolate_node", "isolate_node", "hold"]
    held = decisions[2].event
    assert isinstance(held, IsolationHeld) and held.node == "n002" and held.action == "isolate_node"
    assert "chamber health confirm n002" in held.reason and held.fault_ids == [faults[2].fault_id]
    # More GPUs on an already-counted node are not a fleet-wide storm.
    [more] = step(state, a_fault("n001", kind=FaultKind.ECC_DBE, gpu=0, at=T0 + 4), now=T0 + 4)
    assert more.action == "extend"  # n001 is isolated as a whole already
    # An operator confirms the held one.
    d = confirm(state, "c1", "n002", None, now=T0 + 100, by="alice")
    assert isinstance(d.event, NodeIsolated) and d.event.reason.startswith("xid-79: ")
    assert d.event.reason.endswith("; isolation confirmed by alice")
    evolve(state, d)
    assert state.held == {} and state.nodes[("c1", "n002")].isolated is not None


def test_the_budget_window_slides(default_policy: Policy) -> None:
    state = a_health_engine(default_policy, nodes=20, max_share=0.1, min_nodes=1)
    step(state, a_fault("n000", xid=79, at=T0), a_fault("n001", xid=79, at=T0), now=T0)
    decisions = step(state, a_fault("n002", xid=79, at=T0 + HOUR + 1), now=T0 + HOUR + 1)
    [later] = [d for d in decisions if d.node == "n002"]
    assert later.action == "isolate_node"


def test_confirm_without_a_held_isolation_is_refused_with_what_is_held(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    with pytest.raises(HealthRefusal, match="nothing is held"):
        confirm(state, "c1", "n000", None, now=T0, by="op")


# ------------------------------------------------------------------------------- probation and flapping


def test_a_gpu_is_restored_after_a_clean_probation(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    step(state, a_fault("n000", kind=FaultKind.ECC_DBE, gpu=1, at=T0), a_sample("n000", at=T0, dbe={1: 2}), now=T0)
    assert step(state, now=T0 + HOUR - 1) == []
    assert step(state, now=T0 + HOUR) == []  # the sample still shows the DBE: the GPU was not reset
    [d] = step(state, a_sample("n000", at=T0 + HOUR + 10), now=T0 + HOUR + 11)
    assert isinstance(d.event, GpuRestored) and d.event.by == "probation" and d.event.gpu_index == 1
    assert d.event.at == T0 + HOUR + 10  # when the clean sample proved it
    assert d.event.reason.startswith("clean probation after: ecc_dbe")


def test_samples_without_their_slow_fields_neither_dirty_nor_clean_a_gpu(default_policy: Policy) -> None:
    """The compact wire form leaves ECC counts and remap flags out while they stay the same."""
    state = a_health_engine(default_policy)
    step(state, a_fault("n000", kind=FaultKind.ECC_DBE, gpu=1, at=T0), a_sample("n000", at=T0, dbe={1: 2}), now=T0)
    unchanged = with_(a_sample("n000", at=T0 + HOUR + 5), slow_omitted=True)
    unchanged = with_(unchanged, gpus=[with_(g, ecc_dbe_volatile=None, row_remap=None) for g in unchanged.gpus])
    assert step(state, unchanged, now=T0 + HOUR + 6) == []  # no proof the DBE is gone: not restored
    [d] = step(state, a_sample("n000", at=T0 + HOUR + 10), now=T0 + HOUR + 11)
    assert isinstance(d.event, GpuRestored) and d.event.gpu_index == 1


def test_a_lost_node_is_not_restored_by_probation(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    step(state, a_fault("n000", xid=79, at=T0), now=T0)
    evolve(state, NodeLost(cluster="c1", node="n000", at=T0 + 60, last_seen_at=T0))
    assert step(state, now=T0 + 2 * HOUR) == []
    evolve(state, NodeUpdated(cluster="c1", node="n000", at=T0 + 3 * HOUR, status=NodeStatus.HEALTHY, gpus=[]))
    [d] = step(state, now=T0 + 3 * HOUR)
    assert isinstance(d.event, NodeRestored)


def test_a_node_that_flaps_stays_out_longer_each_time(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    step(state, a_fault("n000", xid=79, at=T0, fault_id="f1"), now=T0)
    [restored] = step(state, now=T0 + HOUR)
    assert isinstance(restored.event, NodeRestored)
    [again] = step(state, a_fault("n000", xid=79, at=T0 + HOUR + 60, fault_id="f2"), now=T0 + HOUR + 60)
    assert isinstance(again.event, NodeIsolated)
    assert again.event.until == T0 + HOUR + 60 + 4 * HOUR  # multiplier 4
    assert "flapping (1 re-isolation(s)" in again.event.reason
    step(state, now=T0 + 5 * HOUR + 60)
    [third] = step(state, a_fault("n000", xid=79, at=T0 + 6 * HOUR, fault_id="f3"), now=T0 + 6 * HOUR)
    assert third.event.until == T0 + 6 * HOUR + 16 * HOUR  # type: ignore[union-attr]


def test_a_fault_long_after_a_restore_is_not_a_flap(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    step(state, a_fault("n000", xid=79, at=T0, fault_id="f1"), now=T0)
    step(state, now=T0 + HOUR)
    later = T0 + HOUR + default_policy.flap.window_s + 1
    [d] = step(state, a_fault("n000", xid=79, at=later, fault_id="f2"), now=later)
    assert d.event.until == later + HOUR  # type: ignore[union-attr]


def test_a_manual_restore_rule_never_restores_by_probation(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    [d] = step(state, a_fault("n000", kind=FaultKind.ROW_REMAP_FAILURE, gpu=2), now=T0)
    assert isinstance(d.event, GpuIsolated) and d.event.until is None
    assert step(state, a_sample("n000", at=T0 + 30 * 24 * HOUR), now=T0 + 30 * 24 * HOUR) == []


def test_an_operator_restores_a_gpu_or_is_told_what_is_isolated(default_policy: Policy) -> None:
    state = a_health_engine(default_policy)
    step(state, a_fault("n000", kind=FaultKind.ROW_REMAP_FAILURE, gpu=2), now=T0)
    with pytest.raises(HealthRefusal, match=r"isolated GPUs there: \[2\] \(pass --gpu I\)"):
        restore(state, "c1", "n000", None, now=T0 + 10, by="op")
    d = restore(state, "c1", "n000", 2, now=T0 + 10, by="alice")
    assert isinstance(d.event, GpuRestored) and d.event.by == "operator" and "alice" in d.event.reason
    evolve(state, d)
    assert state.nodes[("c1", "n000")].gpu_isolated == {}
    with pytest.raises(HealthRefusal, match="not isolated by Chamber"):
        restore(state, "c1", "n000", 2, now=T0 + 20, by="alice")


# ----------------------------------------------------------------------------------- replay determinism


def a_random_history(seed: int, nodes: int = 30) -> list[tuple[float, list[object]]]:
    """Batches of (tick time, inputs): faults of every kind, samples, a node lost and back."""
    rng = random.Random(seed)
    kinds = [k for k in FaultKind if k != FaultKind.XID]
    xids = [13, 31, 48, 63, 74, 79, 94, 95, 119, 149]
    history: list[tuple[float, list[object]]] = []
    for tick in range(200):
        now = T0 + tick * 120.0
        batch: list[object] = []
        for _ in range(rng.randint(0, 3)):
            node = f"n{rng.randrange(nodes):03d}"
            if rng.random() < 0.5:
                fault = a_fault(node, xid=rng.choice(xids), gpu=rng.randrange(8), at=now, fault_id=f"f{tick}-{node}")
            else:
                fault = a_fault(node, kind=rng.choice(kinds), gpu=rng.choice([None, 0, 3]), at=now)
                fault = with_(fault, severity=rng.choice(list(Severity)), fault_id=f"g{tick}-{node}")
            batch.append(fault)
        batch.extend(a_sample(f"n{rng.randrange(nodes):03d}", at=now, dbe={0: rng.choice([0, 0, 1])}) for _ in range(3))
        history.append((now, batch))
    return history


def run(policy: Policy, history: list[tuple[float, list[object]]], nodes: int = 30) -> tuple[HealthState, list]:  # type: ignore[type-arg]
    state = a_health_engine(policy, nodes=nodes, max_share=0.1, min_nodes=2)
    log = []
    for now, batch in history:
        for d in step(state, *batch, now=now):
            if d.event is not None:
                log.append((event_id(d), d.event))
    return state, log


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replaying_the_same_inputs_gives_the_same_decisions_and_ids(default_policy: Policy, seed: int) -> None:
    history = a_random_history(seed)
    _, first = run(default_policy, history)
    _, second = run(default_policy, history)
    assert first == second
    kinds = {type(e).__name__ for _, e in first}
    assert {"NodeIsolated", "GpuIsolated", "IsolationHeld"} <= kinds  # the scenario exercises the engine
    assert len({i for i, _ in first}) == len(first)  # ids are unique per decision


@pytest.mark.parametrize("seed", [1, 2])
def test_replaying_fleet_then_faults_rebuilds_the_state_and_re_emits_nothing(default_policy: Policy, seed: int) -> None:
    history = a_random_history(seed)
    original, log = run(default_policy, history)
    last_tick = history[-1][0]
    # A restarted service: the FLEET stream (its own decisions) first, then FAULTS and samples.
    rebuilt = a_health_engine(default_policy, nodes=30, max_share=0.1, min_nodes=2)
    for _, event in log:
        evolve(rebuilt, event)
    for _, batch in history:
        for item in batch:
            evolve(rebuilt, item)
    assert events_of(step(rebuilt, now=last_tick)) == []
    assert events_of(step(rebuilt, now=last_tick)) == []

    def isolation_view(state: HealthState) -> dict:  # type: ignore[type-arg]
        return {
            key: (n.isolated and n.isolated.at, {g: i.at for g, i in n.gpu_isolated.items()})
            for key, n in state.nodes.items()
        }

    assert isolation_view(rebuilt) == isolation_view(original)
    assert set(rebuilt.held) == set(original.held)


def test_a_budget_of_the_whole_fleet_never_holds(default_policy: Policy) -> None:
    policy = replace(default_policy, budget=Budget(max_share=1.0, min_nodes=1, window_s=HOUR))
    state = a_health_engine(policy, nodes=10)
    decisions = step(state, *[a_fault(f"n{i:03d}", xid=79) for i in range(10)], now=T0)
    assert all(d.action == "isolate_node" for d in decisions) and len(decisions) == 10


@pytest.mark.parametrize(
    ("kind", "severity", "action"),
    [
        (FaultKind.ECC_DBE, Severity.CRITICAL, "isolate_gpu"),
        (FaultKind.ECC_SBE_STORM, Severity.WARNING, "record"),
        (FaultKind.RETIRED_PAGES, Severity.WARNING, "record"),
        (FaultKind.RETIRED_PAGES, Severity.CRITICAL, "isolate_gpu"),
        (FaultKind.ROW_REMAP_PENDING, Severity.WARNING, "record"),
        (FaultKind.ROW_REMAP_FAILURE, Severity.CRITICAL, "isolate_gpu"),
        (FaultKind.THERMAL, Severity.WARNING, "record"),
        (FaultKind.THERMAL, Severity.CRITICAL, "isolate_gpu"),
        (FaultKind.POWER, Severity.WARNING, "record"),
        (FaultKind.POWER, Severity.CRITICAL, "isolate_gpu"),
        (FaultKind.NVLINK, Severity.WARNING, "record"),
        (FaultKind.NVLINK, Severity.CRITICAL, "isolate_node"),
        (FaultKind.PCIE, Severity.WARNING, "record"),
        (FaultKind.GPU_LOST, Severity.CRITICAL, "isolate_node"),
        (FaultKind.AGENT_SILENT, Severity.WARNING, "record"),
        (FaultKind.OTHER, Severity.INFO, "record"),
        (FaultKind.OTHER, Severity.CRITICAL, "isolate_gpu"),
    ],
)
def test_the_engine_decides_every_fault_kind(
    default_policy: Policy, kind: FaultKind, severity: Severity, action: str
) -> None:
    state = a_health_engine(default_policy)
    [d] = step(state, a_fault("n000", kind=kind, gpu=2, severity=severity), now=T0)
    assert d.action == action and d.fault_ids and d.reason.startswith(f"{kind}: ")
    assert isinstance(d.event, FaultRecorded) == (action == "record")


@pytest.mark.parametrize("kind", [FaultKind.PCIE, FaultKind.ECC_SBE_STORM, FaultKind.THERMAL, FaultKind.NVLINK])
def test_repeated_warnings_escalate_per_the_dcgm_semantics(default_policy: Policy, kind: FaultKind) -> None:
    state = a_health_engine(default_policy)
    rule = default_policy.kinds[kind]
    assert rule.escalate is not None
    decisions = []
    for i in range(rule.escalate.count):
        decisions += step(state, a_fault("n000", kind=kind, gpu=2, at=T0 + i, severity=Severity.WARNING), now=T0 + i)
    assert [d.action for d in decisions] == ["record"] * (rule.escalate.count - 1) + [str(rule.escalate.action)]


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_the_budget_is_never_exceeded_without_an_operator(default_policy: Policy, seed: int) -> None:
    _, log = run(default_policy, a_random_history(seed))
    window = default_policy.budget.window_s
    allowed = max(2, int(0.1 * 30))
    isolations = [(e.at, e.node) for _, e in log if isinstance(e, NodeIsolated | GpuIsolated)]
    assert isolations
    for at, _ in isolations:
        assert len({n for t, n in isolations if at - window < t <= at}) <= allowed


def test_an_operator_dismisses_a_held_isolation_and_a_new_fault_is_decided_afresh(default_policy: Policy) -> None:
    from events.fleet import IsolationDismissed
    from services.health.core import dismiss

    state = a_health_engine(default_policy, nodes=20, max_share=0.1, min_nodes=1)
    step(state, *[a_fault(f"n{i:03d}", xid=79, at=T0 + i) for i in range(3)], now=T0 + 3)
    assert set(state.held) == {("c1", "n002", None)}
    d = dismiss(state, "c1", "n002", None, now=T0 + 50, by="bob")
    assert isinstance(d.event, IsolationDismissed) and d.event.reason.endswith("isolation dismissed by bob")
    evolve(state, d)
    assert state.held == {}
    with pytest.raises(HealthRefusal, match="nothing is held"):
        dismiss(state, "c1", "n002", None, now=T0 + 60, by="bob")
    decisions = step(state, a_fault("n002", xid=79, at=T0 + 2 * HOUR), now=T0 + 2 * HOUR)
    assert [d.action for d in decisions if d.node == "n002"] == ["isolate_node"]  # the budget window moved on
