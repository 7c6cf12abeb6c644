"""`chamber service dispatch`: multi-cluster dispatch, one control plane for several Kubernetes clusters.

Two modes of one service:

- the dispatcher (default): a manifest for the decider host (services/runtime/decider.py) over
  DISPATCH and QUOTA with the core of services/dispatch/dispatcher.py; it decides which one cluster
  runs each offered workload and when a copy is recalled. Replicas share `--leader-lease`.
- a cluster's actuator (`--actuator --cluster C --kubeconfig FILE`): one per cluster, with that
  cluster's own credentials and its own NATS user (`actuator-<c>`, `chamber nats-config
  --actuator-cluster C`). It folds DISPATCH (services/dispatch/actuator.py), and every
  `--interval` lists the cluster's workloads and acts: deletes stale copies first, creates the copies
  dispatched here, patches origins (kept suspended, status mirrored), and publishes offers, copy
  phases and its heartbeat (`--price`, capacity from the nodes' allocatable GPUs).

A cluster whose heartbeat is older than `--lost-after` seconds (default 120, the same on the
dispatcher and the actuators) is lost: its copies are recalled and its workloads dispatched elsewhere;
an actuator that could not beat for half that long deletes every copy it holds (so, while its process
lives, its copies are gone before the dispatcher sends their workloads elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from events import subjects
from events.dispatch import ClusterHeartbeat, CopyPhase, CopyReported
from events.streams import DISPATCH
from services.dispatch import actuator as act
from services.dispatch import core
from services.dispatch.core import LOST_AFTER_S
from services.dispatch.dispatcher import STATE_VERSION, DispatcherState, Seen, decide, evolve
from services.kube.cluster import refuse_once
from services.runtime.decider import Decider, DeciderHost, Input, pickle_codec
from services.runtime.host import ServiceContext, serve
from services.runtime.lease import ENV_NAME, ENV_TTL
from services.runtime.logs import get_logger
from services.runtime.manifest import Manifest
from services.runtime.options import add_cluster_option

NAME = "dispatch"
DESCRIPTION = "place each multi-cluster workload in one cluster; --actuator: a cluster's copies"
RUNS_IN_UP = False
KEEP_FINISHED_ROUNDS = (
    5  # a finished copy is deleted this many rounds after its recall  # one machine is one cluster: nothing to dispatch
)
log = get_logger("chamber.dispatch")

ROLE = Manifest(
    reads=("DISPATCH", "QUOTA"),
    publishes=("chamber.dispatch.decision.>",),
    snapshots=True,
    leases=True,
    commands=False,
    why="decides which one cluster runs each multi-cluster workload (DISPATCH decisions); replicas share a lease",
)
# What an actuator folds: every offer and decision, and every copy report (to mirror them on origins).
ACTUATOR_SUBJECTS = ("chamber.dispatch.offer.>", "chamber.dispatch.decision.>", "chamber.dispatch.copy.>")


def actuator_name(cluster: str) -> str:
    return f"actuator-{subjects.token(cluster)}"


def dispatcher(args: argparse.Namespace) -> Decider[DispatcherState]:
    return Decider(
        name=NAME,
        inputs=(Input("DISPATCH"), Input("QUOTA")),
        initial=lambda: DispatcherState(lost_after_s=args.lost_after),
        evolve=evolve,
        decide=decide,
        tick_s=args.interval,
        snapshot=pickle_codec(
            DispatcherState, Seen, core.DispatchState, core.Copy, core.Workload, version=STATE_VERSION
        ),
        lease=args.leader_lease,
        lease_ttl_s=args.leader_lease_ttl,
        decide_on_fold=True,
    )


class Actuator:
    """The shell of one cluster's actuator: list, plan (pure), act, publish."""

    def __init__(self, args: argparse.Namespace, workloads: Any) -> None:
        self.cluster = args.cluster
        self.price = args.price
        self.release = args.copies == "released"
        self.keep_finished_s = KEEP_FINISHED_ROUNDS * args.interval
        self.lost_after_s = args.lost_after
        self.workloads = workloads
        self.host: DeciderHost[act.ActuatorState] | None = None
        self.last_beat = time.time()  # the last heartbeat the bus acknowledged
        self.detected = False
        self.refused: set[str] = set()  # origin uids already told why they are not dispatched

    def manifest(self, interval: float) -> Decider[act.ActuatorState]:
        return Decider(
            name=actuator_name(self.cluster),
            inputs=(Input("DISPATCH", subjects=ACTUATOR_SUBJECTS),),
            initial=lambda: act.ActuatorState(self.cluster),
            evolve=act.evolve,
            tick_s=interval,
        )

    async def tick(self, now: float) -> None:
        from kubernetes.client.exceptions import ApiException

        host = self.host
        if host is None or not host.ready:
            return
        if not self.detected:
            await asyncio.to_thread(self.workloads.detect, lambda kind: None)
            self.detected = True
            self.last_beat = now  # the fence's clock starts once caught up (a long replay is no silence)
        fenced = self.fenced(now)
        listed = await asyncio.to_thread(self.workloads.list)
        events, actions = act.plan(
            host.state, listed, now, fenced=fenced, release=self.release, keep_finished_s=self.keep_finished_s
        )
        kinds = {k.kind: k for k in self.workloads.kinds}
        failed: set[str] = set()
        undeleted = False  # a deletion the API server refused this round
        for action in actions:  # deletions come first (plan's order): no duplicate runs while we create
            kind = kinds.get(action.kind)
            if kind is None:  # not served here (the dispatcher sends a kind only where it is served)
                log.warning("dispatch: workload kind not served here", kind=action.kind, name=action.name)
                if isinstance(action, act.Create):
                    failed.add(action.workload)
                continue
            if isinstance(action, act.Refuse):
                await self.refuse(kind, action, now)
                continue
            if isinstance(action, act.Create) and undeleted:
                failed.add(action.workload)  # a stale copy is still here: nothing new runs beside it
                continue
            try:
                if isinstance(action, act.Delete):
                    await asyncio.to_thread(self.workloads.delete, kind, action.namespace, action.name)
                elif isinstance(action, act.Create):
                    await asyncio.to_thread(self.workloads.create, kind, action.namespace, action.body)
                else:
                    await asyncio.to_thread(self.workloads.patch, kind, action.namespace, action.name, list(action.ops))
            except ApiException as exc:
                log.warning(
                    "dispatch: kubernetes refused",
                    action=type(action).__name__,
                    kind=action.kind,
                    namespace=action.namespace,
                    name=action.name,
                    status=exc.status,
                    reason=str(exc.reason),
                )
                if isinstance(action, act.Create):
                    failed.add(action.workload)
                undeleted = undeleted or isinstance(action, act.Delete)
                continue
            log.info(
                "dispatch: kubernetes workload",
                action=type(action).__name__,
                namespace=action.namespace,
                name=action.name,
            )
        for event, event_id in events:
            if isinstance(event, CopyReported) and event.phase == CopyPhase.CREATED and event.workload in failed:
                continue
            await host.ctx.publisher.publish(event, id=event_id)
        await self.beat(now, *act.load(listed))

    def fenced(self, now: float) -> bool:
        return now - self.last_beat > self.lost_after_s * act.FENCE_FRACTION

    async def guard(self, now: float) -> None:
        """The fence on its own timer: a round blocked on a bus that does not answer (each publish
        waits for its ack) must not keep this cluster's copies running past the fence."""
        if self.host is None or not self.detected or not self.fenced(now):
            return
        listed = await asyncio.to_thread(self.workloads.list)
        _, actions = act.plan(self.host.state, listed, now, fenced=True)
        kinds = {k.kind: k for k in self.workloads.kinds}
        for action in actions:
            if isinstance(action, act.Delete) and action.kind in kinds:
                log.warning(
                    "dispatch: the bus is out of reach; deleting this cluster's copy",
                    namespace=action.namespace,
                    name=action.name,
                    silent_s=round(now - self.last_beat, 1),
                )
                await asyncio.to_thread(self.workloads.delete, kinds[action.kind], action.namespace, action.name)

    async def refuse(self, kind: Any, action: act.Refuse, now: float) -> None:
        """Say once, on the origin object, why it is not dispatched (and in the log in any case)."""
        await refuse_once(self.workloads, self.refused, kind, action, now, log, "dispatch: workload refused")

    async def beat(self, now: float, running_gpus: int, queued_gpus: int) -> None:
        assert self.host is not None
        capacity = await asyncio.to_thread(self.workloads.capacity_gpus)
        kinds = tuple(k.kind for k in self.workloads.kinds) if self.detected else ()
        beat = ClusterHeartbeat(
            cluster=self.cluster,
            at=now,
            capacity_gpus=capacity,
            price_per_gpu_hour=self.price,
            kinds=kinds,
            running_gpus=running_gpus,
            queued_gpus=queued_gpus,
        )
        await self.host.ctx.publisher.publish(beat)
        self.last_beat = now


