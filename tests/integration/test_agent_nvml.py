"""`chamber agent` in NVML mode (driven by the pynvml fake) against a real nats-server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from events import GpuFaultDetected, NodeInventory, NodeSample
from node_agent.agent import Agent, AgentOptions
from tests.integration.test_agent_fleet import read_stream
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer
from tests.unit.fake_pynvml import FakeNvml

pytestmark = pytest.mark.integration


async def test_a_gpu_node_publishes_inventory_samples_and_xid_faults(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    fake = FakeNvml(gpus=8)
    opts = AgentOptions(
        nats=nats_server.url_for("agent"), cluster="c1", node="gpu-node-1", interval_s=0.1, spool_dir=tmp_path
    )
    agent = Agent(opts, nvml=fake)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await eventually(lambda: agent.outbox.published >= 5)
        fake.push_xid(3, 48)

        async def fault_arrived() -> bool:
            return bool(await read_stream(js, "chamber.faults.c1.gpu-node-1"))

        await eventually(fault_arrived)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    inventory = [
        e
        for e in await read_stream(js, "chamber.telemetry.inventory.c1.gpu-node-1", expect=1)
        if isinstance(e, NodeInventory)
    ]
    samples = [
        e
        for e in await read_stream(js, "chamber.telemetry.sample.c1.gpu-node-1", expect=1)
        if isinstance(e, NodeSample)
    ]
    faults = [e for e in await read_stream(js, "chamber.faults.c1.gpu-node-1") if isinstance(e, GpuFaultDetected)]
    assert len(inventory) == 1 and inventory[0].driver_version == "550.90.07" and not inventory[0].simulated
    assert [s.seq for s in samples] == list(range(len(samples))) and samples[0].gpus[0].power_w == 612.5
    assert [(f.kind.value, f.severity.value, f.gpu_index, f.xid) for f in faults] == [("xid", "critical", 3, 48)]
    assert "GPU_ECC_DBE" in faults[0].detail and "Xid Catalog" in faults[0].detail
    assert "nvmlShutdown" in fake.calls
