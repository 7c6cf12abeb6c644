"""`chamber service scheduler`: the shell around the scheduler core.

Reads JOBS, FLEET, QUOTA and BILLING from the start on every start (state is derived, never stored), waits
until it has caught up, then runs a cycle every `--interval` seconds: decide -> publish the
decisions' events (deterministic ids) -> fold them back when they arrive from the stream. It runs
no new cycle while its own events are still on their way, so state only ever comes from the log,
in the log's order, live and on replay alike. Commands: submit, cancel, queue, explain.

Hot standby: with `--leader-lease NAME` ($CHAMBER_LEADER_LEASE, which the chart sets) replicas share
a NATS KV lease. Every replica folds the log and answers commands; only the lease holder runs cycles,
publishes decisions and acts on Kubernetes. A replica that becomes leader first catches up with the
streams again, so it decides from everything the previous leader published. Decision ids are stable
(job, generation), so a decision both happen to publish is deduplicated by JetStream, and the core
ignores a stale one: a job never holds two placements.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import secrets
import socket
import time
from typing import Any

from events import JobCancelled
from events.codec import stable_id
from events.commands import CancelJob, ExplainJob, ListQueue, SubmitJob
from services.cli.common import add_cluster_option
from services.runtime import ConsumerOptions, Delivery
from services.runtime.commands import CommandRefused, page_of_rows
from services.runtime.host import ServiceContext, serve
from services.runtime.lease import ENV_NAME, ENV_TTL, LeaderLease
from services.runtime.logs import get_logger
from services.scheduler.actuator import KubernetesActuator
from services.scheduler.core import (
    FINISHED,
    QUEUED,
    CycleMark,
    SchedulerState,
    events_for,
    evolve,
    explain,
    queue_rows,
    schedule,
)
from services.scheduler.core.cycle import PREEMPTION_SEARCHES
from services.scheduler.core.door import size_warnings, submitted
from services.scheduler.core.pools import job_pool
from services.scheduler.core.quota import critical_block
from services.scheduler.core.state import DEFAULT_TOPOLOGY_KEY
from services.scheduler.policy_options import add_policy_arguments, policy_from_args
from services.scheduler.replay import caught_up

NAME = "scheduler"
DESCRIPTION = "queue, place, preempt and resume jobs within team quotas"
log = get_logger("chamber.scheduler")
ECHO_TIMEOUT_S = 10.0


# The request types are shared with the gateway and the API documents (events/commands.py).
SubmitRequest = SubmitJob
CancelRequest = CancelJob
QueueRequest = ListQueue
ExplainRequest = ExplainJob


_SLUG = re.compile(r"[^a-z0-9-]+")


def new_job_id(name: str, team: str) -> str:
    base = _SLUG.sub("-", (name or team).lower()).strip("-")[:40] or "job"
    return f"{base}-{secrets.token_hex(4)}"


class Scheduler:
    def __init__(self, args: argparse.Namespace) -> None:
        self.state = SchedulerState(topology_key=args.topology_key)
        self.interval = args.interval
        self.full_every = args.full_every
        self.policy = policy_from_args(args, preemption_searches=args.preemption_searches)
        self.mark: CycleMark | None = None
        self.last_full = 0.0
        self.waiting: dict[str, str] = {}
        self.awaiting: set[str] = set()
        self.awaiting_since = 0.0
        self.ready = False
        self.ctx: ServiceContext | None = None
        self.lease: LeaderLease | None = None  # None: the only replica, always leading
        self.synced = False  # leading, and caught up with the log since leadership began

    @property
    def leading(self) -> bool:
        return self.lease is None or self.lease.is_leader

    async def on_event(self, delivery: Delivery) -> None:
        evolve(self.state, delivery.envelope.event)  # type: ignore[arg-type]
        self.awaiting.discard(delivery.envelope.id)

    async def tick(self, now: float) -> None:
        ctx = self.ctx
        assert ctx is not None
        if not self.ready:
            self.ready = await caught_up(ctx.js, ctx.consumers)
            if not self.ready:
                return
            log.info("state rebuilt from the log", jobs=len(self.state.jobs), nodes=len(self.state.nodes))
            # The replayed state lives on: keep the collector from walking it during cycles.
            gc.collect()
            gc.freeze()
        if not self.leading:
            self.synced = False
            return
        if not self.synced:
            # A new leader: fold whatever the previous one published before deciding anything.
            if not await caught_up(ctx.js, ctx.consumers):
                return
            self.synced = True
            self.mark, self.awaiting = None, set()
            log.info("leading: scheduling", jobs=len(self.state.jobs))
        if self.awaiting:
            if now - self.awaiting_since < ECHO_TIMEOUT_S:
                return
            log.warning("own events did not come back; scheduling again", missing=len(self.awaiting))
            self.awaiting.clear()
        since = self.mark if now - self.last_full < self.full_every else None
        cycle = schedule(self.state, now, since, policy=self.policy)
        self.mark = cycle.mark
        if cycle.full:
            self.last_full = now
        self.waiting.update(cycle.waiting)
        out = events_for(cycle.decisions, now)
        if not out or not self.leading:  # the lease may have lapsed while the cycle ran
            return
        self.awaiting = {eid for _, eid in out}
        self.awaiting_since = now
        acks = await ctx.publisher.publish_many((event, eid, now) for event, eid in out)
        for (_, eid), ack in zip(out, acks, strict=True):
            if ack.duplicate:  # already in the log (a replayed decision): it will not come back
                self.awaiting.discard(eid)
        log.info("cycle", full=cycle.full, considered=cycle.considered, decisions=len(cycle.decisions))

    # -- commands ------------------------------------------------------------------------------
    async def submit(self, req: SubmitRequest) -> dict[str, Any]:
        if not await self._caught_up():
            raise CommandRefused("the scheduler is still reading its log; try again in a moment")
        job_id = req.id or new_job_id(req.name, req.team)
        event = submitted(self.state, req, job_id, time.time())  # InvalidName: refused, naming the field
        refused = critical_block(
            self.state, event.spec.team, job_pool(event.spec, self.state.team_pools), event.spec.priority
        )
        if refused is not None:
            raise CommandRefused(refused, field="priority")
        assert self.ctx is not None
        await self.ctx.publisher.publish(event, id=stable_id("submitted", job_id))
        evolve(self.state, event)  # so `queue` right after `submit` shows it; the echo is a no-op
        answer: dict[str, Any] = {"id": job_id, "job_id": job_id}
        warnings = size_warnings(self.state, event.spec)
        if warnings:
            answer["warnings"] = warnings
        return answer

    async def _caught_up(self, within_s: float = 3.0) -> bool:
        """A submit is checked against the quotas and jobs in the log: wait (briefly) until they are read."""
        assert self.ctx is not None
        deadline = time.monotonic() + within_s
        while not self.ready:
            self.ready = await caught_up(self.ctx.js, self.ctx.consumers)
            if self.ready or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        return self.ready

    async def cancel(self, req: CancelRequest) -> dict[str, Any]:
        name = req.job or req.job_id
        if not name:
            raise CommandRefused("which job? give its id", field="job")
        job = self.state.jobs.get(name)
        if job is None:
            raise CommandRefused(f"no job {name!r}; `chamber queue` lists the jobs", field="job")
        if job.state in FINISHED:
            raise CommandRefused(f"job {name} is already {job.state.value}", field="job")
        event = JobCancelled(job_id=job.id, at=time.time(), by=req.by, reason=req.reason)
        assert self.ctx is not None
        await self.ctx.publisher.publish(event, id=stable_id("cancelled", job.id))
        evolve(self.state, event)
        return {"id": job.id, "state": "cancelled"}

    def _refresh_waiting(self) -> None:
        """A standby runs no cycles, so its why-waiting answers would be stale: a dry cycle (the
        core rolls its scratch work back; nothing is published) says what the leader's would."""
        if not self.leading and self.ready:
            self.waiting = dict(schedule(self.state, time.time(), None, policy=self.policy).waiting)

    async def queue(self, req: QueueRequest) -> dict[str, Any]:
        self._refresh_waiting()
        waiting = {k: v for k, v in self.waiting.items() if k in self.state.jobs and self.state.jobs[k].state in QUEUED}
        self.waiting = waiting
        rows = queue_rows(self.state, waiting, include_finished=req.all)
        return page_of_rows(rows, offset=req.offset, limit=req.limit)

    async def explain(self, req: ExplainRequest) -> dict[str, Any]:
        self._refresh_waiting()
        found = explain(self.state, req.job, self.waiting, now=time.time(), policy=self.policy)
        if found is None:
            raise CommandRefused(f"no job {req.job!r}; `chamber queue --all` lists the jobs", field="job")
        return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_option(parser)
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        default=os.environ.get("CHAMBER_SCHEDULER_KUBERNETES", "").strip().lower() in ("1", "true", "yes"),
        help="admit and suspend Kubernetes workloads labeled chamber.io/team or kueue.x-k8s.io/queue-name in this "
        "--cluster (in-cluster or kubeconfig; default $CHAMBER_SCHEDULER_KUBERNETES, which the chart sets)",
    )
    parser.add_argument(
        "--bindings",
        default=os.environ.get("CHAMBER_KUBE_BINDINGS") or None,
        metavar="FILE",
        help="namespace -> team bindings and Kueue names (YAML; default $CHAMBER_KUBE_BINDINGS; none: any "
        "namespace may charge any team)",
    )
    parser.add_argument("--kubernetes-interval", type=float, default=2.0, help="seconds between reconciliations")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between cycles (default 0.5)")
    parser.add_argument(
        "--full-every", type=float, default=30.0, help="seconds between full cycles when nothing changed (default 30)"
    )
    parser.add_argument(
        "--topology-key",
        default=DEFAULT_TOPOLOGY_KEY,
        help=f"node label naming a topology domain that gangs keep within (default {DEFAULT_TOPOLOGY_KEY})",
    )
    parser.add_argument(
        "--preemption-searches",
        type=int,
        default=PREEMPTION_SEARCHES,
        help=f"victim searches per cycle at most (default {PREEMPTION_SEARCHES})",
    )
    add_policy_arguments(parser)
    parser.add_argument(
        "--leader-lease",
        default=os.environ.get(ENV_NAME, ""),
        help=f"NATS KV lease name shared by replicas: one leads, the others stand by (default ${ENV_NAME}; "
        "empty: always lead)",
    )
    parser.add_argument(
        "--leader-lease-ttl",
        type=float,
        default=float(os.environ.get(ENV_TTL) or 15.0),
        help=f"seconds a lease lives without renewal (default ${ENV_TTL} or 15)",
    )


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    scheduler = Scheduler(args)
    # Bad bindings or no cluster: said at start, before anything connects.
    actuator = KubernetesActuator(scheduler, args.cluster, args.bindings) if args.kubernetes else None

    async def setup(ctx: ServiceContext) -> None:
        scheduler.ctx = ctx
        if args.leader_lease.strip():
            # Unique per process (two replicas may share a host), readable in logs and the KV entry.
            holder = f"{os.environ.get('POD_NAME') or socket.gethostname()}:{os.getpid()}"
            lease = LeaderLease(ctx.js, args.leader_lease.strip(), holder, ttl_s=args.leader_lease_ttl)
            scheduler.lease = lease
            ctx.task(lambda: lease.run(ctx.stop))
        for stream in ("FLEET", "QUOTA", "JOBS", "BILLING"):  # BILLING: BudgetExceeded (budgets act)
            ctx.consume(ConsumerOptions(stream=stream, durable=None), handler=scheduler.on_event)
        ctx.command("submit", SubmitRequest, scheduler.submit)
        ctx.command("cancel", CancelRequest, scheduler.cancel)
        ctx.command("queue", QueueRequest, scheduler.queue)
        ctx.command("explain", ExplainRequest, scheduler.explain)
        ctx.every(args.interval, scheduler.tick)
        if actuator is not None:
            ctx.every(args.kubernetes_interval, actuator.tick)

    await serve(NAME, args.nats, setup, stop)
