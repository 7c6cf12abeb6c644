"""`chamber service scheduler`: the shell around the scheduler core.

A manifest for the decider host (`services/runtime/decider.py`): inputs FLEET, QUOTA, JOBS and
BILLING (BudgetExceeded: budgets act), the core's `evolve`, and a cycle every `--interval` seconds as
`decide`. The host restores the latest snapshot, folds the tail in one deterministic order, decides
only when caught up, publishes the decisions (deterministic ids) and folds them when they come back
from the log, never before. Finished jobs leave memory as they finish (`--retention-hours`).
Commands: submit (refused by the stream for an id it has seen: expected subject sequence 0), cancel,
queue, explain.

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
import hashlib
import os
import re
import secrets
import time
from typing import Any

from nats.js.errors import NotFoundError

from events import Event, JobCancelled, subjects
from events.codec import decode, stable_id
from events.commands import CancelJob, ExplainJob, ListQueue, SubmitJob
from services.runtime.commands import CommandRefused, page_of_rows
from services.runtime.decider import CommandConflict, Decider, DeciderHost, Input, SnapshotCodec, pickle_codec
from services.runtime.host import ServiceContext, serve
from services.runtime.lease import ENV_NAME, ENV_TTL
from services.runtime.logs import get_logger
from services.runtime.manifest import Manifest
from services.runtime.options import add_cluster_option
from services.scheduler.actuator import KubernetesActuator
from services.scheduler.core import (
    FINISHED,
    QUEUED,
    CycleMark,
    Job,
    Node,
    SchedulerState,
    events_for,
    evolve,
    explain,
    queue_rows,
    schedule,
)
from services.scheduler.core.cycle import PREEMPTION_SEARCHES
from services.scheduler.core.door import cannot_run, submitted
from services.scheduler.core.explain import explain_finished
from services.scheduler.core.links import DEFAULT_FAULT_MEMORY_S, KEEP_S, LinkHealth
from services.scheduler.core.pools import job_pool
from services.scheduler.core.quota import critical_block
from services.scheduler.core.state import DEFAULT_TOPOLOGY_KEY
from services.scheduler.jobref import JobRefError, resolve
from services.scheduler.policy_options import add_policy_arguments, policy_from_args
from services.scheduler.replay import mark_record

NAME = "scheduler"
DESCRIPTION = "queue, place, preempt and resume jobs within team quotas"
log = get_logger("chamber.scheduler")
DEFAULT_RETENTION_H = 0.0  # finished jobs leave memory as they finish (core/state.py: retention_s)

ROLE = Manifest(
    reads=("FLEET", "QUOTA", "JOBS", "BILLING", "FAULTS"),
    publishes=("chamber.jobs.>",),
    snapshots=True,
    leases=True,
    why="owns the job lifecycle (JOBS); replicas share a leader lease",
)


# The request types are shared with the gateway and the API documents (events/commands.py).
SubmitRequest = SubmitJob
CancelRequest = CancelJob
QueueRequest = ListQueue
ExplainRequest = ExplainJob


_SLUG = re.compile(r"[^a-z0-9-]+")


def request_job_id(team: str, request_id: str) -> str:
    """The job id of a submit that carries a client request id: the same for every retry of it."""
    digest = hashlib.sha256(f"{team}\n{request_id}".encode()).hexdigest()[:12]
    return f"req-{digest}"


def new_job_id(name: str, team: str) -> str:
    base = _SLUG.sub("-", (name or team).lower()).strip("-")[:40] or "job"
    return f"{base}-{secrets.token_hex(4)}"


def snapshot_codec() -> SnapshotCodec[SchedulerState]:
    """Pickle (the state shares objects between its indexes), named by the core's STATE_VERSION."""
    from services.scheduler.core.snapshot_version import STATE_VERSION

    return pickle_codec(SchedulerState, Job, Node, LinkHealth, version=STATE_VERSION)