def kube_client(kubeconfig: str | None) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except config.ConfigException as exc:
            raise SystemExit(f"chamber service dispatch --actuator: no cluster to talk to ({exc})") from None
    return client.ApiClient()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_option(parser)
    parser.add_argument("--actuator", action="store_true", help="run this --cluster's actuator, not the dispatcher")
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG") or None,
        metavar="FILE",
        help="the actuator's cluster credentials (default $KUBECONFIG, else in-cluster)",
    )
    parser.add_argument(
        "--lost-after",
        type=float,
        default=LOST_AFTER_S,
        metavar="SECONDS",
        help=f"a cluster silent this long is lost: its workloads go elsewhere (default {LOST_AFTER_S:g})",
    )
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between rounds (default 2)")
    parser.add_argument(
        "--price", type=float, default=0.0, metavar="PER_GPU_HOUR", help="the actuator's cluster price (default 0)"
    )
    parser.add_argument(
        "--copies",
        choices=("held", "released"),
        default="held",
        help="the actuator creates copies held as their origin was, for the cluster's own admission (Chamber's "
        "scheduler on that cluster, or Kueue) to place; or released at once, placed by Kubernetes (default held)",
    )
    parser.add_argument("--leader-lease", default=os.environ.get(ENV_NAME, ""), help=f"(default ${ENV_NAME})")
    parser.add_argument("--leader-lease-ttl", type=float, default=float(os.environ.get(ENV_TTL) or 15.0))


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    if not args.lost_after > 0:
        raise SystemExit("chamber service dispatch: --lost-after must be more than 0 seconds")
    if not args.actuator:

        async def setup(ctx: ServiceContext) -> None:
            DeciderHost(dispatcher(args), ctx).install()

        await serve(NAME, args.nats, setup, stop)
        return
    from services.dispatch.kube import DispatchWorkloads

    shell = Actuator(args, DispatchWorkloads(kube_client(args.kubeconfig)))

    async def setup_actuator(ctx: ServiceContext) -> None:
        shell.host = DeciderHost(shell.manifest(args.interval), ctx)
        shell.host.install()
        ctx.every(args.interval, shell.tick)
        ctx.every(args.interval, shell.guard)

    await serve(actuator_name(args.cluster), args.nats, setup_actuator, stop, streams=(DISPATCH,))
