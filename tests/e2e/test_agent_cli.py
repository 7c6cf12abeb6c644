"""`chamber agent` and `chamber sim-fault` as an operator runs them."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from events import GpuFaultDetected, decode
from services.runtime import connect
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHAMBER, *args], capture_output=True, text=True, timeout=60)


def test_sim_fault_mistakes_are_one_line_usage_errors() -> None:
    no_xid = run("sim-fault", "sim-000", "xid", "--nats", "nats://127.0.0.1:1")
    assert no_xid.returncode == 2 and "--xid N" in no_xid.stderr and "Traceback" not in no_xid.stderr
    bad_kind = run("sim-fault", "sim-000", "melt")
    assert bad_kind.returncode == 2 and "ecc_dbe" in bad_kind.stderr


def test_agent_mistakes_are_one_line_usage_errors() -> None:
    model = run("agent", "--simulate", "--gpu-model", "Z9000")
    assert model.returncode == 2 and "H100-80GB" in model.stderr and "Traceback" not in model.stderr
    real = run("agent", "--nats", "nats://127.0.0.1:1")
    if real.returncode == 0:
        pytest.skip("this machine has an NVIDIA driver")
    assert real.returncode == 2 and "no NVIDIA driver" in real.stderr and "--simulate" in real.stderr


@pytest.mark.bus_cluster("ops")
async def test_sim_fault_reaches_a_running_simulated_fleet(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    # `js`: the streams exist (the services made them); the simulator may not create them
    agent = subprocess.Popen(  # noqa: ASYNC220 (returns at once)
        [CHAMBER, "agent", "--simulate", "--nodes", "2", "--interval", "0.2", "--cluster", "ops",
         "--nats", nats_server.url_for("simulator"), "--spool", str(tmp_path), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:  # until the fleet answers its commands
            result = await asyncio.to_thread(
                run, "sim-fault", "sim-001", "thermal", "--gpu", "2", "--json", "--nats", nats_server.url
            )
            if result.returncode == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == {"node": "sim-001", "kind": "thermal", "gpu": 2, "xid": None}
        missing = await asyncio.to_thread(run, "sim-fault", "sim-009", "thermal", "--nats", nats_server.url)
        assert missing.returncode == 2 and "no simulated node 'sim-009'" in missing.stderr

        nc = await connect(nats_server.url, name="check")
        try:
            sub = await nc.jetstream().pull_subscribe("chamber.faults.ops.sim-001", durable=None)
            msgs = await sub.fetch(1, timeout=10)
            fault = decode(msgs[0].headers, msgs[0].data).event
        finally:
            await nc.close()
        assert isinstance(fault, GpuFaultDetected) and (fault.kind.value, fault.gpu_index) == ("thermal", 2)
    finally:
        agent.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(agent.wait, 30) == 0
    assert agent.stderr is not None and "Traceback" not in agent.stderr.read()
