"""`chamber service scheduler`: the shell around the scheduler core.

A manifest for the decider host (`services/runtime/decider.py`): inputs FLEET, QUOTA, JOBS and
BILLING (BudgetExceeded: budgets act), the core's `evolve`, and a cycle every `--interval` seconds as
`decide`. The host restores the latest snapshot, folds the tail in one deterministic order, decides
only when caught up, publishes the decisions (deterministic ids) and folds them when they come back
from the log, never before. Finished jobs leave memory as they finish (`--retention-hours`).
Commands, in the manifest and served by the host: submit (the door of core/door.py, shared with
Kubernetes workloads; refused by the stream for an id it has seen: expected subject sequence 0),
cancel (carries the job's last sequence), resume (a job suspended as idle), queue, explain.

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
import functools
import hashlib
import os
import re
import secrets
from collections.abc import Callable
from typing import Any

from events import Event, JobCancelled, subjects
from events.channels import STEP_LOG_BUCKET
from events.codec import stable_id
from events.commands import AbandonMigChange, CancelJob, ExplainJob, ListQueue, ResumeJob, SubmitJob
from events.fleet import MigChangeAbandoned
from events.idle import JobResumeRequested
from services.runtime.commands import Accepted, Append, Command, CommandRefused, FromLog, page_of_rows
from services.runtime.decider import Decider, DeciderHost, Input, SnapshotCodec, pickle_codec
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
from services.scheduler.core.door import admit
from services.scheduler.core.explain import explain_finished
from services.scheduler.core.idle import held as idle_held
from services.scheduler.core.links import DEFAULT_FAULT_MEMORY_S, KEEP_S, LinkHealth
from services.scheduler.core.state import DEFAULT_TOPOLOGY_KEY, JobState
from services.scheduler.jobref import JobRefError, resolve
from services.scheduler.policy_options import add_policy_arguments, policy_from_args
from services.scheduler.replay import mark_record

NAME = "scheduler"
DESCRIPTION = "queue, place, preempt and resume jobs within team quotas"
log = get_logger("chamber.scheduler")
DEFAULT_RETENTION_H = 0.0  # finished jobs leave memory as they finish (core/state.py: retention_s)

ROLE = Manifest(
    reads=("FLEET", "QUOTA", "JOBS", "BILLING", "FAULTS"),
    publishes=("chamber.jobs.>", "chamber.fleet.*.*.mig"),  # MIG layouts planned and applied (core/mig_live.py)
    buckets=(STEP_LOG_BUCKET,),  # the step logs workloads name, per node (services/scheduler/step_logs.py)
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
            commands=self.commands(),
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

    # -- commands: the manifest's verbs (reads answer from the state and the last cycle's why-waiting) --
    def commands(self) -> tuple[Command[SchedulerState, Any], ...]:
        return (
            Command("submit", SubmitRequest, validate=functools.partial(validate_submit, new_id=new_job_id)),
            Command(
                "cancel",
                CancelRequest,
                validate=validate_cancel,
                entity=_job_subject,
                conflict=_job_changed,
                conflict_field="job",
                from_log=cancel_from_log,
            ),
            Command("resume", ResumeJob, validate=validate_resume, entity=_resume_subject, conflict_field="job"),
            Command("mig_abandon", AbandonMigChange, validate=validate_mig_abandon),
            Command("queue", QueueRequest, answer=self.answer_queue),
            Command("explain", ExplainRequest, answer=self.answer_explain, from_log=explain_from_log),
        )

    def _refresh_waiting(self, state: SchedulerState, now: float) -> None:
        """A standby runs no cycles, so its why-waiting answers would be stale: a dry cycle (the
        core rolls its scratch work back; nothing is published) says what the leader's would."""
        if not self.leading and self.ready:
            self.waiting = dict(schedule(state, now, None, policy=self.policy).waiting)

    def answer_queue(self, state: SchedulerState, req: QueueRequest, now: float) -> dict[str, Any]:
        self._refresh_waiting(state, now)
        waiting = {k: v for k, v in self.waiting.items() if k in state.jobs and state.jobs[k].state in QUEUED}
        self.waiting = waiting
        rows = queue_rows(state, waiting, now=now, policy=self.policy, include_finished=req.all)
        return page_of_rows(rows, offset=req.offset, limit=req.limit)

    def answer_explain(self, state: SchedulerState, req: ExplainRequest, now: float) -> dict[str, Any]:
        self._refresh_waiting(state, now)
        try:
            job_id = resolve(req.job, ((j.id, j.spec.name) for j in state.jobs.values()))
        except JobRefError as exc:
            unknown = f"{exc}; `chamber queue --all` lists the jobs"
            if not str(exc).startswith("no job") or not state.forgotten:
                raise CommandRefused(unknown, field="job", kind="unknown") from None
            # a name or an id prefix finds only the jobs in memory; a finished one has left it
            like = "".join(c for c in req.job[:64] if c.isalnum() or c in "-_.")  # a hint to copy, quotes out
            unknown += (
                "; a finished job is found by its full id, which the warehouse has: chamber sql "
                f"\"SELECT DISTINCT job_id FROM events WHERE job_id LIKE '{like}%'\""
            )
            raise FromLog("JOBS", subjects.jobs(req.job), unknown, "job") from None  # finished, gone from memory
        found = explain(state, job_id, self.waiting, now=now, policy=self.policy)
        assert found is not None
        return found


