"""A mixed fleet end to end: `chamber agent --simulate --amd-nodes 2`, AMD faults injected with
`chamber sim-fault`, and the isolations the AMD rules call for, visible in `chamber fleet` with the vendor."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import GpuIsolated, NodeIsolated
from tests.e2e.test_health_fleet import CLUSTER, logs_to_stderr, run_cli, running  # noqa: F401 (fixture)
from tests.e2e.test_health_with_agent import SIM_NODES, chamber
from tests.integration.test_runtime import eventually
from tests.kube_stub import KubeStub, a_k8s_node
from tests.secured_bus import SecuredNatsServer

pytestmark = [pytest.mark.e2e, pytest.mark.bus_cluster(CLUSTER)]


async def test_amd_faults_in_a_mixed_simulated_fleet_isolate_the_right_targets(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    url = nats_server.url
    sim_url = nats_server.url_for("simulator")
    argv = chamber("agent", "--simulate", "--nodes", "4", "--amd-nodes", "2", "--nats", sim_url, "--cluster", CLUSTER)
    log = (tmp_path / "agent.log").open("wb")
    agent = await asyncio.create_subprocess_exec(
        *argv, "--spool", str(tmp_path / "spool"), "--log-level", "warning", stdout=log, stderr=log
    )
    try:
        with KubeStub([a_k8s_node(n) for n in SIM_NODES]) as stub:
            async with running(nats_server, nc, stub) as fleet:

                async def nodes() -> dict[str, dict]:  # type: ignore[type-arg]
                    code, out = await run_cli("fleet", "--json", "--nats", url)
                    return {n["node"]: n for n in json.loads(out)["nodes"]} if code == 0 else {}

                async def four_healthy() -> bool:
                    return [n["status"] for n in (await nodes()).values()] == ["healthy"] * 4

                await eventually(four_healthy, within=30)
                vendors = {name: {g["vendor"] for g in n["gpus"]} for name, n in (await nodes()).items()}
                assert vendors == {"sim-000": {"nvidia"}, "sim-001": {"nvidia"}, "sim-002": {"amd"}, "sim-003": {"amd"}}

                async def inject(*argv: str) -> None:
                    proc = await asyncio.create_subprocess_exec(*chamber("sim-fault", *argv, "--nats", url))
                    assert await proc.wait() == 0

                await inject("sim-003", "amd_umc_ue", "--gpu", "2")
                await eventually(lambda: len(fleet.of(GpuIsolated)) == 1, within=20)
                [gpu] = fleet.of(GpuIsolated)
                assert (gpu.node, gpu.gpu_index) == ("sim-003", 2) and gpu.reason.startswith("amd_ras-umc: ")
                await inject("sim-002", "xgmi_down", "--gpu", "0")
                await eventually(lambda: [e.node for e in fleet.of(NodeIsolated)] == ["sim-002"], within=20)
                [node] = fleet.of(NodeIsolated)
                assert node.reason.startswith("xgmi: ")

                async def visible() -> bool:
                    n = await nodes()
                    return n["sim-002"]["status"] == "isolated" and n["sim-003"]["gpus"][2]["isolated"]

                await eventually(visible, within=15)
                await eventually(lambda: stub.nodes["sim-002"]["spec"]["unschedulable"] is True)
                code, out = await run_cli("fleet", "--nats", url)
                assert code == 0 and "AMD MI300X-192GB" in out
    finally:
        agent.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(agent.wait(), 15)
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
        log.close()
