"""`chamber service discovery`: the fleet inventory's shell.

A manifest for the decider host. Inputs: the latest inventory and sample of every node (TELEMETRY,
last per subject, then live), FLEET from the start (what was announced, and health's isolations for
the view), and Kubernetes Nodes when an API is configured (polled, folded as they come). Outputs:
NodeDiscovered / NodeUpdated / NodeLost / NodeForgotten on FLEET (folded when they come back from the
log, so every replica sees the same announcements), and the current view of every node in the
JetStream KV bucket `chamber_fleet` (key `<cluster>.<node>`; a forgotten node's key is deleted).
Command: forget (`chamber fleet forget NODE`).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from events import Event, subjects
from events.codec import stable_id
from events.commands import ForgetNode
from services.discovery import core
from services.discovery.core import DiscoveryState, ForgetRefused, KubeNode, KubeNodesListed
from services.runtime.buckets import live_keys, open_kv
from services.runtime.commands import Accepted, Append, Command, CommandRefused
from services.runtime.decider import Decider, DeciderHost, Input
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import get_logger
from services.runtime.manifest import Manifest
from services.runtime.options import add_cluster_option
from services.runtime.partitions import telemetry_inputs

NAME = "discovery"
DESCRIPTION = "fleet inventory from agents and Kubernetes: nodes discovered, updated, suspect, lost"
SOURCE = f"chamber/{NAME}"
BUCKET = "chamber_fleet"
log = get_logger("chamber.discovery")
_json = msgspec.json.Encoder()

ROLE = Manifest(
    reads=("TELEMETRY", "FLEET"),
    publishes=("chamber.fleet.{cluster}.*",),
    buckets=(BUCKET,),
    snapshots=True,
    why="announces nodes from agents' inventories and keeps the fleet view bucket",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_option(parser)
    parser.add_argument("--kubeconfig", help="read Kubernetes Nodes through this kubeconfig")
    parser.add_argument(
        "--in-cluster", action="store_true", help="use the pod's service account (the default inside a pod)"
    )
    parser.add_argument("--kube-poll", type=float, default=30.0, help="seconds between Node listings (default 30)")
    parser.add_argument("--suspect-intervals", type=int, default=3, help="missed heartbeats before suspect (3)")
    parser.add_argument("--lost-after", type=float, default=60.0, help="seconds of silence before lost (60)")
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between checks (default 1)")
    parser.add_argument("--view-every", type=float, default=5.0, help="rewrite a changed KV view at most this often")


class DiscoveryShell:
    def __init__(
        self, host: DeciderHost[DiscoveryState], js: JetStreamContext, kv: KeyValue, view_every_s: float
    ) -> None:
        self.host = host
        self.js = js
        self.kv = kv
        self.view_every_s = view_every_s
        self.written: dict[tuple[str, str], tuple[int, Any, float]] = {}  # version, signature, time
        self.pruned = False  # the bucket's keys of nodes forgotten before this start were deleted

    @property
    def state(self) -> DiscoveryState:
        return self.host.state

    async def write_views(self, now: float) -> None:
        if not self.host.ready:
            return
        for key, rec in list(self.state.nodes.items()):
            last = self.written.get(key)
            if last is not None and last[0] == rec.version and now - last[2] < self.view_every_s:
                continue
            shown = core.view(self.state, rec, now)
            gpus = [(g["isolated"], g["reason"]) for g in shown["gpus"]]
            signature = (shown["status"], shown["reason"], gpus, shown["held"], shown["labels"], len(gpus))
            if (
                last is not None
                and last[1] == signature
                and (last[0] == rec.version or now - last[2] < self.view_every_s)
            ):
                continue  # only utilization moved, and recently written
            await self.kv.put(core.kv_key(*key), _json.encode(shown))
            self.written[key] = (rec.version, signature, now)
        await self.drop_forgotten()

    async def drop_forgotten(self) -> None:
        """Delete the view of every node no longer in the state (forgotten): those written since this
        start, and, once after a start, any key of the bucket (forgotten while no replica ran)."""
        known = {core.kv_key(*key) for key in self.state.nodes}
        for key in [k for k in self.written if k not in self.state.nodes]:
            await self.kv.delete(core.kv_key(*key))
            del self.written[key]
        if not self.pruned:
            for stale in [k for k in await live_keys(self.js, self.kv, BUCKET) if k not in known]:
                await self.kv.delete(stale)
            self.pruned = True


def decide(state: DiscoveryState, now: float) -> list[tuple[Event, str]]:
    events = core.decide(state, now)
    for e in events:
        log.info("fleet", kind=type(e).__name__, node=e.node, status=getattr(e, "status", None))  # type: ignore[attr-defined]
    return [(e, core.event_id(e)) for e in events]


def validate_forget(state: DiscoveryState, req: ForgetNode, now: float) -> Accepted:
    """`chamber fleet forget NODE`: only a lost node. Checked against the node's FLEET subject as folded
    (the host passes its last sequence): of a forget and another fleet event on the node at once, only
    one wins. The id is per record, so the same forget sent twice is one event."""
    try:
        event = core.forget(state, req.cluster, req.node, now, req.by, req.reason)
    except ForgetRefused as exc:
        raise CommandRefused(str(exc), field="node", kind=exc.kind) from None
    first_seen = state.nodes[(req.cluster, req.node)].first_seen_at
    append = Append(event, stable_id("discovery-forget", req.cluster, req.node, first_seen), req.expected_seq)
    return Accepted((append,), {"cluster": req.cluster, "node": req.node, "state": "forgotten"})


def _node_subject(_: DiscoveryState, req: ForgetNode) -> tuple[str, str]:
    return "FLEET", subjects.fleet(req.cluster, req.node)


def _node_changed(req: ForgetNode) -> str:
    return f"{req.node} changed while this command was on its way; `chamber fleet` shows it now"


COMMANDS: tuple[Command[DiscoveryState, Any], ...] = (
    Command(
        "forget",
        ForgetNode,
        validate=validate_forget,
        entity=_node_subject,
        conflict=_node_changed,
        conflict_field="node",
    ),
)


def manifest(args: argparse.Namespace, telemetry: list[tuple[str, str]] | None = None) -> Decider[DiscoveryState]:
    """`telemetry`: (stream, filter) of TELEMETRY and each of its partitions (`telemetry_inputs`)."""
    if telemetry is None:
        telemetry = [("TELEMETRY", "chamber.telemetry.>")]
    return Decider(
        name=NAME,
        inputs=(
            # the current picture of every node, then live: TELEMETRY and each of its partitions
            *(Input(stream, (subject,), deliver="last_per_subject") for stream, subject in telemetry),
            Input("FLEET"),  # what was announced, and isolations for the view
        ),
        initial=lambda: core.new_state(suspect_after_intervals=args.suspect_intervals, lost_after_s=args.lost_after),
        evolve=core.evolve,
        decide=decide,
        tick_s=args.tick,
        commands=COMMANDS,
    )


def list_kube_nodes(api: Any, cluster: str, now: float) -> KubeNodesListed:
    """One full listing of Kubernetes Nodes (run in a thread: the client is synchronous)."""
    nodes = []
    for n in api.list_node().items:
        capacity = (n.status.capacity or {}) if n.status else {}
        allocatable = (n.status.allocatable or {}) if n.status else {}
        nodes.append(
            KubeNode(
                name=n.metadata.name,
                labels=dict(n.metadata.labels or {}),
                capacity_gpus=_gpus(capacity),
                allocatable_gpus=_gpus(allocatable),
                allocatable_cpu_milli=_host(allocatable, "cpu"),
                allocatable_memory_mib=_host(allocatable, "memory"),
                unschedulable=bool(n.spec.unschedulable) if n.spec else False,
                provider_id=(n.spec.provider_id or "") if n.spec else "",
            )
        )
    return KubeNodesListed(cluster=cluster, at=now, nodes=tuple(sorted(nodes, key=lambda k: k.name)))


def _host(resources: dict[str, Any], resource: str) -> int | None:
    """A node's allocatable cpu (milli-CPUs) or memory (MiB); None where absent or unreadable."""
    from services.kube.resources import WorkloadError, cpu_quantity_milli, memory_quantity_mib

    value = resources.get(resource)
    if value is None:
        return None
    parse = cpu_quantity_milli if resource == "cpu" else memory_quantity_mib
    try:
        return parse(value, f"status.allocatable.{resource}")
    except WorkloadError:
        return None


