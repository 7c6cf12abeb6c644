"""`chamber sim place` as a user runs it: one entry per arrival, refusals as null, bad files named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def place(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "services.cli", "sim", "place", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_every_arrival_gets_exactly_one_entry(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,8000,32768,2,T4\nn1,16000,65536,1,V100\n")
    arrivals = tmp_path / "arrivals.csv"
    arrivals.write_text(
        "arrival_idx,name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "0,half,1000,1024,1,500,T4\n"
        "1,cpu-only,1000,1024,0,0,\n"
        "2,both,1000,1024,2,1000,\n"
        "3,v100,1000,1024,1,1000,V100\n"
        "4,too-big,1000,1024,4,1000,\n"
        "5,half-again,1000,1024,1,500,T4|V100\n"
    )
    result = place("--nodes", str(nodes), "--arrivals", str(arrivals), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["scheduler"] == "chamber"
    spots = doc["placements"]
    assert len(spots) == 6
    assert spots[0][0] == "n0" and len(spots[0][1]) == 1
    assert spots[1][1] == []
    assert spots[2] is None, "n0's other GPU is whole but one of its two is half taken"
    assert spots[3] == ["n1", [0]]
    assert spots[4] is None
    assert spots[5] == ["n0", spots[0][1]], "the second half shares the GPU the first half opened"


def test_a_bad_file_is_named_with_its_line_and_no_traceback(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,eight,32768,2,T4\n")
    result = place("--nodes", str(nodes), "--arrivals", str(tmp_path / "missing.csv"))
    assert result.returncode == 2
    assert f"{nodes}:2: cpu_milli is 'eight', not a number" in result.stderr
    assert "Traceback" not in result.stderr
