"""End to end with a real nats-server: a simulated fleet reports, discovery and health run, faults are
injected; isolations reach FLEET, the Kubernetes stub, `chamber fleet` and `chamber health`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import GpuIsolated, NodeIsolated, NodeRestored, decode
from events.base import Event
from events.faults import FaultKind, Severity
from services.cli import main as cli
from services.discovery import service as discovery
from services.health import service as health
from services.health.kube import KubeActuator
from services.health.policy import load_policy
from services.runtime import Publisher
from services.runtime.host import ServiceContext, serve
from tests.health_builders import a_fault, a_sample, an_inventory
from tests.integration.test_runtime import eventually
from tests.kube_stub import KubeStub, a_k8s_node
from tests.secured_bus import SecuredNatsServer

NODES = [f"gpu-{i}" for i in range(4)]
CLUSTER = "local"
pytestmark = [pytest.mark.e2e, pytest.mark.bus_cluster(CLUSTER)]


def discovery_args(url: str, **kw: Any) -> argparse.Namespace:
    base = dict(
        nats=url,
        cluster=CLUSTER,
        kubeconfig=None,
        in_cluster=False,
        kube_poll=0.5,
        suspect_intervals=3,
        lost_after=60.0,
        tick=0.2,
        view_every=0.5,
    )
    return argparse.Namespace(**{**base, **kw})


def health_args(url: str) -> argparse.Namespace:
    return argparse.Namespace(nats=url, cluster=CLUSTER, policy=None, dry_run=False, tick=0.2)


class Fleet:
    """Services running in this process, and what they published on FLEET."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[Any]] = []
        self.fleet_events: list[Event] = []

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.fleet_events if isinstance(e, kind)]


@pytest.fixture(autouse=True)
def logs_to_stderr() -> None:
    from services.runtime.logs import configure_logging

    configure_logging("warning", json=False)  # the CLI's stdout (captured below) stays pure JSON


@contextlib.asynccontextmanager
async def running(server: SecuredNatsServer, nc: Client, stub: KubeStub, **discovery_kw: Any) -> AsyncIterator[Fleet]:
    """Health and discovery, each logged in as its own role."""
    fleet = Fleet()
    health_url, discovery_url = server.url_for("health"), server.url_for("discovery")

    async def on_fleet(msg: Any) -> None:
        fleet.fleet_events.append(decode(msg.headers, msg.data).event)

    sub = await nc.subscribe("chamber.fleet.>", cb=on_fleet)

    async def health_setup(ctx: ServiceContext) -> None:
        await health.setup(ctx, health_args(health_url), load_policy(), actuator=KubeActuator(stub.client()))

    async def discovery_setup(ctx: ServiceContext) -> None:
        await discovery.setup(ctx, discovery_args(discovery_url, **discovery_kw), kube_api=stub.client())

    fleet.tasks = [
        asyncio.create_task(serve("health", health_url, health_setup, fleet.stop)),
        asyncio.create_task(serve("discovery", discovery_url, discovery_setup, fleet.stop)),
    ]
    try:
        yield fleet
    finally:
        fleet.stop.set()
        await asyncio.wait_for(asyncio.gather(*fleet.tasks, return_exceptions=True), 15)
        await sub.unsubscribe()


@contextlib.asynccontextmanager
async def simulated_agents(agent: Publisher, nodes: list[str], every: float = 0.5) -> AsyncIterator[None]:
    """Agents that keep sampling (interval 1 s) so the nodes stay healthy however slow the machine is."""

    async def loop() -> None:
        seq = 0
        while True:
            seq += 1
            for node in nodes:
                await agent.publish(a_sample(node, cluster=CLUSTER, at=time.time(), seq=seq, util=75.0))
            await asyncio.sleep(every)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()

    def call() -> int:
        with contextlib.redirect_stdout(out):
            return cli(list(argv))

    code = await asyncio.to_thread(call)
    return code, out.getvalue()


