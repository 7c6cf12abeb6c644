"""`chamber health policy` and argument checks, without a running stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli import main

pytestmark = pytest.mark.e2e


def test_policy_json_lists_every_xid_with_severity_action_and_description(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "policy", "--json", "--local"]) == 0
    policy = json.loads(capsys.readouterr().out)
    assert len(policy["xid"]) == 172
    for code, rule in policy["xid"].items():
        assert {"severity", "action", "description"} <= set(rule), code
        assert rule["action"] in {"record", "isolate_gpu", "isolate_node"}
    assert policy["xid"]["79"]["action"] == "isolate_node" and policy["xid"]["48"]["action"] == "isolate_gpu"


def test_policy_with_an_operator_file_shows_the_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    override = tmp_path / "policy.yaml"
    override.write_text("xid:\n  13: {action: isolate_gpu, severity: warning}\n")
    assert main(["health", "policy", "--json", "--policy", str(override)]) == 0
    rule = json.loads(capsys.readouterr().out)["xid"]["13"]
    assert (rule["action"], rule["severity"], rule["description"]) == (
        "isolate_gpu",
        "warning",
        "Graphics Engine Exception",
    )


def test_a_bad_policy_file_is_one_line_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    override = tmp_path / "policy.yaml"
    override.write_text("budget: {max_share: 3}\n")
    assert main(["health", "policy", "--policy", str(override)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "budget.max_share: Expected `float` <= 1.0, got 3" in err


def test_the_policy_table_is_readable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "policy", "--local"]) == 0
    out = capsys.readouterr().out
    assert "\n 79  critical  isolate_node  GPU has fallen off the bus\n" in out
    assert out.startswith("XID  SEVERITY  ACTION        DESCRIPTION\n")
    assert "ecc_dbe" in out and "budget: 10% of nodes (at least 2) per 3600s" in out


def test_a_negative_gpu_index_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "restore", "gpu-1", "--gpu", "-1"]) == 2
    assert "--gpu must be a GPU index" in capsys.readouterr().err
