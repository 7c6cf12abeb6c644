"""Multi-cluster dispatch, wired live: two Kubernetes API-server stubs (tests/kube_stub.py, the real
`kubernetes` client), one bus under the generated permissions (svc-dispatch, actuator-a, actuator-b),
the dispatcher and both clusters' actuators as `chamber service dispatch` runs them.

A workload created in cluster a with `chamber.io/clusters` gets exactly one copy, in the cluster the
dispatcher prefers (b, cheaper), none in a; the origin stays suspended and shows the copy's phase;
when b stops answering its workload is dispatched to a; when b comes back, its fenced copy is deleted
before anything else is written there; completion deletes the copy and the origin says complete. A
workload whose annotation names no cluster gets one Kubernetes Event saying so. A cluster whose
actuator is cut off from the bus (the cluster itself still running) deletes its copy before the
workload's next copy is created elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from events import GpuInfo, JobCompleted, NodeDiscovered, NodeInventory, TeamQuotaSet, subjects
from events.codec import decode_event, encode
from events.subjects import subject_for
from services.cli.common import add_nats_option
from services.dispatch import service
from services.dispatch.actuator import GENERATION_LABEL, STATUS_ANNOTATION, WORKLOAD_LABEL
from services.runtime import Publisher, connect
from tests.integration.test_runtime import eventually
from tests.kube_stub import KubeStub, a_k8s_node
from tests.kube_workloads import a_batch_job
from tests.scheduler_builders import a_node, a_quota
from tests.secured_bus import SecuredNatsServer, connect_as

pytestmark = pytest.mark.integration

LOST_AFTER_S = 2.0
ROUND_S = 0.2
JOBS = "/apis/batch/v1/namespaces/ml/jobs"


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[SecuredNatsServer]:
    server = SecuredNatsServer(tmp_path, actuator_clusters=("a", "b"))
    server.start()
    try:
        yield server
    finally:
        server.kill()
    assert server.violations() == [], "the bus refused a permission (services/cli/nats_config.py)"


def args(url: str, cluster: str = "", *, kubeconfig: Path | None = None, price: float = 0.0) -> argparse.Namespace:
    """The flags as docs/multicluster.md gives them to `chamber service dispatch`, parsed by its parser."""
    parser = argparse.ArgumentParser()
    add_nats_option(parser)
    service.add_arguments(parser)
    argv = ["--nats", url, "--lost-after", str(LOST_AFTER_S), "--interval", str(ROUND_S)]
    if cluster:
        argv += ["--actuator", "--cluster", cluster, "--kubeconfig", str(kubeconfig), "--price", str(price)]
    return parser.parse_args(argv)


class Running:
    """`chamber service dispatch` processes, in this event loop."""

    def __init__(self) -> None:
        self.stops: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, a: argparse.Namespace) -> None:
        self.stops[name] = asyncio.Event()
        self.tasks[name] = asyncio.create_task(service.run(a, self.stops[name]))

    async def stop(self, name: str) -> None:
        self.stops[name].set()
        await asyncio.wait_for(self.tasks.pop(name), 10)

    async def stop_all(self) -> None:
        for name in list(self.tasks):
            await self.stop(name)


async def until(what: Callable[[], Any], within: float = 8.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if value := what():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {within} s: {what.__doc__ or what}")


def copies(stub: KubeStub) -> list[dict[str, Any]]:
    return [o for o in stub.objects.values() if WORKLOAD_LABEL in (o["metadata"].get("labels") or {})]


def status(stub: KubeStub) -> dict[str, Any]:
    raw = (stub.get("batch/v1", "Job", "ml", "train")["metadata"].get("annotations") or {}).get(STATUS_ANNOTATION)
    return json.loads(raw) if raw else {}


def running(*stubs: KubeStub) -> list[str]:
    return [o["metadata"]["name"] for s in stubs for o in copies(s) if o["spec"].get("suspend") is False]


async def test_one_copy_in_the_chosen_cluster_mirrored_requeued_on_loss_never_twice(
    bus: SecuredNatsServer, tmp_path: Path
) -> None:
    nodes = [a_k8s_node("a1", gpus=8)], [a_k8s_node("b1", gpus=8), a_k8s_node("b2", gpus=8)]
    with KubeStub(nodes[0]) as api_a, KubeStub(nodes[1]) as api_b:
        origin = a_batch_job("train", gpus=4, parallelism=2)  # 8 GPUs, created held in cluster a
        origin["metadata"]["annotations"] = {"chamber.io/clusters": "*"}
        nc = await connect(bus.url, name="test-admin")
        await Publisher(nc.jetstream(), source="test").publish(
            TeamQuotaSet(team="vision", pool="default", guaranteed_gpus=16, at=time.time())
        )
        procs = Running()
        try:
            procs.start("dispatch", args(bus.url_for("dispatch")))
            config_a, config_b = api_a.kubeconfig(tmp_path / "a.json"), api_b.kubeconfig(tmp_path / "b.json")
            actuator_a = args(bus.url_for("actuator-a"), "a", kubeconfig=config_a, price=10.0)
            actuator_b = args(bus.url_for("actuator-b"), "b", kubeconfig=config_b, price=1.0)
            procs.start("a", actuator_a)
            procs.start("b", actuator_b)
            # both clusters answer (each has counted its GPUs for a heartbeat) before the user submits
            await until(lambda: all(any(r.path == "/api/v1/nodes" for r in s.requests) for s in (api_a, api_b)))
            await asyncio.sleep(ROUND_S)
            api_a.add(origin)
            bad = a_batch_job("bad", gpus=4, parallelism=1)
            bad["metadata"]["annotations"] = {"chamber.io/clusters": " , "}  # names no cluster
            api_a.add(bad)

            # dispatched to b (cheaper): exactly one copy there, none in a; the origin stays suspended
            [copy] = await until(lambda: copies(api_b))
            assert copy["metadata"]["name"] == "train" and copy["spec"]["suspend"] is True
            assert copy["metadata"]["labels"][GENERATION_LABEL] == "1"
            assert "chamber.io/clusters" not in (copy["metadata"].get("annotations") or {})
            assert copy["spec"]["template"] == origin["spec"]["template"]
            await until(lambda: status(api_a).get("cluster") == "b")
            await asyncio.sleep(2 * ROUND_S)
            assert [r.method for r in api_b.writes() if r.path == JOBS] == ["POST"]
            assert copies(api_a) == [] and [r for r in api_a.writes() if r.path == JOBS] == []
            assert api_a.get("batch/v1", "Job", "ml", "train")["spec"]["suspend"] is True

            # b admits its copy: the origin shows it running there
            api_b.get("batch/v1", "Job", "ml", "train")["spec"]["suspend"] = False
            await until(lambda: status(api_a) == {"cluster": "b", "generation": 1, "phase": "running"})

            # b stops answering: after the timeout its workload runs in a, once
            await procs.stop("b")
            lost_at = time.monotonic()
            [moved] = await until(lambda: copies(api_a), within=LOST_AFTER_S + 6)
            assert time.monotonic() - lost_at >= LOST_AFTER_S - 2 * ROUND_S  # not before the stated timeout
            assert moved["metadata"]["name"] == "train-dispatched"
            assert moved["metadata"]["labels"][GENERATION_LABEL] == "2"
            await until(lambda: status(api_a).get("cluster") == "a")
            moved_copy = api_a.get("batch/v1", "Job", "ml", "train-dispatched")
            moved_copy["spec"]["suspend"] = False

            # b comes back: its fenced copy is deleted before anything else is written there
            api_b.requests.clear()
            procs.start("b", actuator_b)
            await until(lambda: copies(api_b) == [])
            await asyncio.sleep(2 * ROUND_S)
            assert [(r.method, r.path) for r in api_b.writes()] == [("DELETE", f"{JOBS}/train")]
            assert running(api_a, api_b) == ["train-dispatched"]

            # completion: the copy is deleted, the origin says complete and stays suspended
            moved_copy["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
            await until(lambda: copies(api_a) == [])
            await until(lambda: status(api_a).get("phase") == "complete")
            assert api_a.get("batch/v1", "Job", "ml", "train")["spec"]["suspend"] is True
            assert copies(api_b) == []
            # the workload that names no cluster was told so, once, and never offered
            refused = [(e["involvedObject"]["name"], e["reason"]) for e in api_a.events]
            assert refused == [("bad", "ChamberRefused")] and "names no cluster" in api_a.events[0]["message"]
        finally:
            await procs.stop_all()
            await nc.close()


class Partition:
    """A TCP relay between one client and the bus: `cut()` drops its connections and refuses new ones,
    as a network partition between that cluster and the control plane would."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()


