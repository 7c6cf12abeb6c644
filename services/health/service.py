"""`chamber service health`: the policy engine's shell.

Reads FAULTS and FLEET from the start (its state is derived, never stored) and TELEMETRY samples from
now on; decides after every batch once caught up, and on a tick for probations; publishes decisions
with deterministic ids, then makes Kubernetes Nodes reflect them. Commands: restore, confirm, held,
policy.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
from nats.js.api import DeliverPolicy

from events.base import Event
from events.commands import RestoreNode
from events.fleet import GpuIsolated, GpuRestored, NodeDiscovered, NodeIsolated, NodeRestored, NodeUpdated
from services.health import core
from services.health.core import Decision, HealthRefusal, HealthState, NodeHealth
from services.health.kube import gpu_entry
from services.health.policy import Policy, PolicyError, load_policy
from services.health.replay import CatchUp, DeliverFrom
from services.runtime.backoff import Backoff
from services.runtime.commands import CommandRefused
from services.runtime.consumer import ConsumerOptions, Delivery
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import get_logger
from services.runtime.options import add_cluster_option
from services.runtime.partitions import telemetry_inputs

NAME = "health"
DESCRIPTION = "isolate failing GPUs and nodes by policy (XID, ECC, remap, thermal, power, NVLink, PCIe)"
SOURCE = f"chamber/{NAME}"
log = get_logger("chamber.health")
KUBE_WORKERS = 16
PATCH_BACKOFF = Backoff(first_s=2.0, max_s=30.0)  # the API server busy or away: 2, 4, 8, 16, 30 s


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
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between probation checks (default 1)")


class HealthShell:
    def __init__(self, ctx: ServiceContext, policy: Policy, actuator: Any, cluster: str) -> None:
        self.ctx = ctx
        self.state: HealthState = core.new_state(policy)
        self.actuator = actuator
        self.cluster = cluster
        self.lock = asyncio.Lock()
        self.catch_up = CatchUp(ctx.js)
        self.node_locks: dict[str, asyncio.Lock] = {}
        self.actuations: set[asyncio.Task[None]] = set()
        self.own_ids: set[str] = set()  # ids of events this process published and has folded already
        # Kubernetes calls block on the network: a pool of their own, wider than asyncio's default.
        self.kube_pool = ThreadPoolExecutor(max_workers=KUBE_WORKERS, thread_name_prefix="chamber-kube")

    # -- inputs -----------------------------------------------------------------------------------

    async def on_batch(self, deliveries: list[Delivery]) -> None:
        async with self.lock:
            live = self.catch_up.done
            for d in deliveries:
                if live and d.envelope.id in self.own_ids:
                    # This process's own decision coming back: folded when it was made. Matched by
                    # event id, not by source: another replica's decisions and commands still fold.
                    self.own_ids.discard(d.envelope.id)
                    continue
                if live and isinstance(d.event, NodeDiscovered | NodeUpdated):
                    self._fold_inventory(d.event)
                    continue
                core.evolve(self.state, d.event)
            if live:
                await self._decide(time.time())

    def _fold_inventory(self, event: NodeDiscovered | NodeUpdated) -> None:
        """Fold an inventory; if it names (or renames) an isolated GPU, rewrite the annotation, whose
        entries are UUIDs for the device plugin, not the `index-N` written while none was known."""
        node = self.state.nodes.get((event.cluster, event.node))
        before = self._gpu_entries(node) if node is not None else []
        core.evolve(self.state, event)
        node = self.state.nodes[(event.cluster, event.node)]
        if node.gpu_isolated and self._gpu_entries(node) != before:
            self._actuate(self._gpu_isolated_event(node, min(node.gpu_isolated)))

    async def tick(self, now: float) -> None:
        if not self.catch_up.done:
            if not await self.catch_up.check():
                return
            log.info("caught up", nodes=len(self.state.nodes), isolated=self._isolated_count())
            await self._reconcile()
        async with self.lock:
            await self._decide(now)

    # -- decisions --------------------------------------------------------------------------------

    async def _decide(self, now: float) -> None:
        decisions = core.decide(self.state, now)
        if decisions:
            await self._commit(decisions)

    async def _commit(self, decisions: list[Decision]) -> None:
        out = [(d.event, core.event_id(d), getattr(d.event, "at", None)) for d in decisions if d.event is not None]
        if out:
            self.own_ids.update(event_id for _, event_id, _ in out)
            acks = await self.ctx.publisher.publish_many(out)
            for (_, event_id, _), ack in zip(out, acks, strict=True):
                if ack.duplicate:  # already in the log: no echo will come to consume the id
                    self.own_ids.discard(event_id)
        for d in decisions:
            core.evolve(self.state, d)
            log.info(
                "decision",
                action=d.action,
                cluster=d.cluster,
                node=d.node,
                gpu=d.gpu_index,
                reason=d.reason,
                fault_ids=list(d.fault_ids),
            )
            if d.event is not None:
                self._actuate(d.event)

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
        return [] if node is None else self._gpu_entries(node)

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

    # -- commands ---------------------------------------------------------------------------------

    async def restore(self, req: TargetRequest) -> dict[str, Any]:
        return await self._operator(core.restore, req)

    async def confirm(self, req: TargetRequest) -> dict[str, Any]:
        return await self._operator(core.confirm, req)

    async def dismiss(self, req: TargetRequest) -> dict[str, Any]:
        return await self._operator(core.dismiss, req)

    async def _operator(self, command: Any, req: TargetRequest) -> dict[str, Any]:
        if not self.catch_up.done:
            raise CommandRefused("health is still replaying its history; try again in a few seconds")
        async with self.lock:
            try:
                decision = command(self.state, req.cluster, req.node, req.gpu, time.time(), req.by)
            except HealthRefusal as exc:
                raise CommandRefused(str(exc), field=exc.field) from None
            await self._commit([decision])
        return {"action": decision.action, "node": req.node, "gpu": req.gpu, "reason": decision.reason}

    async def held(self, _: Empty) -> list[dict[str, Any]]:
        return [
            {"cluster": h.cluster, "node": h.node, "gpu": h.gpu_index, "action": h.action, "reason": h.reason}
            for h in self.state.held.values()
        ]


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
    shell = HealthShell(ctx, policy, actuator, args.cluster)
    # FAULTS and FLEET from the start: the state is rebuilt from the log; samples only from now on.
    for stream, policy_ in (("FLEET", DeliverPolicy.ALL), ("FAULTS", DeliverPolicy.ALL)):
        consumer = DeliverFrom(
            ctx.js, ConsumerOptions(stream=stream, durable=None), policy=policy_, batch_handler=shell.on_batch
        )
        shell.catch_up.watch(consumer)
        _add(ctx, consumer)
    for stream, subject in await telemetry_inputs(ctx.js, samples_only=True):  # every partition
        samples = DeliverFrom(
            ctx.js,
            ConsumerOptions(stream=stream, durable=None, filter_subjects=(subject,)),
            policy=DeliverPolicy.NEW,
            batch_handler=shell.on_batch,
        )
        _add(ctx, samples)
    ctx.every(args.tick, shell.tick)
    ctx.command("restore", TargetRequest, shell.restore)
    ctx.command("confirm", TargetRequest, shell.confirm)
    ctx.command("dismiss", TargetRequest, shell.dismiss)
    ctx.command("held", Empty, shell.held)

    async def effective_policy(_: Empty) -> dict[str, Any]:
        return policy.to_json()

    ctx.command("policy", Empty, effective_policy)
    return shell


def _add(ctx: ServiceContext, consumer: DeliverFrom) -> None:
    ctx.consumers.append(consumer)
    ctx.task(lambda: consumer.run(ctx.stop))