class Scheduler:
    def __init__(self, args: argparse.Namespace) -> None:
        self.topology_key = args.topology_key
        self.retention_s = max(0.0, getattr(args, "retention_hours", DEFAULT_RETENTION_H)) * 3600.0
        self.interval = args.interval
        self.full_every = args.full_every
        self.policy = policy_from_args(
            args,
            preemption_searches=args.preemption_searches,
            avoid_degraded_links=getattr(args, "avoid_degraded_links", True),
            link_fault_memory_s=getattr(args, "link_fault_memory", DEFAULT_FAULT_MEMORY_S),
        )
        self.mark: CycleMark | None = None
        self.lead_epoch = 0
        self.last_full = 0.0
        self.waiting: dict[str, str] = {}
        self.host: DeciderHost[SchedulerState] | None = None
        self.lease_name = args.leader_lease.strip()
        self.lease_ttl = args.leader_lease_ttl
        self.snapshot_every_s = getattr(args, "snapshot_every", 300.0)

    def manifest(self) -> Decider[SchedulerState]:
        return Decider(
            name=NAME,
            # BILLING: BudgetExceeded, so a team's budget action applies (core/budget.py); FAULTS: NIC
            # faults, so gangs keep off degraded links (core/links.py; perf's verdicts come on JOBS)
            inputs=(Input("FLEET"), Input("QUOTA"), Input("JOBS"), Input("BILLING"), Input("FAULTS")),
            initial=lambda: SchedulerState(topology_key=self.topology_key, retention_s=self.retention_s),
            evolve=evolve,
            decide=self.decide,
            tick_s=self.interval,
            snapshot=snapshot_codec(),
            snapshot_every_s=self.snapshot_every_s,
            lease=self.lease_name,
            lease_ttl_s=self.lease_ttl,
        )

    @property
    def state(self) -> SchedulerState:
        assert self.host is not None
        return self.host.state

    @property
    def ready(self) -> bool:
        return self.host is not None and self.host.ready

    @property
    def synced(self) -> bool:
        return self.host is not None and self.host.synced

    @property
    def leading(self) -> bool:
        return self.host is None or self.host.leading

    def decide(self, state: SchedulerState, now: float) -> list[tuple[Event, str]]:
        """One cycle (incremental unless capacity or rules changed, or `full_every` passed)."""
        epoch = self.host.lead_epoch if self.host is not None else 0
        if epoch != self.lead_epoch:  # leading anew: the last mark may predate what others decided
            self.mark, self.lead_epoch = None, epoch
        since = self.mark if now - self.last_full < self.full_every else None
        cycle = schedule(state, now, since, policy=self.policy)
        self.mark = cycle.mark
        if cycle.full:
            self.last_full = now
        self.waiting.update(cycle.waiting)
        if cycle.decisions:
            # What `chamber scheduler replay` re-runs this cycle from: the positions folded (the host
            # decides right after reading them), the time, and the mark the cycle started from.
            positions = dict(self.host.positions) if self.host is not None else {}
            log.info(
                "cycle",
                positions=positions,
                at=now,
                since=mark_record(since),
                full=cycle.full,
                considered=cycle.considered,
                decisions=len(cycle.decisions),
            )
        return events_for(cycle.decisions, now)

    # -- commands ------------------------------------------------------------------------------
    async def submit(self, req: SubmitRequest) -> dict[str, Any]:
        if not await self._caught_up():
            raise CommandRefused("the scheduler is still reading its log; try again in a moment")
        job_id = req.id or (
            request_job_id(req.team, req.request_id) if req.request_id else new_job_id(req.name, req.team)
        )
        if req.request_id and job_id in self.state.jobs and await self._submitted_by(job_id, req):
            return {"id": job_id, "job_id": job_id, "duplicate": True}  # a retry: applied once
        event = submitted(self.state, req, job_id, time.time())  # InvalidName: refused, naming the field
        impossible = cannot_run(self.state, event.spec)
        if impossible and not req.allow_wait:
            raise CommandRefused(
                "the job cannot run on this fleet: "
                + "; ".join(impossible)
                + ". Change the request, or submit with --allow-wait (allow_wait) to keep it waiting until it can",
                field="gpu_model" if impossible[0].startswith("no GPU") else "gpus",
            )
        refused = critical_block(
            self.state, event.spec.team, job_pool(event.spec, self.state.team_pools), event.spec.priority
        )
        if refused is not None:
            raise CommandRefused(refused, field="priority")
        assert self.host is not None
        try:
            # Expected subject sequence 0: the stream itself refuses a second job with this id, even
            # from another replica or after the first one left memory (retention).
            await self.host.append(event, id=stable_id("submitted", job_id), expected_subject_seq=0)
        except CommandConflict:
            if req.request_id and await self._submitted_by(job_id, req):
                return {"id": job_id, "job_id": job_id, "duplicate": True}  # a retry: applied once
            raise CommandRefused(f"job {job_id} exists already; pick another id", field="id") from None
        answer: dict[str, Any] = {"id": job_id, "job_id": job_id}
        if impossible:
            answer["warnings"] = [f"it cannot run until this changes: {why}" for why in impossible]
        return answer

    async def _submitted_by(self, job_id: str, req: SubmitRequest, within_s: float = 3.0) -> bool:
        """Is `job_id` the job this very request (same request id, same team) submitted before?
        Its event may still be on its way to our fold: wait for it briefly."""
        deadline = time.monotonic() + within_s
        while job_id not in self.state.jobs and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        job = self.state.jobs.get(job_id)
        return (
            job is not None
            and job.spec.team == req.team
            and job_id == (req.id or request_job_id(req.team, req.request_id or ""))
        )

    async def _caught_up(self, within_s: float = 3.0) -> bool:
        """A submit is checked against the quotas and jobs in the log: wait (briefly) until they are read."""
        deadline = time.monotonic() + within_s
        while not self.ready and time.monotonic() < deadline:  # noqa: ASYNC110 (the host has no event for it)
            await asyncio.sleep(0.05)
        return self.ready

    async def cancel(self, req: CancelRequest) -> dict[str, Any]:
        name = req.job or req.job_id
        if not name:
            raise CommandRefused("which job? give its id", field="job")
        try:  # an id, an exact name or a unique id prefix
            job_id, unknown = resolve(name, ((j.id, j.spec.name) for j in self.state.jobs.values())), ""
        except JobRefError as exc:
            if not str(exc).startswith("no job"):
                raise CommandRefused(str(exc), field="job") from None
            job_id, unknown = name, str(exc)  # perhaps just submitted: the entity's sequence says below
        assert self.host is not None
        try:
            # the job's latest event, folded: checked below, then expected by the stream on append
            seq = await self.host.entity_seq("JOBS", subjects.jobs(job_id))
        except CommandConflict as exc:
            raise CommandRefused(str(exc), field="job") from None
        job = self.state.jobs.get(job_id)
        if job is None:
            ended = await self._explain_from_log(name) if self.state.forgotten else None
            if ended is not None:  # finished, and it has left memory since
                raise CommandRefused(f"job {name} is already {ended['state']}", field="job")
            raise CommandRefused(f"{unknown or f'no job {name!r}'}; `chamber queue` lists the jobs", field="job")
        if job.state in FINISHED:
            raise CommandRefused(f"job {name} is already {job.state.value}", field="job")
        event = JobCancelled(job_id=job.id, at=time.time(), by=req.by, reason=req.reason)
        try:
            # Of two cancels at once (two operators, two replicas) the stream takes one; the other,
            # or a cancel racing the job's own next event, is refused and says why.
            await self.host.append(event, id=stable_id("cancelled", job.id), expected_subject_seq=seq)
        except CommandConflict:
            raise CommandRefused(
                f"job {job.id} changed while this cancel was on its way (cancelled by another command?); "
                "`chamber queue` shows it now",
                field="job",
            ) from None
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
        rows = queue_rows(self.state, waiting, now=time.time(), policy=self.policy, include_finished=req.all)
        return page_of_rows(rows, offset=req.offset, limit=req.limit)

    async def explain(self, req: ExplainRequest) -> dict[str, Any]:
        self._refresh_waiting()
        state = self.state
        try:
            job_id = resolve(req.job, ((j.id, j.spec.name) for j in state.jobs.values()))
        except JobRefError as exc:
            if not str(exc).startswith("no job"):
                raise CommandRefused(f"{exc}; `chamber queue --all` lists the jobs", field="job") from None
            # finished and gone from memory: its first and last events are in the log
            found = await self._explain_from_log(req.job) if state.forgotten else None
            if found is None:
                raise CommandRefused(f"{exc}; `chamber queue --all` lists the jobs", field="job") from None
            return found
        found = explain(state, job_id, self.waiting, now=time.time(), policy=self.policy)
        assert found is not None
        return found

    async def _explain_from_log(self, job_id: str) -> dict[str, Any] | None:
        """A finished job has left memory (core/state.py, `retention_s`): its first and last events on
        its JOBS subject say what it was and how it ended; the warehouse has the rest."""
        assert self.host is not None
        js, subject = self.host.ctx.js, subjects.jobs(job_id)
        try:
            first = await js.get_msg("JOBS", seq=1, subject=subject, next=True)
            last = await js.get_last_msg("JOBS", subject)
        except NotFoundError:
            return None
        submitted_event = decode(first.headers, first.data or b"").event
        ended = decode(last.headers, last.data or b"").event
        return explain_finished(job_id, submitted_event, ended)


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
        "--no-avoid-degraded-links",
        dest="avoid_degraded_links",
        action="store_false",
        help="place multi-node gangs without regard to degraded NICs and congested leaves (default: keep off "
        "them while anything else fits)",
    )
    parser.add_argument(
        "--link-fault-memory",
        type=_link_memory,
        default=DEFAULT_FAULT_MEMORY_S,
        metavar="SECONDS",
        help=f"a NIC fault keeps its node off new gangs this long (default {DEFAULT_FAULT_MEMORY_S:g})",
    )
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
    parser.add_argument(
        "--retention-hours",
        type=float,
        default=DEFAULT_RETENTION_H,
        help="finished jobs leave memory this long after they finish (default 0: as they finish; a "
        "Kubernetes workload's job stays 6 h); `chamber explain` of one reads the log, the warehouse keeps them",
    )
    parser.add_argument(
        "--snapshot-every", type=float, default=300.0, help="seconds between state snapshots (default 300)"
    )


def _link_memory(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= KEEP_S:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {KEEP_S:g} seconds")
    return value


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    scheduler = Scheduler(args)
    # Bad bindings or no cluster: said at start, before anything connects.
    actuator = KubernetesActuator(scheduler, args.cluster, args.bindings) if args.kubernetes else None

    async def setup(ctx: ServiceContext) -> None:
        scheduler.host = DeciderHost(scheduler.manifest(), ctx)
        scheduler.host.install()
        ctx.command("submit", SubmitRequest, scheduler.submit)
        ctx.command("cancel", CancelRequest, scheduler.cancel)
        ctx.command("queue", QueueRequest, scheduler.queue)
        ctx.command("explain", ExplainRequest, scheduler.explain)
        if actuator is not None:
            ctx.every(args.kubernetes_interval, actuator.tick)

    await serve(NAME, args.nats, setup, stop)
