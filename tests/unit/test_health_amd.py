"""The AMD twin of the health fault table: each AMD fault class, as the agent's detectors rate it, gets
the action the default policy's AMD rules give it; flap damping and the isolation budget apply as for NVIDIA."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from events import GpuIsolated, NodeIsolated
from events.faults import FaultKind, GpuFaultDetected, Severity
from events.fleet import FaultRecorded, IsolationHeld
from node_agent.detectors import DetectorState, detect
from node_agent.sim.fleet import SimFleet
from node_agent.sim.models import gpu_model
from services.health.core import HealthState, new_state
from services.health.policy import Action, Policy, Restore, load_policy
from tests.health_builders import T0, a_fault
from tests.unit.test_health_core import a_health_engine, step

HOUR = 3600.0


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy()


def amd_fault(node: str, kind: FaultKind, severity: Severity, *, gpu: int | None = 2, block: str | None = None,
              afid: int | None = None, at: float = T0, fault_id: str | None = None) -> GpuFaultDetected:  # fmt: skip
    f = a_fault(node, kind=kind, gpu=gpu, severity=severity, at=at, fault_id=fault_id)
    return replace(f, ras_block=block, afid=afid)


# (fault kind, RAS block or AFID, the detector's severity) -> the action and who is isolated
AMD_TABLE = [
    (FaultKind.AMD_RAS_UE, "umc", None, Severity.CRITICAL, Action.ISOLATE_GPU, GpuIsolated),
    (FaultKind.AMD_RAS_UE, "gfx", None, Severity.CRITICAL, Action.ISOLATE_GPU, GpuIsolated),
    (FaultKind.AMD_RAS_UE, "sdma", None, Severity.CRITICAL, Action.ISOLATE_GPU, GpuIsolated),
    (FaultKind.AMD_RAS_UE, "mmhub", None, Severity.CRITICAL, Action.ISOLATE_GPU, GpuIsolated),
    (FaultKind.AMD_RAS_UE, "hdp", None, Severity.CRITICAL, Action.ISOLATE_GPU, GpuIsolated),
    (FaultKind.AMD_RAS_UE, "pcie_bif", None, Severity.CRITICAL, Action.ISOLATE_GPU, GpuIsolated),
    (FaultKind.AMD_RAS_UE, "xgmi_wafl", None, Severity.CRITICAL, Action.ISOLATE_NODE, NodeIsolated),
    (FaultKind.AMD_RAS_UE, "mp1", None, Severity.CRITICAL, Action.ISOLATE_GPU, GpuIsolated),  # no own rule
    (FaultKind.AMD_BAD_PAGES, None, None, Severity.CRITICAL, Action.ISOLATE_GPU, GpuIsolated),
    (FaultKind.AMD_BAD_PAGES, None, None, Severity.WARNING, Action.RECORD, FaultRecorded),
    (FaultKind.AMD_CPER, None, 30, Severity.CRITICAL, Action.ISOLATE_GPU, GpuIsolated),  # device internal, fatal
    (FaultKind.AMD_CPER, None, 28, Severity.WARNING, Action.RECORD, FaultRecorded),  # the same, non-fatal
    (FaultKind.AMD_CPER, None, 18, Severity.CRITICAL, Action.ISOLATE_NODE, NodeIsolated),  # XGMI fatal: the hive
    (FaultKind.AMD_CPER, None, 19, Severity.CRITICAL, Action.ISOLATE_GPU, GpuIsolated),  # bad-page threshold
    (FaultKind.AMD_CPER, None, 24, Severity.INFO, Action.RECORD, FaultRecorded),  # HBM corrected
    (FaultKind.AMD_CPER, None, 31, Severity.CRITICAL, Action.ISOLATE_GPU, GpuIsolated),  # undecodable: by severity
    (FaultKind.AMD_CPER, None, None, Severity.WARNING, Action.RECORD, FaultRecorded),  # no AFID, non-fatal
    (FaultKind.AMD_CPER, None, None, Severity.INFO, Action.RECORD, FaultRecorded),  # corrected
    (FaultKind.GPU_RESET_STUCK, None, None, Severity.CRITICAL, Action.ISOLATE_NODE, NodeIsolated),
    (FaultKind.XGMI, None, None, Severity.CRITICAL, Action.ISOLATE_NODE, NodeIsolated),
]


@pytest.mark.parametrize(("kind", "block", "afid", "severity", "action", "event"), AMD_TABLE)
def test_each_amd_fault_class_gets_its_action(policy: Policy, kind, block, afid, severity, action, event) -> None:  # type: ignore[no-untyped-def]
    state = a_health_engine(policy)
    [d] = step(state, amd_fault("n001", kind, severity, block=block, afid=afid), now=T0)
    assert (d.action, type(d.event)) == (action, event)
    rule = policy.rule_for(amd_fault("n001", kind, severity, block=block, afid=afid))
    assert rule.amd, f"{rule.key} cites no AMD source"


def test_a_umc_ue_names_its_rule_and_an_rma_is_restored_by_hand(policy: Policy) -> None:
    state = a_health_engine(policy)
    [d] = step(state, amd_fault("n000", FaultKind.AMD_RAS_UE, Severity.CRITICAL, block="umc"), now=T0)
    assert d.event.reason.startswith("amd_ras-umc: HBM (UMC) uncorrectable ECC error")  # type: ignore[union-attr]
    assert policy.kinds[FaultKind.AMD_BAD_PAGES].restore == Restore.MANUAL


def test_an_operator_afid_rule_wins_over_the_cper_severity(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "policy.yaml"
    path.write_text(
        'amd_afid:\n  30: {severity: critical, action: isolate_node, description: AFID 30, amd: "AFID Event List"}\n'
    )
    custom = load_policy(path)
    state = a_health_engine(custom)
    [d] = step(state, amd_fault("n000", FaultKind.AMD_CPER, Severity.WARNING, afid=30), now=T0)
    assert isinstance(d.event, NodeIsolated) and d.event.reason.startswith("amd_afid-30: AFID 30")


def test_a_flapping_amd_gpu_stays_out_longer(policy: Policy) -> None:
    state = a_health_engine(policy)
    ue = FaultKind.AMD_RAS_UE
    step(state, amd_fault("n000", ue, Severity.CRITICAL, block="gfx", at=T0, fault_id="a1"), now=T0)
    [restored] = step(state, now=T0 + HOUR)
    assert restored.action == "restore_gpu"
    [again] = step(state, amd_fault("n000", ue, Severity.CRITICAL, block="gfx", at=T0 + HOUR + 60, fault_id="a2"),
                   now=T0 + HOUR + 60)  # fmt: skip
    assert isinstance(again.event, GpuIsolated) and again.event.until == T0 + HOUR + 60 + 4 * HOUR


def test_a_storm_of_stuck_resets_is_held_by_the_budget(policy: Policy) -> None:
    state = a_health_engine(policy, nodes=20, max_share=0.1, min_nodes=1)
    faults = [amd_fault(f"n{i:03d}", FaultKind.GPU_RESET_STUCK, Severity.CRITICAL, at=T0 + i) for i in range(3)]
    decisions = step(state, *faults, now=T0 + 3)
    assert [d.action for d in decisions] == ["isolate_node", "isolate_node", "hold"]
    assert isinstance(decisions[2].event, IsolationHeld)


@pytest.mark.parametrize(
    ("inject", "action"),
    [("amd_umc_ue", "isolate_gpu"), ("amd_gfx_ue", "isolate_gpu"), ("amd_bad_pages", "isolate_gpu"),
     ("amd_cper_fatal", "isolate_gpu"), ("xgmi_down", "isolate_node"), ("amd_reset_hang", "isolate_node")],
)  # fmt: skip
def test_from_the_simulated_gpu_to_the_decision(policy: Policy, inject: str, action: str) -> None:
    """End to end without NATS: a simulated MI300X node, the agent's detectors, the health engine."""
    fleet = SimFleet(seed=1, nodes=2, gpus_per_node=8, model=gpu_model("MI300X-192GB"), prefix="n",
                     amd_nodes=2, amd_model=gpu_model("MI300X-192GB"))  # fmt: skip
    node = fleet.nodes["n-001"]
    health: HealthState = new_state(policy)
    detectors, _ = detect(DetectorState(), node.read("c1", 1, T0, 1.0))
    fleet.inject("n-001", inject, 5, None, T0 + 0.5)
    decisions = []
    for n in range(1, 70):
        detectors, faults = detect(detectors, node.read("c1", 1 + n, T0 + n, 1.0))
        decisions += step(health, *faults, now=T0 + n)
    assert [d.action for d in decisions] == [action]
    assert decisions[0].event.node == "n-001"  # type: ignore[union-attr]


def test_the_default_afid_table_is_amds_list(policy: Policy) -> None:
    # AFIDs 1-30 of AMD's list (31-34: the record could not be decoded), each citing it, each acting by
    # AMD's severity: Fail-to-init and Fatal isolate, non-fatal uncorrected escalates, corrected records.
    assert sorted(policy.amd_afid) == list(range(1, 31))
    for afid, rule in policy.amd_afid.items():
        assert rule.amd.startswith("ROCm/amdsmi src/aca-decode/error_map.c"), afid
        amd_severity = rule.amd.rsplit(" / ", 1)[1]
        isolates = rule.action in (Action.ISOLATE_GPU, Action.ISOLATE_NODE)
        assert isolates == (amd_severity in ("Fatal", "Fail-to-init")), afid
        assert (rule.escalate is not None) == (amd_severity == "Uncorrected, Non-fatal"), afid
