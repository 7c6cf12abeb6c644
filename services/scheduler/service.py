"""`chamber service scheduler`: the shell around the scheduler core.

A manifest for the decider host (`services/runtime/decider.py`): inputs FLEET, QUOTA and JOBS, the
core's `evolve`, and a cycle every `--interval` seconds as `decide`. The host restores the latest
snapshot, folds the tail in one deterministic order, decides only when caught up, publishes the
decisions (deterministic ids) and folds them when they come back from the log, never before. Finished
jobs leave memory `--retention-hours` after they finish. Commands: submit (refused by the stream for
an id it has seen: expected subject sequence 0), cancel, queue, explain.

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
import os
import re
import secrets
import time
from typing import Annotated, Any

import msgspec

from events import Event, JobCancelled, JobSpec, JobSubmitted, PriorityClass
from events.codec import stable_id
from services.runtime.commands import CommandRefused
from services.runtime.decider import CommandConflict, Decider, DeciderHost, Input, SnapshotCodec, pickle_codec
from services.runtime.host import ServiceContext, serve
from services.runtime.lease import ENV_NAME, ENV_TTL
from services.runtime.logs import get_logger
from services.runtime.options import add_cluster_option
from services.scheduler.core import (
    FINISHED,
    QUEUED,
    CycleMark,
    Job,
    Node,
    Policy,
    SchedulerState,
    events_for,
    evolve,
    explain,
    queue_rows,
    schedule,
)
from services.scheduler.core.cycle import PREEMPTION_SEARCHES
from services.scheduler.core.state import DEFAULT_TOPOLOGY_KEY
from services.scheduler.kubernetes import KubernetesJobs, reconcile

NAME = "scheduler"
DESCRIPTION = "queue, place, preempt and resume jobs within team quotas"
log = get_logger("chamber.scheduler")
DEFAULT_RETENTION_H = 6.0


class SubmitRequest(msgspec.Struct, kw_only=True):
    """`gpus` is per replica; `gpus_per_replica` (JobSpec's name, used by HTTP clients) is an alias."""

    team: str
    gpus: Annotated[int, msgspec.Meta(ge=1)] | None = None
    gpus_per_replica: Annotated[int, msgspec.Meta(ge=1)] | None = None
    replicas: Annotated[int, msgspec.Meta(ge=1)] = 1
    priority: PriorityClass = PriorityClass.NORMAL
    name: str = ""
    id: str | None = None
    pool: str | None = None
    cluster: str | None = None
    gpu_model: str | None = None
    preemptible: bool = True
    checkpoint_interval_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    expected_duration_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    sim_duration_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    topology_key: str | None = None


class CancelRequest(msgspec.Struct, kw_only=True):
    job: str | None = None
    job_id: str | None = None  # alias of `job`
    by: str = ""
    reason: str = ""


class QueueRequest(msgspec.Struct, kw_only=True):
    all: bool = False


class ExplainRequest(msgspec.Struct, kw_only=True):
    job: str


_SLUG = re.compile(r"[^a-z0-9-]+")


def new_job_id(name: str, team: str) -> str:
    base = _SLUG.sub("-", (name or team).lower()).strip("-")[:40] or "job"
    return f"{base}-{secrets.token_hex(4)}"


def snapshot_codec() -> SnapshotCodec[SchedulerState]:
    return pickle_codec(SchedulerState, Job, Node)


class Scheduler:
    def __init__(self, args: argparse.Namespace) -> None:
        self.topology_key = args.topology_key
        self.retention_s = getattr(args, "retention_hours", DEFAULT_RETENTION_H) * 3600.0 or None
        self.interval = args.interval
        self.full_every = args.full_every
        self.policy = Policy(preemption_searches=args.preemption_searches)
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
            inputs=(Input("FLEET"), Input("QUOTA"), Input("JOBS")),
            initial=lambda: SchedulerState(topology_key=self.topology_key, retention_s=self.retention_s),
            evolve=evolve,  # type: ignore[arg-type]
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
            log.info("cycle", full=cycle.full, considered=cycle.considered, decisions=len(cycle.decisions))
        return events_for(cycle.decisions, now)

    # -- commands ------------------------------------------------------------------------------
    async def submit(self, req: SubmitRequest) -> dict[str, Any]:
        if not req.team.strip() or req.team.startswith("_"):
            raise CommandRefused("team must be a name that does not start with '_'; pass --team T", field="team")
        if req.gpus is not None and req.gpus_per_replica is not None and req.gpus != req.gpus_per_replica:
            raise CommandRefused("gpus and gpus_per_replica differ; give one of them", field="gpus")
        gpus = req.gpus if req.gpus is not None else req.gpus_per_replica
        if gpus is None:
            raise CommandRefused("how many GPUs per replica? pass --gpus N (N >= 1)", field="gpus")
        job_id = req.id or new_job_id(req.name, req.team)
        if job_id in self.state.jobs:
            raise CommandRefused(f"job {job_id} exists already; pick another id", field="id")
        spec = JobSpec(
            team=req.team,
            gpus_per_replica=gpus,
            replicas=req.replicas,
            priority=req.priority,
            name=req.name,
            pool=req.pool,
            cluster=req.cluster,
            gpu_model=req.gpu_model,
            preemptible=req.preemptible,
            checkpoint_interval_s=req.checkpoint_interval_s,
            expected_duration_s=req.expected_duration_s,
            sim_duration_s=req.sim_duration_s,
            topology_key=req.topology_key,
        )
        event = JobSubmitted(job_id=job_id, at=time.time(), spec=spec)
        assert self.host is not None
        try:
            # Expected subject sequence 0: the stream itself refuses a second job with this id, even
            # from another replica or after the first one left memory (retention).
            await self.host.append(event, id=stable_id("submitted", job_id), expected_subject_seq=0)
        except CommandConflict:
            raise CommandRefused(f"job {job_id} exists already; pick another id", field="id") from None
        return {"id": job_id, "job_id": job_id}

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
        assert self.host is not None
        await self.host.append(event, id=stable_id("cancelled", job.id), expected_subject_seq=None)
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
        return {"jobs": queue_rows(self.state, waiting, include_finished=req.all)}

    async def explain(self, req: ExplainRequest) -> dict[str, Any]:
        self._refresh_waiting()
        found = explain(self.state, req.job, self.waiting)
        if found is None:
            state = self.state
            if state.forgotten and state.retention_s is not None:
                raise CommandRefused(
                    f"no job {req.job!r} among the scheduler's jobs; finished jobs leave its memory "
                    f"{state.retention_s / 3600:g} h after they finish ({state.forgotten} so far), so an older "
                    f'one is in the warehouse: chamber sql "SELECT kind, at, pool FROM job_events '
                    f"WHERE job_id = '{req.job}' ORDER BY at\"",
                    field="job",
                )
            raise CommandRefused(f"no job {req.job!r}; `chamber queue --all` lists the jobs", field="job")
        return found


class KubernetesActuator:
    """Level-triggered reconciliation of this cluster's labeled Jobs with the scheduler's state."""

    def __init__(self, scheduler: Scheduler, cluster: str) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self.jobs = KubernetesJobs(client.BatchV1Api())
        self.scheduler = scheduler
        self.cluster = cluster

    async def tick(self, now: float) -> None:
        sched = self.scheduler
        if sched.host is None or not sched.ready or not sched.synced:
            return
        listed = await asyncio.to_thread(self.jobs.list)
        events, actions = reconcile(sched.state, listed, self.cluster, now)
        for event, event_id in events:
            await sched.host.ctx.publisher.publish(event, id=event_id)
        for action in actions:
            await asyncio.to_thread(self.jobs.act, action)
            log.info(
                "kubernetes job updated", action=type(action).__name__, namespace=action.namespace, job=action.name
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_option(parser)
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        help="admit and suspend Kubernetes Jobs labeled chamber.io/team in this --cluster (in-cluster or kubeconfig)",
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
        help=f"finished jobs leave memory this long after they finish; the warehouse keeps them "
        f"(default {DEFAULT_RETENTION_H:g}; 0: keep all)",
    )
    parser.add_argument(
        "--snapshot-every", type=float, default=300.0, help="seconds between state snapshots (default 300)"
    )


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    scheduler = Scheduler(args)

    async def setup(ctx: ServiceContext) -> None:
        scheduler.host = DeciderHost(scheduler.manifest(), ctx)
        scheduler.host.install()
        ctx.command("submit", SubmitRequest, scheduler.submit)
        ctx.command("cancel", CancelRequest, scheduler.cancel)
        ctx.command("queue", QueueRequest, scheduler.queue)
        ctx.command("explain", ExplainRequest, scheduler.explain)
        if args.kubernetes:
            ctx.every(args.kubernetes_interval, KubernetesActuator(scheduler, args.cluster).tick)

    await serve(NAME, args.nats, setup, stop)