# -- changes: pure validations, served by the host (services/runtime/command_path.py) -------------


def validate_submit(
    state: SchedulerState, req: SubmitRequest, now: float, *, new_id: Callable[[str, str], str]
) -> Accepted:
    """The door (core/door.py `admit`, the same for Kubernetes workloads), then an append the stream
    refuses for an id it has seen (expected subject sequence 0), even from another replica or after
    the first job left memory. A retry carrying the same request id is applied once."""
    job_id = req.id or (request_job_id(req.team, req.request_id) if req.request_id else new_id(req.name, req.team))
    duplicate = {"id": job_id, "job_id": job_id, "duplicate": True}
    known = state.jobs.get(job_id)
    if req.request_id and known is not None and known.spec.team == req.team:
        return Accepted((), duplicate)  # a retry: applied once
    event, impossible = admit(state, req, job_id, now)  # InvalidName: refused, naming the field
    answer: dict[str, Any] = {"id": job_id, "job_id": job_id}
    if impossible:
        answer["warnings"] = [f"it cannot run until this changes: {why}" for why in impossible]
    exists = f"job {job_id} exists already; pick another id"
    append = Append(event, stable_id("submitted", job_id), expected_seq=0, conflict=exists, field="id")
    return Accepted((append,), answer, if_conflict=duplicate if req.request_id else None)


def _job_named(state: SchedulerState, name: str) -> tuple[str, str]:
    """(job id, why unknown): an id, an exact name or a unique id prefix; an unknown one is taken
    as an id (perhaps just submitted: the host folds the job's subject before validating)."""
    try:
        return resolve(name, ((j.id, j.spec.name) for j in state.jobs.values())), ""
    except JobRefError as exc:
        if not str(exc).startswith("no job"):
            raise CommandRefused(str(exc), field="job") from None
        return name, str(exc)


def _job_subject(state: SchedulerState, req: CancelRequest) -> tuple[str, str] | None:
    name = req.job or req.job_id
    if not name:
        return None
    return "JOBS", subjects.jobs(_job_named(state, name)[0])


def _job_changed(req: CancelRequest) -> str:
    return (
        f"job {req.job or req.job_id} changed while this cancel was on its way (cancelled by another command?); "
        "`chamber queue` shows it now"
    )


def validate_cancel(state: SchedulerState, req: CancelRequest, now: float) -> Accepted:
    """Of two cancels at once (two operators, two replicas) the stream takes one; the other, or a
    cancel racing the job's own next event, is refused and says why."""
    name = req.job or req.job_id
    if not name:
        raise CommandRefused("which job? give its id", field="job")
    job_id, unknown = _job_named(state, name)
    job = state.jobs.get(job_id)
    if job is None:
        unknown = f"{unknown or f'no job {name!r}'}; `chamber queue` lists the jobs"
        if state.forgotten:  # finished, perhaps, and it has left memory since: its log says
            raise FromLog("JOBS", subjects.jobs(name), unknown, "job")
        raise CommandRefused(unknown, field="job", kind="unknown")
    if job.state in FINISHED:
        raise CommandRefused(f"job {name} is already {job.state.value}", field="job")
    event = JobCancelled(job_id=job.id, at=now, by=req.by, reason=req.reason)
    append = Append(event, stable_id("cancelled", job.id), req.expected_seq)
    return Accepted((append,), {"id": job.id, "state": "cancelled"})


def _resume_subject(state: SchedulerState, req: ResumeJob) -> tuple[str, str]:
    return "JOBS", subjects.jobs(_job_named(state, req.job)[0])


