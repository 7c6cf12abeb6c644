"""`chamber sim --fault-rate`: GPU-hours lost to node faults moving jobs on a precursor versus waiting."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_sim_cli import sim

pytestmark = pytest.mark.e2e


def test_fault_rate_reports_both_ways_and_the_saving() -> None:
    args = ("--gpus", "128", "--jobs", "400", "--fault-rate", "0.5", "--seed", "3", "--precursor-share", "0.5")
    result = sim(*args, "--json")
    assert result.returncode == 0, result.stderr
    faults = json.loads(result.stdout)["faults"]
    assert faults["policy"] == "chamber" and faults["precursors"] <= faults["faults"]
    assert faults["model"]["precursor_share"] == 0.5 and faults["model"]["detection_s"] == 10.0
    proactive, waiting = faults["proactive"], faults["waiting_run"]
    assert waiting["fault_moves"] == 0 and proactive["fault_moves"] > 0
    saved = faults["waiting_same_faults_gpu_hours"] - proactive["lost_to_faults_gpu_hours"]
    assert faults["saved_gpu_hours"] == pytest.approx(saved, abs=0.01) and saved > 0
    table = sim(*args)
    assert "GPU-hours saved by proactive moves" in table.stdout
    assert json.loads(sim(*args, "--json").stdout)["faults"] == faults  # seeded: the same twice


def test_a_bad_fault_model_is_one_clear_line() -> None:
    bad = sim("--gpus", "8", "--jobs", "5", "--fault-rate", "1", "--precursor-share", "1.5")
    assert bad.returncode == 2 and "--precursor-share must be between 0 and 1" in bad.stderr
    assert "Traceback" not in bad.stderr
    hang = sim("--gpus", "8", "--jobs", "5", "--fault-rate", "1", "--hang-timeout", "-1")
    assert hang.returncode == 2 and "--hang-timeout must be a finite number of seconds" in hang.stderr