async def test_a_cluster_cut_off_from_the_bus_deletes_its_copy_before_it_runs_elsewhere(
    bus: SecuredNatsServer, tmp_path: Path
) -> None:
    with KubeStub([a_k8s_node("a1", gpus=8)]) as api_a, KubeStub([a_k8s_node("b1", gpus=8)]) as api_b:
        writes: list[tuple[float, str, str]] = []  # (when, cluster, method) of every copy write
        for name, stub in (("a", api_a), ("b", api_b)):
            stub.on_request = lambda r, name=name: (
                writes.append((time.monotonic(), name, r.method)) if r.method in ("POST", "DELETE") else None
            )
        origin = a_batch_job("train", gpus=4, parallelism=2)
        origin["metadata"]["annotations"] = {"chamber.io/clusters": "*"}
        nc = await connect(bus.url, name="test-admin")
        await Publisher(nc.jetstream(), source="test").publish(
            TeamQuotaSet(team="vision", pool="default", guaranteed_gpus=16, at=time.time())
        )
        partition = Partition(bus.port)
        port = await partition.start()
        url_b = bus.url_for("actuator-b").replace(f":{bus.port}", f":{port}")
        procs = Running()
        try:
            procs.start("dispatch", args(bus.url_for("dispatch")))
            config_a, config_b = api_a.kubeconfig(tmp_path / "a.json"), api_b.kubeconfig(tmp_path / "b.json")
            procs.start("a", args(bus.url_for("actuator-a"), "a", kubeconfig=config_a, price=10.0))
            procs.start("b", args(url_b, "b", kubeconfig=config_b, price=1.0))
            await until(lambda: all(any(r.path == "/api/v1/nodes" for r in s.requests) for s in (api_a, api_b)))
            await asyncio.sleep(ROUND_S)
            api_a.add(origin)
            [copy] = await until(lambda: copies(api_b))
            copy["spec"]["suspend"] = False  # running in b
            await until(lambda: status(api_a).get("phase") == "running")

            # b's actuator loses the bus; b itself keeps running: it deletes its copy (half the timeout),
            # and only then (the whole timeout) does the workload get a copy in a
            await partition.cut()
            [moved] = await until(lambda: copies(api_a), within=LOST_AFTER_S + 6)
            assert copies(api_b) == [] and moved["metadata"]["labels"][GENERATION_LABEL] == "2"
            [deleted_b] = [t for t, c, m in writes if (c, m) == ("b", "DELETE")]
            [created_a] = [t for t, c, m in writes if (c, m) == ("a", "POST") and t > deleted_b - 60]
            assert deleted_b < created_a, "the copy in a was created while b's still ran"
        finally:
            cut_off = procs.tasks.pop("b")  # nothing left to drain
            cut_off.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(cut_off, 5)
            await procs.stop_all()
            await nc.close()


