"""An operator's first week, compressed: every part is its own process on the secured bus, the test
types the commands a platform engineer would and checks each message they read.

Monday, before the nodes join, the Kueue queues are imported (accepted, with the over-commitment
said); the nodes join; quota edits change only what they name; a typo gets a "did you mean"; a job
runs, a GPU under it fails and it moves, saying from where; ten GPUs are isolated on two nodes, and
the eleventh fault, on a third node, is held for an operator (the budget is spent), visible in
`chamber health held`, `chamber fleet` and `chamber explain`; a team spends past its budget and
`explain` says so; prices and pools are listed as tables.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from nats.js import JetStreamContext

from tests.e2e.test_scheduler_e2e import CHAMBER
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer
from tests.unit.test_kueue_import import cq, flavor, gpus

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.bus_cluster("week")]

NODES = [f"sim-{i:03d}" for i in range(4)]  # 4 x 8 H100-80GB


@pytest.fixture
def week(nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path) -> Iterator[dict[str, object]]:
    """The services; the simulated fleet is started by the test, after the Kueue import."""
    parts = {
        "discovery": ["service", "discovery", "--tick", "0.5", "--view-every", "1"],
        "health": ["service", "health", "--tick", "0.5"],
        "quota": ["service", "quota", "--interval", "0.5"],
        "scheduler": ["service", "scheduler", "--interval", "0.2"],
        "billing": ["service", "billing", "--period", "1", "--settle", "0", "--tick", "0.5",
                    "--price", "H100-80GB=3600"],
    }  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CHAMBER_CLUSTER": "week"}
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        env.pop(var, None)
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, argv: list[str], role: str) -> None:
        log = (tmp_path / f"{name}.log").open("w")
        procs[name] = subprocess.Popen(
            [CHAMBER, *argv, "--nats", nats_server.url_for(role)], stdout=log, stderr=subprocess.STDOUT, env=env
        )

    for name, argv in parts.items():
        start(name, argv, name)
    agent = ["agent", "--simulate", "--nodes", str(len(NODES)), "--interval", "0.5", "--spool", str(tmp_path)]
    try:
        yield {"join": lambda: start("agent", agent, "simulator")}
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def run(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHAMBER, *args, "--nats", url], capture_output=True, text=True, timeout=60, check=False)


async def arun(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run, url, *args)


async def ok(url: str, *args: str) -> str:
    done = await arun(url, *args)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


async def until(url: str, *args: str, has: str, within: float = 30.0) -> str:
    """The command's output once it contains `has` (the services fold in their own time)."""
    out: list[str] = []

    async def check() -> bool:
        done = await arun(url, *args)
        out[:] = [done.stdout + done.stderr]
        return has in out[0]

    try:
        await eventually(check, within=within)
    except AssertionError:
        raise AssertionError(f"{args}: never said {has!r}; last:\n{out[0] if out else ''}") from None
    return out[0]


