"""The default health policy: complete over NVIDIA's XID catalog, faithful to its buckets, overridable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from events.faults import FaultKind, Severity
from services.health.policy import Action, PolicyError, Restore, load_policy, merge, parse_policy
from tests.health_builders import a_fault


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    return load_policy()


def test_every_xid_code_of_the_catalog_has_a_severity_and_an_action(policy) -> None:  # type: ignore[no-untyped-def]
    assert sorted(policy.xid) == list(range(1, 173))
    for code, rule in policy.xid.items():
        assert rule.description, code
        assert rule.action in Action and rule.severity in Severity


@pytest.mark.parametrize(
    ("xid", "action"),
    [
        (79, Action.ISOLATE_NODE),  # fallen off the bus: RESTART_BM
        (48, Action.ISOLATE_GPU),  # DBE: drain and reset the GPU
        (95, Action.ISOLATE_GPU),  # uncontained: RESET_GPU
        (119, Action.ISOLATE_GPU),  # GSP RPC timeout: RESET_GPU
        (74, Action.ISOLATE_NODE),  # NVLink: multi-GPU work on the node is affected
        (151, Action.ISOLATE_NODE),  # RESTART_VM
        (13, Action.RECORD),  # application error (device plugin ignores it too)
        (31, Action.RECORD),
        (43, Action.RECORD),
        (45, Action.RECORD),
        (63, Action.RECORD),  # remap recorded: keep serving
        (94, Action.RECORD),  # contained: restart the app
    ],
)
def test_actions_follow_nvidias_recommended_resolution(policy, xid: int, action: Action) -> None:  # type: ignore[no-untyped-def]
    assert policy.xid[xid].action == action


def test_every_reset_gpu_bucket_isolates_at_least_the_gpu(policy) -> None:  # type: ignore[no-untyped-def]
    for code, rule in policy.xid.items():
        if rule.nvidia.startswith("RESET_GPU"):
            assert rule.action != Action.RECORD, code


@pytest.mark.parametrize(
    ("kind", "action", "severity"),
    [
        (FaultKind.ECC_DBE, Action.ISOLATE_GPU, Severity.CRITICAL),
        (FaultKind.ROW_REMAP_FAILURE, Action.ISOLATE_GPU, Severity.CRITICAL),
        (FaultKind.ROW_REMAP_PENDING, Action.RECORD, Severity.WARNING),
        (FaultKind.ECC_SBE_STORM, Action.RECORD, Severity.WARNING),
        (FaultKind.THERMAL, Action.RECORD, Severity.WARNING),
        (FaultKind.POWER, Action.RECORD, Severity.WARNING),
        (FaultKind.NVLINK, Action.RECORD, Severity.WARNING),
        (FaultKind.PCIE, Action.RECORD, Severity.WARNING),
        (FaultKind.GPU_LOST, Action.ISOLATE_NODE, Severity.CRITICAL),
        (FaultKind.RETIRED_PAGES, Action.RECORD, Severity.WARNING),
        (FaultKind.AGENT_SILENT, Action.RECORD, Severity.WARNING),
        (FaultKind.OTHER, Action.RECORD, Severity.WARNING),
    ],
)
def test_every_fault_kind_has_a_rule(policy, kind: FaultKind, action: Action, severity: Severity) -> None:  # type: ignore[no-untyped-def]
    rule = policy.rule_for(a_fault(kind=kind, xid=None))
    assert (rule.action, rule.severity) == (action, severity)


def test_a_row_remap_failure_is_restored_by_an_operator_only(policy) -> None:  # type: ignore[no-untyped-def]
    assert policy.kinds[FaultKind.ROW_REMAP_FAILURE].restore == Restore.MANUAL
    assert policy.xid[64].restore == Restore.MANUAL


def test_an_unknown_xid_gets_the_unknown_rule_under_its_own_code(policy) -> None:  # type: ignore[no-untyped-def]
    rule = policy.rule_for(a_fault(xid=999))
    assert rule.key == "xid-999" and rule.action == Action.RECORD and rule.escalate is not None


def test_an_operator_file_overrides_one_field_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("xid:\n  13: {action: isolate_gpu}\nbudget: {max_share: 0.5}\n")
    policy = load_policy(path)
    assert policy.xid[13].action == Action.ISOLATE_GPU
    assert policy.xid[13].description == "Graphics Engine Exception"
    assert policy.budget.max_share == 0.5 and policy.budget.window_s == 3600
    assert policy.xid[79].action == Action.ISOLATE_NODE


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"xid": {13: {"action": "reboot"}}},
            ("xid.13.action: Invalid enum value 'reboot'; use one of ['record', 'isolate_gpu', 'isolate_node']"),
        ),
        ({"budget": {"max_share": 2}}, "budget.max_share: Expected `float` <= 1.0, got 2"),
        ({"budget": {"max_shares": 0.2}}, "budget: Object contains unknown field `max_shares`"),
        ({"flap": {"multiplier": "four"}}, "flap.multiplier: Expected `float`, got `str`"),
        ({"xid": {13: {"escalate": {"count": 0, "window_s": 60, "action": "isolate_gpu"}}}}, "xid.13.escalate.count"),
        (
            {"kinds": {"ecc_dbe": {"severity": "fatal"}}},
            "kinds.ecc_dbe.severity: Invalid enum value 'fatal'; use one of",
        ),
        ({"kinds": {"cosmic_rays": {"severity": "info", "action": "record"}}}, "kinds.cosmic_rays: unknown fault kind"),
        ({"xid": {"abc": {"severity": "info", "action": "record"}}}, "xid.abc: XID codes are integers"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_key(override: dict, message: str) -> None:  # type: ignore[type-arg]
    import yaml

    from services.health.policy import DEFAULT_POLICY_PATH

    base = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    with pytest.raises(PolicyError, match=re.escape(message)):
        parse_policy(merge(base, override))


def test_policy_json_has_the_contract_shape(policy) -> None:  # type: ignore[no-untyped-def]
    out = policy.to_json()
    assert out["xid"]["79"] == {
        **out["xid"]["79"],
        "severity": "critical",
        "action": "isolate_node",
        "description": "GPU has fallen off the bus",
    }
    assert set(out) >= {"xid", "kinds", "budget", "flap", "probation"}


def test_a_misspelt_key_in_an_operator_file_is_refused_not_ignored(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("probation:\n  default_sec: 600\n")  # `default_s` misspelt: silently ignored, it would keep 3600
    with pytest.raises(PolicyError, match=re.escape("probation: Object contains unknown field `default_sec`")):
        load_policy(path)
