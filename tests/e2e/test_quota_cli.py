"""`chamber quota set` is a patch, and a quota is a promise about installed GPUs: the quota service
as a process, driven by the CLI, on a fleet the test announces (as discovery would).

A first week of quota edits: a quota applied before any node joins (accepted, over-committed, with a
warning), limits added one flag at a time without losing the others, a budget added without touching
the limits, `--replace`, an isolation that must not make an unchanged quota invalid, and mistakes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from events import NodeIsolated
from services.runtime import Publisher
from tests.integration.test_runtime import eventually
from tests.scheduler_builders import a_node
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")


def run(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHAMBER, *args, "--nats", url], capture_output=True, text=True, timeout=60, check=False)


def ok(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = run(url, *args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done


@pytest.fixture
def quota_service(nats_server: SecuredNatsServer, tmp_path: Path) -> Iterator[None]:
    log = (tmp_path / "quota.log").open("w")
    proc = subprocess.Popen(
        [CHAMBER, "service", "quota", "--nats", nats_server.url_for("quota"), "--interval", "0.5"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def listed(url: str) -> dict[str, dict[str, object]]:
    return {f"{t['team']}/{t['pool']}": t for t in json.loads(ok(url, "quota", "list", "--json").stdout)["teams"]}


async def test_a_week_of_quota_edits(nats_server: SecuredNatsServer, js: JetStreamContext, quota_service: None) -> None:
    url = nats_server.url

    # Monday: quotas from GitOps (or a Kueue import) arrive before the nodes have joined
    def first() -> bool:
        return run(url, "quota", "set", "vision", "--gpus", "16").returncode == 0

    await eventually(first, within=30)
    done = ok(url, "quota", "set", "nlp", "--gpus", "8", "--weight", "2")
    assert done.stdout.splitlines()[0] == "team nlp: new quota in pool default"
    assert "weight         2" in done.stdout
    assert "warning: pool default is over-committed: guarantees total 24 GPUs" in done.stderr
    assert "24 more than the 0 installed" in done.stderr
    text = ok(url, "quota", "list").stdout
    assert "pool default: over-committed, 24 GPUs guaranteed of 0 installed" in text

    # the nodes join: 3 x 8 = 24 GPUs, no longer over-committed
    discovery = Publisher(js, source="test/discovery")
    for node in ("n1", "n2", "n3"):
        await discovery.publish(a_node(node, gpus=8))

    def joined() -> bool:
        return "over-committed" not in ok(url, "quota", "list").stdout

    await eventually(joined, within=20)

    # Tuesday: limits added one flag at a time; what is not named is kept, and the answer says so
    done = ok(url, "quota", "set", "vision", "--borrow-limit", "8", "--critical")
    lines = done.stdout.splitlines()
    assert lines[0] == "team vision: quota in pool default (2 changed)"
    assert "  gpus           16 \u2192 16 (kept)" in lines
    assert "  borrow-limit   no limit \u2192 8 (changed)" in lines
    assert "  critical       no \u2192 yes (changed)" in lines
    assert done.stderr == ""  # 24 guaranteed of 24 installed

    # Wednesday: a budget, which must not drop the borrow limit or the critical permission
    done = ok(url, "quota", "set", "vision", "--budget", "20000", "--on-budget", "hold")
    assert "  borrow-limit   8 \u2192 8 (kept)" in done.stdout
    assert "  critical       yes \u2192 yes (kept)" in done.stdout
    assert "budget         20000 USD/month, over it: hold (changed)" in done.stdout
    vision = listed(url)["vision/default"]
    settings = (vision["borrow_limit"], vision["critical"], vision["budget"], vision["on_budget"])
    assert settings == (8, True, 20000, "hold")
    text = ok(url, "quota", "list").stdout
    header, row = text.splitlines()[0], next(line for line in text.splitlines() if line.startswith("vision"))
    for column in ("NP-LEND", "CRIT", "BUDGET"):
        assert column in header
    assert "20000/hold" in row and "yes" in row
    table = [line for line in text.splitlines() if not line.startswith(("pool ", "("))]
    assert len({len(line) for line in table}) == 1, text  # aligned: the last column ends at one place

    # Thursday: ten GPUs isolated; an unchanged guarantee stays valid, a weight change goes through
    await discovery.publish(NodeIsolated(cluster="c1", node="n1", at=1.0, reason="xid-79"))

    def isolated() -> bool:
        return any(p["in_service"] == 16 for p in json.loads(ok(url, "quota", "list", "--json").stdout)["pools"])

    await eventually(isolated, within=20)
    done = ok(url, "quota", "set", "vision", "--weight", "3")
    assert done.stderr == "" and "  weight         1 \u2192 3 (changed)" in done.stdout

    # Friday: --replace sets the whole quota; flags not given go back to their defaults
    done = ok(url, "quota", "set", "vision", "--gpus", "16", "--replace")
    assert "replaced" in done.stdout.splitlines()[0]
    assert "  borrow-limit   8 \u2192 no limit (changed)" in done.stdout
    assert "  critical       yes \u2192 no (changed)" in done.stdout
    assert "  weight         3 \u2192 1 (changed)" in done.stdout
    assert listed(url)["vision/default"]["budget"] == 20000  # the team's budget is not part of a pool quota

    # mistakes: a clear message, exit 2, nothing changed
    for args, words in (
        (("quota", "set", "vision"), "nothing to change"),
        (("quota", "set", "speech", "--weight", "2"), "no quota in this pool yet"),
        (("quota", "set", "visoin", "--gpus", "2"), "team 'visoin' has no quota in pool default; did you mean"),
        (("quota", "set", "vision", "--replace", "--weight", "2"), "--replace sets the whole quota: give --gpus N"),
        (("quota", "set", "vision", "--gpus", "4", "--lend-limit", "9"), "above the guarantee"),
        (("quota", "set", "vision", "--borrow-limit", "lots"), "expected a whole number of GPUs"),
    ):
        done = run(url, *args)
        assert done.returncode == 2 and words in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert listed(url)["vision/default"]["guaranteed"] == 16

    # a limit cleared in a patch: `none`
    ok(url, "quota", "set", "vision", "--borrow-limit", "4")
    done = ok(url, "quota", "set", "vision", "--borrow-limit", "none")
    assert "  borrow-limit   4 \u2192 no limit (changed)" in done.stdout
    answer = json.loads(ok(url, "quota", "set", "vision", "--weight", "2", "--json").stdout)
    assert answer["settings"]["borrow_limit"] is None and answer["warnings"] == []

    # the pools: what is installed, in service (n1 isolated) and guaranteed
    pools = ok(url, "quota", "pool", "list").stdout.splitlines()
    assert pools[0].split() == ["POOL", "SELECTS", "INSTALLED", "IN", "SERVICE", "GUARANTEED", "OVER-COMMITTED"]
    assert pools[1].split()[0] == "default" and pools[1].split()[-4:] == ["24", "16", "24", "-"]