async def test_the_one_scheduler_admits_the_copy_in_its_cluster_and_the_origin_shows_it(
    bus: SecuredNatsServer, tmp_path: Path
) -> None:
    """The whole loop: dispatched to b, the held copy is placed on b's node by the scheduler acting on b
    (`--kubernetes-cluster b=KUBECONFIG`), and the origin in a shows it running there, then complete."""
    from services.scheduler import service as scheduler

    with KubeStub([a_k8s_node("a1", gpus=8)]) as api_a, KubeStub([a_k8s_node("b1", gpus=8)]) as api_b:
        origin = a_batch_job("train", gpus=4, parallelism=2)
        origin["metadata"]["annotations"] = {"chamber.io/clusters": "b"}
        nc = await connect(bus.url, name="test-admin")
        publisher = Publisher(nc.jetstream(), source="test")
        for event in (a_quota("vision", 16), a_node("b1", gpus=8, cluster="b")):  # what quota and discovery say
            await publisher.publish(event)
        config_a, config_b = api_a.kubeconfig(tmp_path / "a.json"), api_b.kubeconfig(tmp_path / "b.json")
        parser = argparse.ArgumentParser()
        add_nats_option(parser)
        scheduler.add_arguments(parser)
        argv = ["--nats", bus.url_for("scheduler"), "--cluster", "a", "--kubernetes-cluster", f"b={config_b}"]
        scheduler_args = parser.parse_args([*argv, "--interval", "0.2", "--kubernetes-interval", str(ROUND_S)])
        procs = Running()
        stop = asyncio.Event()
        scheduling = asyncio.create_task(scheduler.run(scheduler_args, stop))
        try:
            procs.start("dispatch", args(bus.url_for("dispatch")))
            procs.start("a", args(bus.url_for("actuator-a"), "a", kubeconfig=config_a))
            procs.start("b", args(bus.url_for("actuator-b"), "b", kubeconfig=config_b))
            await until(lambda: all(any(r.path == "/api/v1/nodes" for r in s.requests) for s in (api_a, api_b)))
            api_a.add(origin)

            # the copy in b is admitted on b1 by the scheduler, and the origin in a shows it running
            await until(lambda: running(api_b) == ["train"])
            copy = api_b.get("batch/v1", "Job", "ml", "train")
            terms = copy["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
            expressions = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            assert {"key": "kubernetes.io/hostname", "operator": "In", "values": ["b1"]} in expressions[
                "matchExpressions"
            ]
            await until(lambda: status(api_a) == {"cluster": "b", "generation": 1, "phase": "running"})
            assert api_a.get("batch/v1", "Job", "ml", "train")["spec"]["suspend"] is True

            copy["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
            await until(lambda: status(api_a).get("phase") == "complete")
            await until(lambda: copies(api_b) == [])
            # the scheduler saw the copy finish before it was deleted: its GPUs on b1 are free again
            last = await nc.jetstream().get_last_msg("JOBS", "chamber.jobs.k8s-b-ml-train")
            assert isinstance(decode_event(last.headers, last.data)[0], JobCompleted)
        finally:
            stop.set()
            await asyncio.wait_for(scheduling, 10)
            await procs.stop_all()
            await nc.close()


async def test_a_member_clusters_agent_reaches_the_control_planes_discovery(bus: SecuredNatsServer) -> None:
    """Cluster b's node agents log in to the control plane's bus as agents-b (what the chart gives a
    member install with dispatch.actuator.nodeAgents): their inventory passes b's gate and the control
    plane's discovery (svc-discovery of cluster c1) announces the node in cluster b. The fixture
    fails the test if the bus refused anyone anything."""
    from services.discovery import service as discovery

    parser = argparse.ArgumentParser()
    add_nats_option(parser)
    discovery.add_arguments(parser)
    a = parser.parse_args(["--nats", bus.url_for("discovery"), "--cluster", "c1", "--tick", "0.1"])
    stop = asyncio.Event()
    task = asyncio.create_task(discovery.run(a, stop))
    agent = await connect_as(bus, "agents-b")
    admin = await connect(bus.url, name="test-admin")
    try:
        gpus = [GpuInfo(index=i, uuid=f"GPU-b-{i}", model="H100-80GB") for i in range(2)]
        inventory = NodeInventory(cluster="b", node="gpu-1", observed_at=time.time(), gpus=gpus)
        headers, body = encode(inventory, source="chamber/agent")
        ack = await agent.request(subjects.ingest(subject_for(inventory)), body, headers=headers, timeout=5)
        assert b'"error"' not in ack.data, ack.data  # the gate stream stored it

        js = admin.jetstream()
        sub = await js.pull_subscribe("chamber.fleet.b.>", durable=None)

        async def announced() -> bool:
            try:
                msgs = await sub.fetch(10, timeout=0.3)
            except TimeoutError:
                return False
            events = [decode_event(m.headers, m.data)[0] for m in msgs]
            return any(isinstance(e, NodeDiscovered) and (e.cluster, e.node) == ("b", "gpu-1") for e in events)

        await eventually(announced, within=8)
    finally:
        await agent.close()
        await admin.close()
        stop.set()
        await asyncio.wait_for(task, 10)
