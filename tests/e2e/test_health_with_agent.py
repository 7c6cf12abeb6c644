"""The issue's acceptance path: faults injected into `chamber agent --simulate` (with `chamber sim-fault`)
lead to the right isolation, visible in `chamber fleet`, with the Kubernetes requests on the stub.

Runs once the node agent (issue 3) is in the tree; skipped before that.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import GpuIsolated, NodeIsolated
from tests.e2e.test_health_fleet import CLUSTER, logs_to_stderr, run_cli, running  # noqa: F401 (fixture)
from tests.integration.test_runtime import eventually
from tests.kube_stub import KubeStub, a_k8s_node
from tests.secured_bus import SecuredNatsServer

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.bus_cluster(CLUSTER),
    pytest.mark.skipif(importlib.util.find_spec("node_agent.sim") is None, reason="node agent not in this tree yet"),
]

SIM_NODES = [f"sim-{i:03d}" for i in range(4)]


def chamber(*argv: str) -> list[str]:
    # The same interpreter and sys.path as the test (not whatever `chamber` is first on PATH).
    return [sys.executable, "-c", "import sys; from services.cli import main; sys.exit(main())", *argv]


async def test_faults_injected_into_the_simulated_agent_isolate_the_right_targets(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    url = nats_server.url  # the operator's CLI
    argv = chamber(
        "agent", "--simulate", "--nodes", "4", "--nats", nats_server.url_for("simulator"), "--cluster", CLUSTER
    )
    log = (tmp_path / "agent.log").open("wb")
    agent = await asyncio.create_subprocess_exec(
        *argv, "--spool", str(tmp_path / "spool"), "--log-level", "warning", stdout=log, stderr=log
    )
    try:
        with KubeStub([a_k8s_node(n) for n in SIM_NODES]) as stub:
            async with running(nats_server, nc, stub) as fleet:

                async def four_healthy() -> bool:
                    code, out = await run_cli("fleet", "--json", "--nats", url)
                    nodes = json.loads(out)["nodes"] if code == 0 else []
                    return [n["status"] for n in nodes] == ["healthy"] * 4

                await eventually(four_healthy, within=30)

                async def inject(*argv: str) -> None:
                    proc = await asyncio.create_subprocess_exec(*chamber("sim-fault", *argv, "--nats", url))
                    assert await proc.wait() == 0

                await inject("sim-001", "xid", "--xid", "79")
                await eventually(lambda: [e.node for e in fleet.of(NodeIsolated)] == ["sim-001"], within=20)
                await inject("sim-002", "ecc_dbe", "--gpu", "5")
                await eventually(lambda: len(fleet.of(GpuIsolated)) == 1, within=20)
                [gpu] = fleet.of(GpuIsolated)
                assert (gpu.node, gpu.gpu_index) == ("sim-002", 5)
                assert [e.node for e in fleet.of(NodeIsolated)] == ["sim-001"]

                async def visible() -> bool:
                    nodes = {
                        n["node"]: n for n in json.loads((await run_cli("fleet", "--json", "--nats", url))[1])["nodes"]
                    }
                    return nodes["sim-001"]["status"] == "isolated" and nodes["sim-002"]["gpus"][5]["isolated"]

                await eventually(visible, within=15)
                await eventually(lambda: stub.nodes["sim-001"]["spec"]["unschedulable"] is True)
                assert stub.nodes["sim-001"]["spec"]["taints"][0]["value"] == "xid-79"
                await eventually(
                    lambda: bool(stub.nodes["sim-002"]["metadata"]["annotations"].get("chamber.io/isolated-gpus"))
                )
                assert stub.nodes["sim-002"]["spec"]["unschedulable"] is False
    finally:
        agent.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(agent.wait(), 15)
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
        log.close()