async def test_an_operators_first_week(nats_server: SecuredNatsServer, week: dict[str, object], tmp_path: Path) -> None:
    url = nats_server.url

    # -- Monday: the Kueue queues, before any node has joined ------------------------------------------
    queues = tmp_path / "queues.yaml"
    queues.write_text(
        yaml.safe_dump_all(
            [flavor("h100"), cq("nlp", cohort="all", resourceGroups=gpus("h100", 8)),
             cq("vision", cohort="all", resourceGroups=gpus("h100", 16))]
        )
    )  # fmt: skip
    script = await asyncio.to_thread(
        subprocess.run, [CHAMBER, "quota", "import-kueue", str(queues)], capture_output=True, text=True, timeout=60
    )
    assert script.returncode == 0 and script.stderr == ""
    commands = [line for line in script.stdout.splitlines() if line.startswith("chamber ")]
    assert commands == [
        "chamber quota set nlp --pool default --gpus 8 --replace",
        "chamber quota set vision --pool default --gpus 16 --replace",
    ]
    await until(url, "quota", "list", has="no quotas")  # the quota service answers
    nlp = await arun(url, *shlex.split(commands[0])[1:])
    assert nlp.returncode == 0, nlp.stderr
    assert nlp.stdout.splitlines()[0] == "team nlp: new quota in pool default"
    assert nlp.stderr == (
        "chamber quota set: warning: pool default is over-committed: guarantees total 8 GPUs (other teams 0), "
        "8 more than the 0 installed; until more join, a team below its guarantee may wait for GPUs that other "
        "teams hold within theirs\n"
    )
    vision = await arun(url, *shlex.split(commands[1])[1:])
    assert vision.returncode == 0 and "guarantees total 24 GPUs (other teams 8), 24 more than the 0" in vision.stderr
    pools = await ok(url, "quota", "pool", "list")
    assert pools.splitlines()[0].split() == ["POOL", "SELECTS", "INSTALLED", "IN", "SERVICE", "GUARANTEED",
                                             "OVER-COMMITTED"]  # fmt: skip
    assert re.search(r"^default\s+every node no other pool selects\s+0\s+0\s+24\s+over by 24$", pools, re.M), pools

    # -- the nodes join ------------------------------------------------------------------------------
    week["join"]()  # type: ignore[operator]
    await until(url, "fleet", has="4 nodes, 32 GPUs, 32 in service")
    pools = await until(url, "quota", "pool", "list", has=" 32  ")
    assert re.search(r"^default\s+every node no other pool selects\s+32\s+32\s+24\s+-$", pools, re.M), pools

    # -- quota edits are patches -------------------------------------------------------------------------
    borrow = await ok(url, "quota", "set", "vision", "--borrow-limit", "8")
    assert borrow.splitlines()[0] == "team vision: quota in pool default (1 changed)"
    assert "  borrow-limit   no limit \u2192 8 (changed)" in borrow.splitlines()
    budget = await ok(url, "quota", "set", "vision", "--budget", "1")
    assert "  borrow-limit   8 \u2192 8 (kept)" in budget.splitlines()
    assert "  gpus           16 \u2192 16 (kept)" in budget.splitlines()
    assert budget.splitlines()[-1] == "  budget         1 USD/month, over it: notify (changed)"

    # -- a typo, and a pool that does not exist ------------------------------------------------------------
    typo = await arun(url, "submit", "--team", "vison", "--gpus", "8")
    assert (typo.returncode, typo.stderr) == (2, "chamber submit: error: no team 'vison'; did you mean 'vision'? "
                                                 "(field: team)\n")  # fmt: skip
    pool = await arun(url, "submit", "--team", "vision", "--gpus", "8", "--pool", "defualt")
    assert pool.stderr == (
        "chamber submit: error: no pool 'defualt' (pools: default); did you mean 'default'? (field: pool)\n"
    )
    too_big = await arun(url, "submit", "--team", "nlp", "--gpus", "8", "--replicas", "5")
    assert too_big.returncode == 2
    assert "the job asks for 40 GPUs and pool default has 32 installed" in too_big.stderr
    kept = await arun(url, "submit", "--team", "nlp", "--gpus", "8", "--replicas", "5", "--id", "huge", "--allow-wait")
    assert kept.stdout == "huge\n" and kept.stderr.startswith(
        "chamber submit: warning: it cannot run until this changes: the job asks for 40 GPUs and pool default has 32"
    )
    listed_apart = (await ok(url, "queue")).split("\n\ncannot run as specified (1; kept with --allow-wait until the ")
    assert "huge" not in listed_apart[0] and re.search(r"^huge\s+nlp\s+5x8\s+the job asks for 40 GPUs",
                                                       listed_apart[1], re.M), listed_apart  # fmt: skip
    assert (await ok(url, "cancel", "huge")) == "huge cancelled\n"

    # -- a job runs; a GPU under it fails; it moves and says from where ------------------------------------
    assert await ok(url, "submit", "--team", "vision", "--gpus", "8", "--name", "train", "--id", "train") == "train\n"
    running = await until(url, "explain", "train", has=" is running on ")
    first = re.search(r"is running on (sim-\d+)\[0,1,2,3,4,5,6,7\]", running)
    assert first, running
    node_a = first.group(1)
    fault = await ok(url, "sim-fault", node_a, "ecc_dbe", "--gpu", "0")
    assert fault.startswith(f"injected ecc dbe on {node_a} GPU 0; the agent reports it at its next sample")
    moved = await until(url, "explain", "train", has="moved here")
    assert re.search(
        rf"is running on (sim-\d+)\[0,1,2,3,4,5,6,7\]: moved here: a GPU or node it ran on went out of service "
        rf"\({node_a} GPU 0: ",
        moved,
    ), moved
    node_c = re.search(r"is running on (sim-\d+)", moved).group(1)  # type: ignore[union-attr]

    # -- ten isolations on two nodes, then a held fault on a third ----------------------------------------
    node_b = next(n for n in NODES if n not in (node_a, node_c))
    for node, gpu in [(node_a, g) for g in range(1, 5)] + [(node_b, g) for g in range(5)]:
        await ok(url, "sim-fault", node, "ecc_dbe", "--gpu", str(gpu))
    fleet = await until(url, "fleet", has="4 nodes, 32 GPUs, 22 in service", within=45)
    for node in (node_a, node_b):  # 5 GPUs each isolated, the 3 others in service
        assert re.search(rf"^week/{node}  [A-Z_]+  3/8 GPUs in service", fleet, re.M), fleet
    await ok(url, "sim-fault", node_c, "ecc_dbe", "--gpu", "3")
    held = await until(url, "health", "held", has=node_c, within=30)
    assert "the isolation budget" in held and f"chamber health confirm {node_c} --gpu 3" in held, held
    explained = await until(url, "explain", "train", has="an isolation is held for")
    assert f"an isolation is held for {node_c} GPU 3 (" in explained
    assert re.search(rf"an isolation is held for {node_c} GPU 3 \([^\n]*; held: the isolation budget [^\n]*\): it "
                     r"runs on, and no new work is placed there", explained), explained  # fmt: skip

    # -- a team over its budget (1 USD at 3,600 USD per GPU-hour: past it within a second) ------------------
    over = await until(url, "explain", "train", has="over its budget", within=30)
    assert re.search(r"Note: team vision is over its budget \(\d+\.\d\d of 1\.00 USD spent in \d{4}-\d\d; "
                     r"--on-budget notify\)", over), over  # fmt: skip
    listed = await ok(url, "quota", "list")
    assert re.search(r"^vision\s+default\s+16\s+8\s+-\s+-\s+1\s+-\s+1/notify\s+8\s+0\s", listed, re.M), listed

    # -- prices and a pool that is not used any more --------------------------------------------------------
    prices = await ok(url, "billing", "price", "list")
    assert prices.splitlines()[:2] == ["PRICES     NAME       USD/GPU-HOUR", "GPU model  H100-80GB     3600.0000"]
    await ok(url, "quota", "pool", "set", "b200", "--gpu-model", "B200")
    refused = await arun(url, "quota", "pool", "delete", "default")
    assert refused.stderr.startswith("chamber quota pool delete: error: the default pool spans every node")
    assert (await ok(url, "quota", "pool", "delete", "b200")) == "pool b200: deleted\n"