def _gpus(resources: dict[str, Any]) -> int | None:
    """nvidia.com/gpu, else amd.com/gpu (AMD's device plugin): a node has one vendor's GPUs."""
    found = _count(resources.get(core.GPU_RESOURCE))
    return found if found is not None else _count(resources.get(core.AMD_GPU_RESOURCE))


def _count(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    await serve(NAME, args.nats, lambda ctx: setup(ctx, args), stop)


async def setup(ctx: ServiceContext, args: argparse.Namespace, kube_api: Any = None) -> DiscoveryShell:
    host = DeciderHost(manifest(args, await telemetry_inputs(ctx.js)), ctx)
    host.install()
    kv = await open_kv(ctx.js, BUCKET, history=1, description="current fleet view (discovery)")
    shell = DiscoveryShell(host, ctx.js, kv, args.view_every)
    ctx.every(args.tick, shell.write_views)
    if kube_api is None:
        from services.runtime.kube import client_from

        kube_api = client_from(getattr(args, "kubeconfig", None), getattr(args, "in_cluster", False))
    if kube_api is not None:

        async def poll(now: float) -> None:
            host.inject(await asyncio.to_thread(list_kube_nodes, kube_api, args.cluster, now))

        ctx.every(args.kube_poll, poll)
    return shell
