"""`chamber quota import-kueue FILE` end to end: a shell script on stdout, refusals on stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.unit.test_kueue_import import EXAMPLE, cq, flavor, gpus

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")


def test_the_command_prints_a_script_and_refusals_apart(tmp_path: Path) -> None:
    done = subprocess.run([CHAMBER, "quota", "import-kueue", str(EXAMPLE), "--values-out", str(tmp_path / "v.yaml")],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert all(line.startswith(("#", "chamber ")) for line in lines)  # a shell script
    values = yaml.safe_load((tmp_path / "v.yaml").read_text())
    assert values["kube"]["bindings"]["namespaces"]["ml-speech"]["queues"] == {"speech": "speech"}

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump_all([flavor("f"), cq("a", queueingStrategy="StrictFIFO", resourceGroups=gpus("f", 4))])
    )
    done = subprocess.run([CHAMBER, "quota", "import-kueue", str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "chamber quota set a --pool default --gpus 4 --borrow-limit 0 --lend-limit 0 --replace" in done.stdout
    refused = "chamber quota import-kueue: error: not converted: ClusterQueue a: StrictFIFO has no equivalent"
    assert done.stderr.startswith(refused)

    missing = subprocess.run([CHAMBER, "quota", "import-kueue", str(tmp_path / "nope.yaml")], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
