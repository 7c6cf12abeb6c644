"""`chamber service health`: the policy engine's shell, a manifest for the decider host.

Inputs: FAULTS and FLEET from the start (or from the last snapshot), and the latest sample of every
node, then live (TELEMETRY and its partitions). The host folds them in one deterministic order and
decides on the tick once caught up; every decision is an event (isolated, restored, held, extended,
recorded) and changes the state only when it comes back from the log. The shell acts on Kubernetes
from those events as they are folded, and reconciles the Nodes once after catching up. Commands:
restore, confirm, dismiss, held, policy.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from events import subjects
from events.base import Event
from events.commands import RestoreNode
from events.fleet import GpuIsolated, GpuRestored, NodeDiscovered, NodeIsolated, NodeRestored, NodeUpdated
from services.health import core
from services.health.core import HealthRefusal, HealthState, NodeHealth
from services.health.kube import gpu_entry
from services.health.policy import Policy, PolicyError, load_policy
from services.runtime.backoff import Backoff
from services.runtime.commands import Accepted, Append, Command, CommandRefused
from services.runtime.decider import Decider, DeciderHost, Input, SnapshotCodec
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import get_logger
from services.runtime.manifest import Manifest
from services.runtime.options import add_cluster_option
from services.runtime.partitions import telemetry_inputs
from services.runtime.state_codec import facts_codec

NAME = "health"
DESCRIPTION = "isolate failing GPUs and nodes by policy (XID, ECC, remap, thermal, power, NVLink, PCIe)"
SOURCE = f"chamber/{NAME}"
log = get_logger("chamber.health")
KUBE_WORKERS = 16
PATCH_BACKOFF = Backoff(first_s=2.0, max_s=30.0)  # the API server busy or away: 2, 4, 8, 16, 30 s

ROLE = Manifest(
    reads=("FAULTS", "FLEET", "TELEMETRY"),
    publishes=("chamber.fleet.{cluster}.*",),
    snapshots=True,
    why="isolates and restores nodes and GPUs (FLEET events) from faults and telemetry",
)


TargetRequest = RestoreNode  # shared with the gateway and the API documents (events/commands.py)


class Empty(msgspec.Struct):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_option(parser)
    parser.add_argument("--policy", type=Path, help="policy file merged over the default (YAML)")
    parser.add_argument("--kubeconfig", help="act on Kubernetes Nodes through this kubeconfig")
    parser.add_argument(
        "--in-cluster", action="store_true", help="use the pod's service account (the default inside a pod)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="log the Kubernetes patches instead of sending them (always so with CHAMBER_MODE=monitor)",
    )
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between decisions (default 1)")
    parser.add_argument(
        "--snapshot-every", type=float, default=300.0, help="seconds between state snapshots (default 300)"
    )


def snapshot_codec(policy: Policy) -> SnapshotCodec[HealthState]:
    """The state's facts (msgspec, `core.STATE_VERSION`); the policy in force comes from this start,
    never from the snapshot (an operator who changed the policy file gets the new one)."""
    base = facts_codec(HealthState, version=core.STATE_VERSION)

    def decode(data: bytes) -> HealthState:
        return dataclasses.replace(base.decode(data), policy=policy)

    return SnapshotCodec(format=base.format, encode=base.encode, decode=decode)


def decide(state: HealthState, now: float) -> list[tuple[Event, str]]:
    out: list[tuple[Event, str]] = []
    for d in core.decide(state, now):
        log.info(
            "decision",
            action=d.action,
            cluster=d.cluster,
            node=d.node,
            gpu=d.gpu_index,
            reason=d.reason,
            fault_ids=list(d.fault_ids),
        )
        assert d.event is not None  # every decision of the core has its event
        out.append((d.event, core.event_id(d)))
    return out


def manifest(
    args: argparse.Namespace,
    policy: Policy,
    telemetry: list[tuple[str, str]] | None = None,
    on_event: Any = None,
) -> Decider[HealthState]:
    """`telemetry`: (stream, sample filter) of TELEMETRY and each partition (`telemetry_inputs`)."""
    if telemetry is None:
        telemetry = [("TELEMETRY", "chamber.telemetry.sample.>")]
    return Decider(
        name=NAME,
        inputs=(
            Input("FAULTS"),
            Input("FLEET"),  # inventories, and every decision of health (its own and the operators')
            # the current picture of every node (its last sample), then live: not history
            *(Input(stream, (subject,), deliver="last_per_subject") for stream, subject in telemetry),
        ),
        initial=lambda: core.new_state(policy),
        evolve=core.evolve,
        decide=decide,
        tick_s=getattr(args, "tick", 1.0),
        snapshot=snapshot_codec(policy),
        snapshot_every_s=getattr(args, "snapshot_every", 300.0),
        on_event=on_event,
        decide_on_fold=True,  # a fault is answered as soon as it is folded, not at the next tick
        commands=commands(policy),
    )


class HealthShell:
    def __init__(self, ctx: ServiceContext, actuator: Any, cluster: str) -> None:
        self.ctx = ctx
        self.host: DeciderHost[HealthState] | None = None  # set by `setup`
        self.actuator = actuator
        self.cluster = cluster
        self.node_locks: dict[str, asyncio.Lock] = {}
        self.actuations: set[asyncio.Task[None]] = set()
        self.annotated: dict[tuple[str, str], list[str]] = {}  # a node's isolated-GPU entries last written
        # Kubernetes calls block on the network: a pool of their own, wider than asyncio's default.
        self.kube_pool = ThreadPoolExecutor(max_workers=KUBE_WORKERS, thread_name_prefix="chamber-kube")

    @property
    def state(self) -> HealthState:
        assert self.host is not None
        return self.host.state

    @property
    def ready(self) -> bool:
        return self.host is not None and self.host.ready

    async def tick(self, now: float) -> None:
        """One decision pass (the host's tick)."""
        assert self.host is not None
        await self.host.tick(now)

    # -- acting on Kubernetes, from the log ------------------------------------------------------

    def on_event(self, event: Event) -> None:
        """Called by the host after folding a live event: Kubernetes follows the log, whoever decided."""
        if isinstance(event, NodeDiscovered | NodeUpdated):
            # An inventory that names (or renames) an isolated GPU: rewrite the annotation, whose
            # entries are UUIDs for the device plugin, not the `index-N` written while none was known.
            node = self.state.nodes.get((event.cluster, event.node))
            key = (event.cluster, event.node)
            if node is not None and node.gpu_isolated and self._gpu_entries(node) != self.annotated.get(key):
                self._actuate(self._gpu_isolated_event(node, min(node.gpu_isolated)))
            return
        self._actuate(event)

    async def reconcile_when_ready(self) -> None:
        assert self.host is not None
        caught_up = asyncio.ensure_future(self.host.caught_up_event.wait())
        stopped = asyncio.ensure_future(self.ctx.stop.wait())
        await asyncio.wait([caught_up, stopped], return_when=asyncio.FIRST_COMPLETED)
        for waiter in (caught_up, stopped):
            waiter.cancel()
        if not self.host.ready:
            return
        log.info("caught up", nodes=len(self.state.nodes), isolated=self._isolated_count())
        await self._reconcile()

    def _actuate(self, event: Event, *, reconcile: bool = False) -> None:
        if self.actuator is None or getattr(event, "cluster", None) != self.cluster:
            return
        if not isinstance(event, NodeIsolated | NodeRestored | GpuIsolated | GpuRestored):
            return
        # A GPU decision writes the node's full list (computed here, at decision time): a live one
        # without a read; a reconcile reads first, so only drift is patched.
        isolated_gpus = self._isolated_gpus(event)
        task = asyncio.create_task(self._patch(event, isolated_gpus, reconcile))
        self.actuations.add(task)
        task.add_done_callback(self.actuations.discard)

    def _isolated_gpus(self, event: Event) -> list[str] | None:
        """The node's GPUs Chamber holds isolated now (the annotation's full value), for GPU decisions."""
        if not isinstance(event, GpuIsolated | GpuRestored):
            return None
        node = self.state.nodes.get((event.cluster, event.node))
        entries = [] if node is None else self._gpu_entries(node)
        self.annotated[(event.cluster, event.node)] = entries
        return entries

    @staticmethod
    def _gpu_entries(node: NodeHealth) -> list[str]:
        # Isolations are keyed by index; the UUID is resolved only here, for the annotation.
        return sorted(gpu_entry(i, node.gpus.get(i)) for i in node.gpu_isolated)

    @staticmethod
    def _gpu_isolated_event(node: NodeHealth, gpu: int) -> GpuIsolated:
        iso = node.gpu_isolated[gpu]
        return GpuIsolated(
            cluster=node.cluster,
            node=node.node,
            gpu_index=gpu,
            at=iso.at,
            reason=iso.reason,
            gpu_uuid=node.gpus.get(gpu),
        )

    async def _patch(self, event: Event, isolated_gpus: list[str] | None, read_first: bool = False) -> None:
        node = event.node  # type: ignore[attr-defined]
        lock = self.node_locks.setdefault(node, asyncio.Lock())
        async with lock:  # one node's patches in decision order; nodes in parallel
            for attempt in range(1, 6):
                try:
                    loop = asyncio.get_running_loop()
                    apply = functools.partial(self.actuator.apply, event, isolated_gpus, read_first=read_first)
                    await loop.run_in_executor(self.kube_pool, apply)
                    return
                except Exception as exc:
                    log.warning("kubernetes patch failed", node=node, attempt=attempt, error=repr(exc))
                    await asyncio.sleep(PATCH_BACKOFF.for_attempt(attempt))
            log.error("kubernetes patch gave up; the next restart reconciles", node=node)

    async def _reconcile(self) -> None:
        """After a restart, make Kubernetes match the isolations in force (idempotent patches)."""
        for node in self.state.nodes.values():
            if node.isolated is not None:
                iso = node.isolated
                self._actuate(
                    NodeIsolated(cluster=node.cluster, node=node.node, at=iso.at, reason=iso.reason), reconcile=True
                )
            if node.gpu_isolated:  # one read per node: the annotation holds all its isolated GPUs
                self._actuate(self._gpu_isolated_event(node, min(node.gpu_isolated)), reconcile=True)

    def _isolated_count(self) -> int:
        return sum(1 for n in self.state.nodes.values() if n.isolated is not None)


# -- commands (pure; served by the host) ------------------------------------------------------------


def _node_subject(_: HealthState, req: TargetRequest) -> tuple[str, str]:
    """An operator's command acts on the node's FLEET subject (its isolations, health's own decisions)."""
    return "FLEET", subjects.fleet(req.cluster, req.node)


def _operator(decide_one: Any) -> Any:
    """restore, confirm or dismiss: checked against the node's latest event, folded; the stream refuses
    the append if anything reached the node since (another replica's command, health's own decision):
    of two commands on one node at once, exactly one wins. Kubernetes follows when the event is folded
    (`on_event`), whoever decided."""

    def validate(state: HealthState, req: TargetRequest, now: float) -> Accepted:
        try:
            decision = decide_one(state, req.cluster, req.node, req.gpu, now, req.by)
        except HealthRefusal as exc:
            raise CommandRefused(str(exc), field=exc.field or "node") from None
        append = Append(decision.event, core.event_id(decision), req.expected_seq)
        answer = {"action": decision.action, "node": req.node, "gpu": req.gpu, "reason": decision.reason}
        return Accepted((append,), answer)

    return validate


def _node_changed(req: TargetRequest) -> str:
    return f"{req.node} changed while this command was on its way; `chamber health` shows it now"


def answer_held(state: HealthState, _: Empty, now: float) -> list[dict[str, Any]]:
    return [
        {"cluster": h.cluster, "node": h.node, "gpu": h.gpu_index, "action": h.action, "reason": h.reason}
        for h in state.held.values()
    ]


ON_NODE: dict[str, Any] = {"entity": _node_subject, "conflict": _node_changed, "conflict_field": "node"}


def commands(policy: Policy) -> tuple[Command[HealthState, Any], ...]:
    return (
        Command("restore", TargetRequest, validate=_operator(core.restore), **ON_NODE),
        Command("confirm", TargetRequest, validate=_operator(core.confirm), **ON_NODE),
        Command("dismiss", TargetRequest, validate=_operator(core.dismiss), **ON_NODE),
        Command("held", Empty, answer=answer_held),
        Command("policy", Empty, answer=lambda _state, _req, _now: policy.to_json()),
    )


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        raise SystemExit(f"chamber service health: {exc}") from None
    await serve(NAME, args.nats, lambda ctx: setup(ctx, args, policy), stop)


async def setup(ctx: ServiceContext, args: argparse.Namespace, policy: Policy, actuator: Any = None) -> HealthShell:
    if actuator is None:
        from services.health.kube import KubeActuator, client_from, monitor_mode

        api = client_from(getattr(args, "kubeconfig", None), getattr(args, "in_cluster", False))
        dry_run = args.dry_run or monitor_mode()
        actuator = KubeActuator(api, dry_run=dry_run) if api is not None else None
        log.info("kubernetes actuator", configured=api is not None, dry_run=dry_run)
    shell = HealthShell(ctx, actuator, args.cluster)
    samples = await telemetry_inputs(ctx.js, samples_only=True)  # every partition
    host = DeciderHost(manifest(args, policy, samples, on_event=shell.on_event), ctx)
    shell.host = host
    host.install()
    ctx.task(shell.reconcile_when_ready)
    return shell
