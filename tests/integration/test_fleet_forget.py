"""`chamber fleet forget NODE` end to end under the deployed permissions: discovery, health and the
gateway run as their own roles, the CLI as admin; a lost node is forgotten (NodeForgotten on FLEET)
and leaves `chamber fleet` and the gateway's fleet view; a healthy or unknown node is refused in one
line, with no traceback."""

from __future__ import annotations

import asyncio
import contextlib
import io
import time

import aiohttp
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import NodeForgotten, NodeLost
from services.runtime import Publisher
from tests.e2e.test_health_fleet import CLUSTER, fleet_json, run_cli, running, simulated_agents
from tests.health_builders import a_sample, an_inventory
from tests.integration.test_gateway_api import Gateway, _up, start_gateway
from tests.integration.test_runtime import eventually
from tests.kube_stub import KubeStub
from tests.secured_bus import SecuredNatsServer

pytestmark = [pytest.mark.integration, pytest.mark.bus_cluster(CLUSTER)]


async def test_a_lost_node_is_forgotten_by_the_command_and_leaves_every_view(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    url = nats_server.url  # admin: the operator's CLI
    agent = Publisher(js, source="chamber/agent-sim")
    stop, task, gateway_url = await start_gateway(nats_server.url_for("gateway"))
    with KubeStub([]) as stub:
        async with (
            # the live agent reports every 0.3 s: 4 s of silence is lost even on two busy cores
            running(nats_server, nc, stub, lost_after=4.0) as fleet,
            simulated_agents(agent, ["alive"], every=0.3),
            aiohttp.ClientSession() as http,
        ):
            gw = Gateway(gateway_url, http)
            now = time.time()
            await agent.publish(an_inventory("alive", cluster=CLUSTER, at=now))
            await agent.publish(an_inventory("gone", cluster=CLUSTER, at=now))
            await agent.publish(a_sample("gone", cluster=CLUSTER, at=now, interval_s=0.2))
            await eventually(lambda: [e.node for e in fleet.of(NodeLost)] == ["gone"], within=20)

            async def shown(node: str, status: str) -> bool:
                code, _ = await run_cli("fleet", "--json", "--nats", url)
                if code != 0 or not await _up(gw):
                    return False
                listed = {n["node"]: n["status"] for n in (await fleet_json(url))["nodes"]}
                _, view = await gw.get("/api/fleet")
                return listed.get(node) == status and node in {n["node"] for n in view["nodes"]}

            await eventually(lambda: shown("gone", "lost"), within=20)
            await eventually(lambda: shown("alive", "healthy"), within=20)

            # refused: a healthy node, and one that does not exist (one line on stderr, exit status 2)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code, _ = await run_cli("fleet", "forget", "alive", "--cluster", CLUSTER, "--nats", url)
                missing, _ = await run_cli("fleet", "forget", "nowhere", "--cluster", CLUSTER, "--nats", url)
            lines = err.getvalue().strip().splitlines()
            assert (code, missing) == (2, 2), err.getvalue()
            assert "node alive is HEALTHY: only a lost node can be forgotten" in lines[0]
            assert "no node nowhere" in lines[1] and "Traceback" not in err.getvalue()

            code, out = await run_cli("fleet", "forget", "gone", "--cluster", CLUSTER, "--nats", url)
            assert code == 0 and f"forgot {CLUSTER}/gone" in out
            await eventually(lambda: len(fleet.of(NodeForgotten)) == 1)
            [forgotten] = fleet.of(NodeForgotten)
            assert forgotten.node == "gone" and forgotten.by != "discovery"

            async def gone_everywhere() -> bool:
                listed = {n["node"] for n in (await fleet_json(url))["nodes"]}
                _, view = await gw.get("/api/fleet")
                return listed == {"alive"} and {n["node"] for n in view["nodes"]} == {"alive"}

            await eventually(gone_everywhere, within=20)
            status, _ = await gw.get(f"/api/nodes/{CLUSTER}/gone")
            assert status == 404

            # forgotten already: a second forget is refused, nothing else is published
            with contextlib.redirect_stderr(io.StringIO()):
                again, _ = await run_cli("fleet", "forget", "gone", "--cluster", CLUSTER, "--nats", url)
            assert again == 2

            # its agent reports again: a new node, discovered anew
            await agent.publish(a_sample("gone", cluster=CLUSTER, at=time.time(), interval_s=0.2))
            await eventually(lambda: _listed(url, "gone"), within=20)
            assert len(fleet.of(NodeForgotten)) == 1

            # silent again: lost again, and `forget-lost` forgets every lost node (here that one)
            await eventually(lambda: shown("gone", "lost"), within=20)
            code, out = await run_cli("fleet", "forget-lost", "--nats", url)
            assert code == 0 and out.splitlines() == [f"forgot {CLUSTER}/gone", "1 forgotten, 0 kept"], out
            await eventually(lambda: len(fleet.of(NodeForgotten)) == 2)
            await eventually(gone_everywhere, within=20)
            code, out = await run_cli("fleet", "forget-lost", "--nats", url)
            assert (code, out.strip()) == (0, "no lost nodes")
    stop.set()
    await asyncio.wait_for(task, 15)


async def _listed(url: str, node: str) -> bool:
    return node in {n["node"] for n in (await fleet_json(url))["nodes"]}


async def test_a_restarted_discovery_deletes_the_view_of_nodes_forgotten_while_it_was_away(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    url = nats_server.url
    agent = Publisher(js, source="chamber/agent-sim")
    with KubeStub([]) as stub:
        async with running(nats_server, nc, stub), simulated_agents(agent, ["alive"], every=0.3):
            await agent.publish(an_inventory("alive", cluster=CLUSTER, at=time.time()))
            await eventually(lambda: _listed(url, "alive"), within=20)
        # a view no node of the log stands for (forgotten while no discovery ran)
        kv = await js.key_value("chamber_fleet")
        await kv.put(f"{CLUSTER}.ghost", b'{"cluster": "local", "node": "ghost", "status": "lost", "gpus": []}')
        assert await _listed(url, "ghost")
        async with running(nats_server, nc, stub), simulated_agents(agent, ["alive"], every=0.3):

            async def ghost_gone() -> bool:
                return not await _listed(url, "ghost") and await _listed(url, "alive")

            await eventually(ghost_gone, within=20)


async def test_chamber_fleet_skips_a_node_forgotten_between_listing_and_reading(
    nats_server: SecuredNatsServer, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI lists the fleet view's keys (its stream's subjects), then reads each: a node forgotten
    in between (its entry deleted) is left out, not a traceback (a forget while someone runs
    `chamber fleet`)."""
    import json

    from nats.js.manager import JetStreamManager

    from services.discovery.service import BUCKET
    from services.runtime.buckets import open_kv

    kv = await open_kv(js, BUCKET, history=1, description="current fleet view (discovery)")
    for node in ("race-a", "race-b"):
        view = {"cluster": "race", "node": node, "status": "lost", "reason": "", "gpus": []}
        await kv.put(f"race.{node}", json.dumps(view).encode())
    listed = JetStreamManager.stream_info

    async def list_then_forget(self: JetStreamManager, name: str, subjects_filter: str | None = None) -> object:
        info = await listed(self, name, subjects_filter)
        if subjects_filter:  # the listing of the keys
            await kv.delete("race.race-b")  # forgotten right after it
        return info

    monkeypatch.setattr(JetStreamManager, "stream_info", list_then_forget)
    code, out = await run_cli("fleet", "--cluster", "race", "--json", "--nats", nats_server.url)
    assert code == 0 and [n["node"] for n in json.loads(out)["nodes"]] == ["race-a"]
    await kv.delete("race.race-a")