def validate_resume(state: SchedulerState, req: ResumeJob, now: float) -> Accepted:
    """Only a job suspended as idle waits for this: any other suspended job resumes on its own."""
    job_id, unknown = _job_named(state, req.job)
    job = state.jobs.get(job_id)
    if job is None:
        raise CommandRefused(
            f"{unknown or f'no job {req.job!r}'}; `chamber queue` lists the jobs", field="job", kind="unknown"
        )
    if idle_held(state, job) is None:
        suspended = job.state == JobState.SUSPENDED
        why = "it resumes on its own when capacity frees" if suspended else f"it is {job.state.value}"
        raise CommandRefused(f"job {req.job} is not suspended as idle ({why})", field="job")
    event = JobResumeRequested(job_id=job.id, at=now, by=req.by)
    append = Append(event, stable_id("resume-requested", job.id, job.generation), req.expected_seq)
    return Accepted((append,), {"id": job.id, "state": "queued"})


def validate_mig_abandon(state: SchedulerState, req: AbandonMigChange, now: float) -> Accepted:
    """Only a node with a planned change not yet applied; the event's id is per planned change, so a
    repeated command is applied once."""
    node = state.nodes.get((req.cluster, req.node))
    if node is None:
        raise CommandRefused(f"no node {req.cluster}/{req.node}; `chamber fleet` lists the nodes", field="node")
    gpus = sorted(g for g, st in node.mig.items() if st.pending is not None)
    if not gpus:
        raise CommandRefused(f"node {req.cluster}/{req.node} has no MIG change pending", field="node")
    planned = max(node.mig[g].changed_at or 0.0 for g in gpus)
    event = MigChangeAbandoned(cluster=req.cluster, node=req.node, at=now, gpus=gpus, by=req.by, reason=req.reason)
    append = Append(event, stable_id("mig-abandoned", req.cluster, req.node, planned))
    return Accepted((append,), {"node": req.node, "cluster": req.cluster, "gpus": gpus, "state": "abandoned"})


def cancel_from_log(req: CancelRequest, submitted_event: Event, ended: Event) -> dict[str, Any]:
    name = req.job or req.job_id or ""
    ended_as = explain_finished(name, submitted_event, ended)["state"]
    raise CommandRefused(f"job {name} is already {ended_as}", field="job")


def explain_from_log(req: ExplainRequest, submitted_event: Event, ended: Event) -> dict[str, Any]:
    """A finished job has left memory (core/state.py, `retention_s`): its first and last events on
    its JOBS subject say what it was and how it ended; the warehouse has the rest."""
    return explain_finished(req.job, submitted_event, ended)


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
    parser.add_argument(
        "--kubernetes-cluster",
        action="append",
        default=[],
        type=_cluster_kubeconfig,
        metavar="NAME=KUBECONFIG",
        help="also admit and suspend the workloads of cluster NAME through KUBECONFIG (several clusters: "
        "the copies multi-cluster dispatch creates there; repeatable)",
    )
    parser.add_argument("--kubernetes-interval", type=float, default=2.0, help="seconds between reconciliations")
    parser.add_argument(
        "--mig-config-map",
        default=os.environ.get("CHAMBER_MIG_CONFIG_MAP") or None,
        metavar="NAMESPACE/NAME",
        help="apply the MIG layouts the scheduler plans on nodes labeled nvidia.com/mig.config through this "
        "mig-parted ConfigMap of the GPU Operator's MIG manager (default $CHAMBER_MIG_CONFIG_MAP; none: "
        "planned layouts are not applied by this scheduler)",
    )
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


def _cluster_kubeconfig(text: str) -> tuple[str, str]:
    name, eq, path = text.partition("=")
    if not eq or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=KUBECONFIG (a cluster name and its kubeconfig file)")
    return name.strip(), path.strip()


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
    mig = getattr(args, "mig_config_map", None)
    actuators = (
        [KubernetesActuator(scheduler, args.cluster, args.bindings, mig_config_map=mig)] if args.kubernetes else []
    )
    for name, kubeconfig in getattr(args, "kubernetes_cluster", []):
        actuators.append(KubernetesActuator(scheduler, name, args.bindings, kubeconfig, mig_config_map=mig))

    async def setup(ctx: ServiceContext) -> None:
        scheduler.host = DeciderHost(scheduler.manifest(), ctx)
        scheduler.host.install()
        for actuator in actuators:
            ctx.every(args.kubernetes_interval, actuator.tick)

    await serve(NAME, args.nats, setup, stop)