async def fleet_json(url: str) -> dict[str, Any]:
    code, out = await run_cli("fleet", "--json", "--nats", url)
    assert code == 0
    return json.loads(out)  # type: ignore[no-any-return]


async def test_injected_faults_isolate_the_right_node_and_gpu_end_to_end(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    url = nats_server.url
    agent = Publisher(js, source="chamber/agent-sim")
    with KubeStub([a_k8s_node(n) for n in [*NODES, "cpu-only"]]) as stub:
        async with running(nats_server, nc, stub) as fleet, simulated_agents(agent, NODES):
            now = time.time()
            for node in NODES:
                await agent.publish(an_inventory(node, cluster=CLUSTER, at=now))

            async def fleet_seen() -> bool:
                code, out = await run_cli("fleet", "--json", "--nats", url)
                if code != 0:
                    return False  # discovery has not created its bucket yet
                view = json.loads(out)["nodes"]
                return len(view) == 5 and sum(1 for n in view if n["status"] == "healthy") == 4

            await eventually(fleet_seen, within=20)
            no_agent = next(n for n in (await fleet_json(url))["nodes"] if n["node"] == "cpu-only")
            assert no_agent["status"] == "suspect" and no_agent["agent"] is False

            # XID 79 on gpu-1: the whole node goes.
            xid79 = a_fault("gpu-1", xid=79, gpu=2, at=time.time(), cluster=CLUSTER, fault_id="xid79-gpu-1")
            await agent.publish(xid79)
            await eventually(lambda: len(fleet.of(NodeIsolated)) == 1)
            [isolated] = fleet.of(NodeIsolated)
            assert isolated.node == "gpu-1" and isolated.fault_ids == ["xid79-gpu-1"]
            await eventually(lambda: stub.nodes["gpu-1"]["spec"]["unschedulable"] is True)
            assert stub.nodes["gpu-1"]["spec"]["taints"] == [
                {"key": "chamber.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}
            ]

            # A DBE on GPU 3 of gpu-2: only that GPU goes.
            dbe = a_fault("gpu-2", kind=FaultKind.ECC_DBE, gpu=3, at=time.time(), cluster=CLUSTER, fault_id="dbe")
            await agent.publish(dbe)
            await eventually(lambda: len(fleet.of(GpuIsolated)) == 1)
            [gpu_isolated] = fleet.of(GpuIsolated)
            assert (gpu_isolated.node, gpu_isolated.gpu_index, gpu_isolated.gpu_uuid) == ("gpu-2", 3, "GPU-gpu-2-03")
            assert len(fleet.of(NodeIsolated)) == 1
            await eventually(
                lambda: stub.nodes["gpu-2"]["metadata"]["annotations"].get("chamber.io/isolated-gpus") == "GPU-gpu-2-03"
            )
            assert stub.nodes["gpu-2"]["spec"]["unschedulable"] is False

            # An application XID is recorded only.
            await agent.publish(
                a_fault("gpu-3", xid=13, gpu=0, at=time.time(), cluster=CLUSTER, severity=Severity.WARNING)
            )

            async def shown() -> bool:
                nodes = {n["node"]: n for n in (await fleet_json(url))["nodes"]}
                return nodes["gpu-1"]["status"] == "isolated" and nodes["gpu-2"]["gpus"][3]["isolated"]

            await eventually(shown, within=10)
            nodes = {n["node"]: n for n in (await fleet_json(url))["nodes"]}
            assert nodes["gpu-1"]["reason"].startswith("xid-79: GPU has fallen off the bus")
            gpu3 = nodes["gpu-2"]["gpus"][3]
            assert gpu3 == {
                "index": 3,
                "uuid": "GPU-gpu-2-03",
                "model": "H100-80GB",
                "vendor": "nvidia",
                "util": 75.0,
                "isolated": True,
                "reason": gpu3["reason"],
            }
            assert gpu3["reason"].startswith("ecc_dbe:")
            assert nodes["gpu-2"]["status"] == "healthy" and not nodes["gpu-2"]["gpus"][0]["isolated"]
            assert nodes["gpu-3"]["status"] == "healthy"
            code, table = await run_cli("fleet", "--nats", url)
            assert code == 0 and "local/gpu-1  ISOLATED  0/8 GPUs in service  xid-79" in table

            # The operator restores gpu-1: uncordoned (Chamber cordoned it), taint and condition undone.
            code, out = await run_cli("health", "restore", "gpu-1", "--nats", url, "--cluster", CLUSTER)
            assert code == 0 and out.startswith("restore_node: gpu-1")
            await eventually(lambda: len(fleet.of(NodeRestored)) == 1)
            assert fleet.of(NodeRestored)[0].by == "operator"
            await eventually(lambda: stub.nodes["gpu-1"]["spec"] == {"unschedulable": False, "taints": []})
            code, out = await run_cli("health", "restore", "gpu-1", "--nats", url, "--cluster", CLUSTER)
            assert code == 2

            # The running service answers with its effective policy.
            code, out = await run_cli("health", "policy", "--json", "--nats", url)
            assert code == 0 and json.loads(out)["xid"]["48"]["action"] == "isolate_gpu"


async def test_a_silent_node_becomes_suspect_then_lost(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    from events import NodeLost, NodeUpdated
    from events.fleet import NodeStatus

    agent = Publisher(js, source="chamber/agent-sim")
    with KubeStub([]) as stub:
        async with running(nats_server, nc, stub, lost_after=2.0) as fleet:
            now = time.time()
            await agent.publish(an_inventory("quiet", cluster=CLUSTER, at=now))
            await agent.publish(a_sample("quiet", cluster=CLUSTER, at=now, interval_s=0.2))
            await eventually(lambda: len(fleet.of(NodeLost)) == 1, within=15)
            statuses = [e.status for e in fleet.of(NodeUpdated)]
            assert statuses == [NodeStatus.SUSPECT]
            [lost] = fleet.of(NodeLost)
            assert lost.last_seen_at == now and lost.at == now + 2.0


async def test_a_restarted_health_service_rebuilds_its_isolations_and_re_emits_nothing(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    agent = Publisher(js, source="chamber/agent-sim")
    with KubeStub([a_k8s_node(n) for n in NODES]) as stub:
        async with running(nats_server, nc, stub) as first:
            # gpu-1's inventory never arrives: only its fault and the decision name the GPU's UUID, and
            # the restart below may replay the decision (FLEET) before the fault (FAULTS).
            for node in NODES:
                if node != "gpu-1":
                    await agent.publish(an_inventory(node, cluster=CLUSTER, at=time.time()))
            await agent.publish(a_fault("gpu-0", xid=79, at=time.time(), cluster=CLUSTER, fault_id="a"))
            await agent.publish(a_fault("gpu-1", kind=FaultKind.ECC_DBE, gpu=5, at=time.time(), cluster=CLUSTER))
            await eventually(lambda: len(first.of(NodeIsolated)) == 1 and len(first.of(GpuIsolated)) == 1, within=30)
            await eventually(lambda: len(stub.writes()) == 3)  # cordon+taint, condition, GPU annotation
        writes_before = len(stub.writes())
        stub.nodes["gpu-0"]["spec"]["taints"] = []  # someone removed our taint while health was down

        health_url = nats_server.url_for("health")
        shells: list[health.HealthShell] = []
        stop = asyncio.Event()
        seen: list[Event] = []

        async def on_fleet(msg: Any) -> None:
            seen.append(decode(msg.headers, msg.data).event)

        sub = await nc.subscribe("chamber.fleet.>", cb=on_fleet)

        async def setup(ctx: ServiceContext) -> None:
            shells.append(
                await health.setup(ctx, health_args(health_url), load_policy(), actuator=KubeActuator(stub.client()))
            )

        task = asyncio.create_task(serve("health", health_url, setup, stop))
        await eventually(lambda: bool(shells) and shells[0].ready)  # the reconcile is under way
        shell = shells[0]
        state = shell.state
        assert state.nodes[(CLUSTER, "gpu-0")].isolated is not None
        assert list(state.nodes[(CLUSTER, "gpu-1")].gpu_isolated) == [5]
        # Whichever of FAULTS and FLEET was replayed first, the isolated GPU is known by its UUID.
        assert state.nodes[(CLUSTER, "gpu-1")].gpus.get(5) == "GPU-gpu-1-05"
        for _ in range(3):  # decision passes over the rebuilt state (what the ticks do), then drain
            await shell.tick(time.time())
        await eventually(lambda: not shell.actuations)
        stop.set()
        await asyncio.wait_for(task, 15)
        await sub.unsubscribe()
        assert seen == []  # nothing decided twice
        after = stub.writes()[writes_before:]
        assert len(after) == 1, after  # only what drifted is patched back
        reconciled = after[0]
        assert reconciled.path == "/api/v1/nodes/gpu-0"
        assert reconciled.body["spec"] == {
            "taints": [{"key": "chamber.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}]
        }
        assert stub.nodes["gpu-1"]["metadata"]["annotations"]["chamber.io/isolated-gpus"] == "GPU-gpu-1-05"


async def test_a_fault_storm_is_held_until_an_operator_confirms_or_dismisses(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    from events.fleet import IsolationDismissed, IsolationHeld

    url = nats_server.url
    agent = Publisher(js, source="chamber/agent-sim")
    with KubeStub([a_k8s_node(n) for n in NODES]) as stub:
        async with running(nats_server, nc, stub) as fleet:
            for node in NODES:
                await agent.publish(an_inventory(node, cluster=CLUSTER, at=time.time()))
            for node in NODES:  # four nodes at once; the budget allows two (min_nodes) per hour
                await agent.publish(a_fault(node, xid=79, at=time.time(), cluster=CLUSTER, fault_id=f"storm-{node}"))
            await eventually(lambda: len(fleet.of(NodeIsolated)) == 2 and len(fleet.of(IsolationHeld)) == 2)
            held_nodes = sorted(e.node for e in fleet.of(IsolationHeld))
            code, out = await run_cli("health", "held", "--json", "--nats", url)
            assert code == 0 and sorted(h["node"] for h in json.loads(out)["held"]) == held_nodes
            code, out = await run_cli("health", "confirm", held_nodes[0], "--nats", url, "--cluster", CLUSTER)
            assert code == 0 and out.startswith(f"isolate_node: {held_nodes[0]}")
            code, out = await run_cli("health", "dismiss", held_nodes[1], "--nats", url, "--cluster", CLUSTER)
            assert code == 0 and out.startswith(f"dismiss: {held_nodes[1]}")
            await eventually(lambda: len(fleet.of(NodeIsolated)) == 3 and len(fleet.of(IsolationDismissed)) == 1)
            await eventually(lambda: stub.nodes[held_nodes[0]]["spec"]["unschedulable"] is True)
            assert stub.nodes[held_nodes[1]]["spec"]["unschedulable"] is False
            code, out = await run_cli("health", "held", "--nats", url)
            assert code == 0 and out.strip() == "nothing held"


async def test_a_gpu_isolated_before_its_uuid_is_known_is_annotated_by_uuid_once_the_inventory_names_it(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    from msgspec.structs import replace

    agent = Publisher(js, source="chamber/agent-sim")
    with KubeStub([a_k8s_node(n) for n in NODES]) as stub:

        def annotation() -> str | None:
            return stub.nodes["gpu-2"]["metadata"].get("annotations", {}).get("chamber.io/isolated-gpus")

        async with running(nats_server, nc, stub) as fleet:
            # A detector that names only the index, before the node's inventory reached discovery.
            fault = replace(
                a_fault("gpu-2", kind=FaultKind.ECC_DBE, gpu=3, at=time.time(), cluster=CLUSTER), gpu_uuid=None
            )
            await agent.publish(fault)
            await eventually(lambda: len(fleet.of(GpuIsolated)) == 1)
            await eventually(lambda: annotation() == "index-3")
            await agent.publish(an_inventory("gpu-2", cluster=CLUSTER, at=time.time()))
            await eventually(lambda: annotation() == "GPU-gpu-2-03")  # what a device plugin matches
            assert stub.nodes["gpu-2"]["metadata"]["labels"]["chamber.io/isolated-gpu-count"] == "1"
            assert len(fleet.of(GpuIsolated)) == 1  # the annotation is rewritten; nothing is decided again


async def test_health_rebuilds_the_same_state_from_the_log_alone_as_from_its_snapshot(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    """Every decision is an event: a start with no snapshot folds FAULTS and FLEET back to the state a
    snapshot holds, recorded faults and extended probations included, and decides nothing again."""
    from events.fleet import FaultRecorded, IsolationExtended
    from services.runtime.manifest import snapshot_bucket
    from services.runtime.snapshots import SnapshotStore
    from tests.conformance.harness import canon

    agent = Publisher(js, source="chamber/agent-sim")
    with KubeStub([a_k8s_node(n) for n in NODES]) as stub:
        async with running(nats_server, nc, stub) as fleet:
            for node in NODES:
                await agent.publish(an_inventory(node, cluster=CLUSTER, at=time.time()))
            await agent.publish(a_fault("gpu-0", xid=79, at=time.time(), cluster=CLUSTER))
            await agent.publish(a_fault("gpu-1", kind=FaultKind.ECC_DBE, gpu=5, at=time.time(), cluster=CLUSTER))
            await agent.publish(a_fault("gpu-2", xid=13, severity=Severity.WARNING, at=time.time(), cluster=CLUSTER))
            await eventually(lambda: len(fleet.of(GpuIsolated)) == 1 and len(fleet.of(FaultRecorded)) == 1)
            await agent.publish(a_fault("gpu-1", kind=FaultKind.ECC_DBE, gpu=5, at=time.time(), cluster=CLUSTER))
            await eventually(lambda: len(fleet.of(IsolationExtended)) == 1 and len(fleet.of(NodeIsolated)) == 1)

        seen: list[Event] = []

        async def on_fleet(msg: Any) -> None:
            seen.append(decode(msg.headers, msg.data).event)

        sub = await nc.subscribe("chamber.fleet.>", cb=on_fleet)
        rebuilt = []
        health_url = nats_server.url_for("health")
        for from_snapshot in (True, False):
            if not from_snapshot:
                store = await js.object_store(snapshot_bucket("health"))
                await store.delete("health")
                assert await SnapshotStore(js).load("health") is None
            shells: list[health.HealthShell] = []
            stop = asyncio.Event()

            async def setup(ctx: ServiceContext, shells: list[health.HealthShell] = shells) -> None:
                shells.append(
                    await health.setup(
                        ctx,
                        health_args(health_url),
                        load_policy(),
                        actuator=KubeActuator(stub.client()),
                    )
                )

            task = asyncio.create_task(serve("health", health_url, setup, stop))
            await eventually(lambda shells=shells: bool(shells) and shells[0].ready)  # type: ignore[misc]
            shell = shells[0]
            for _ in range(3):
                await shell.tick(time.time())
            assert shell.host is not None
            assert shell.host.stats.decisions == 0 and not shell.state.pending  # counts de-duplicated ones too
            rebuilt.append((canon(shell.state), bool(shell.host.stats.restored_from)))
            stop.set()
            await asyncio.wait_for(task, 15)
        await sub.unsubscribe()
    (from_snapshot_state, used_snapshot), (from_log_state, used_none) = rebuilt
    assert used_snapshot and not used_none
    assert from_log_state == from_snapshot_state
    assert seen == []  # nothing decided again on either start
