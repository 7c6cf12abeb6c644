"""The node agent serves the runtime probes (/livez, /readyz) that the chart's DaemonSet calls: live
whenever its loop answers, NATS or not (it spools meanwhile), ready only while NATS is connected."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from node_agent.agent import Agent, AgentOptions
from services.cli import agent as agent_cli
from services.cli.errors import UsageError
from tests.integration.test_deploy_health import http_get
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration


async def test_the_agent_is_live_while_nats_is_away_and_ready_once_connected(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    # `js`: the services made the streams earlier; the simulator may not create them
    nats_server.stop()  # the agent comes up before NATS does
    opts = AgentOptions(
        nats=nats_server.url_for("simulator"), cluster="c1", node="sim", interval_s=0.1, spool_dir=tmp_path / "spool",
        simulate=True, nodes=1, gpus_per_node=2, health_port=0,
    )  # fmt: skip
    agent = Agent(opts)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await eventually(lambda: agent.health is not None and agent.health.port != 0)
        assert agent.health is not None
        port = agent.health.port
        status, body = await http_get(port, "/livez")
        assert status == 200 and body["service"] == "agent" and body["nats"] == "disconnected"
        assert (await http_get(port, "/readyz"))[0] == 503

        nats_server.start()

        async def ready() -> bool:
            status, body = await http_get(port, "/readyz")
            return status == 200 and body["replaying"] is None

        await eventually(ready, within=20)  # the simulated executor has folded JOBS too

        nats_server.stop()

        async def unready() -> bool:
            return (await http_get(port, "/readyz"))[0] == 503

        await eventually(unready)
        assert (await http_get(port, "/livez"))[0] == 200  # a NATS outage must not restart the agent
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    with pytest.raises(OSError):
        await http_get(port, "/livez")  # the probe server goes with the agent


def test_the_health_port_comes_from_the_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    agent_cli.register(parser.add_subparsers())

    def port(*argv: str) -> int | None:
        return agent_cli.options(parser.parse_args(["agent", "--simulate", *argv])).health_port

    monkeypatch.delenv("CHAMBER_HEALTH_PORT", raising=False)
    assert port() is None
    monkeypatch.setenv("CHAMBER_HEALTH_PORT", "8081")  # what the chart sets
    assert port() == 8081
    assert port("--health-port", "9000") == 9000
    with pytest.raises(UsageError, match="--health-port"):
        port("--health-port", "70000")
    monkeypatch.setenv("CHAMBER_HEALTH_PORT", "http")
    with pytest.raises(UsageError, match="CHAMBER_HEALTH_PORT"):
        port()
