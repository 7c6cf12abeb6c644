"""Channels: subject patterns, their stream and the event types on them (for AsyncAPI and tests)."""

from __future__ import annotations

from dataclasses import dataclass

from events import billing, dispatch, fabric, faults, fleet, idle, jobs, quota, steps, telemetry
from events.base import Event
from events.streams import BILLING, DEAD, DISPATCH, FAULTS, FLEET, JOBS, QUOTA, TELEMETRY, StreamSpec


@dataclass(frozen=True)
class Channel:
    id: str
    address: str  # AsyncAPI address with {parameters}
    stream: StreamSpec
    description: str
    events: tuple[type[Event], ...]
    parameters: tuple[tuple[str, str], ...]

    def pattern(self) -> str:
        """The NATS wildcard subject of this channel."""
        parts = ["*" if p.startswith("{") else p for p in self.address.split(".")]
        return ".".join(parts)


_NODE = (("cluster", "cluster name token"), ("node", "node name token"))

CHANNELS: tuple[Channel, ...] = (
    Channel(
        "telemetrySample",
        "chamber.telemetry.sample.{cluster}.{node}",
        TELEMETRY,
        "One sample of all GPUs of a node per interval. With N telemetry partitions the server's subject "
        "mapping appends the node's partition (chamber.telemetry.sample.{cluster}.{node}.{p}, stream "
        "TELEMETRY_P{p}): subscribe with chamber.telemetry.sample.> to receive every sample either way.",
        (telemetry.NodeSample,),
        _NODE,
    ),
    Channel(
        "telemetryInventory",
        "chamber.telemetry.inventory.{cluster}.{node}",
        TELEMETRY,
        "What a node has: GPUs, models, driver, labels (at start, on change, every 60 s).",
        (telemetry.NodeInventory,),
        _NODE,
    ),
    Channel(
        "telemetryFabric",
        "chamber.telemetry.fabric.{cluster}.{node}",
        TELEMETRY,
        "One sample of a node's NICs per interval (link state, rate, traffic, error/pause/flap deltas).",
        (fabric.FabricSample,),
        _NODE,
    ),
    Channel(
        "telemetrySteps",
        "chamber.telemetry.steps.{cluster}.{node}",
        TELEMETRY,
        "Per-rank step timings of the training jobs on a node (a training-loop hook or the agent tailing a "
        "job's step log): step start and end, compute and wait time, parallel coordinates.",
        (steps.RankStepTimings,),
        _NODE,
    ),
    Channel(
        "faults",
        "chamber.faults.{cluster}.{node}",
        FAULTS,
        "GPU faults detected on the node.",
        (faults.GpuFaultDetected,),
        _NODE,
    ),
    Channel(
        "fleet",
        "chamber.fleet.{cluster}.{node}",
        FLEET,
        (
            "Nodes and GPUs discovered, updated, lost, forgotten, isolated (or held, confirmed, dismissed, probation "
            "extended) and restored; faults health weighed and only recorded."
        ),
        (
            fleet.NodeDiscovered,
            fleet.NodeUpdated,
            fleet.NodeLost,
            fleet.NodeForgotten,
            fleet.NodeIsolated,
            fleet.NodeRestored,
            fleet.GpuIsolated,
            fleet.GpuRestored,
            fleet.IsolationHeld,
            fleet.IsolationDismissed,
            fleet.IsolationExtended,
            fleet.FaultRecorded,
        ),
        _NODE,
    ),
    Channel(
        "fleetMig",
        "chamber.fleet.{cluster}.{node}.mig",
        FLEET,
        "MIG layouts the scheduler planned for a node's GPUs, applied (by its Kubernetes actuator), "
        "or abandoned by an operator.",
        (fleet.MigLayoutPlanned, fleet.MigLayoutApplied, fleet.MigChangeAbandoned),
        _NODE,
    ),
    Channel(
        "jobs",
        "chamber.jobs.{job}",
        JOBS,
        "A job's lifecycle and the scheduler's decisions about it.",
        (
            jobs.JobSubmitted,
            jobs.JobScheduled,
            jobs.JobStarted,
            jobs.JobPreempted,
            jobs.JobSuspended,
            jobs.JobResumed,
            jobs.JobRequeued,
            jobs.JobCompleted,
            jobs.JobFailed,
            jobs.JobCancelled,
            idle.JobResumeRequested,
        ),
        (("job", "job id token"),),
    ),
    Channel(
        "jobIdle",
        "chamber.jobs.{job}.idle",
        JOBS,
        "Idle-reclaim verdicts: a running job held its GPUs idle for its team's threshold (notify or suspend).",
        (idle.JobIdleDetected,),
        (("job", "job id token"),),
    ),
    Channel(
        "jobPerf",
        "chamber.jobs.{job}.perf",
        JOBS,
        "The job-performance service's verdicts: a running job slowed down (and who is to blame), or recovered.",
        (fabric.JobSlowdownDetected, fabric.JobSlowdownCleared),
        (("job", "job id token"),),
    ),
    Channel(
        "quota",
        "chamber.quota.{team}",
        QUOTA,
        "Pools, team quotas, fair-share factors and budgets (`_fleet` for fleet-wide pool events).",
        (quota.PoolDefined, quota.PoolRemoved, quota.TeamQuotaSet, quota.FairShareUpdated, quota.BudgetSet),
        (("team", "team token, or _fleet"),),
    ),
    Channel(
        "quotaIdle",
        "chamber.quota.{team}.idle",
        QUOTA,
        "A team's idle-reclaim policy (off, notify or suspend, and its thresholds).",
        (idle.IdlePolicySet,),
        (("team", "team token"),),
    ),
    Channel(
        "billing",
        "chamber.billing.{team}",
        BILLING,
        "Prices, accrued cost, budgets exceeded and serving tokens (`_fleet` for prices and idle cost).",
        (billing.PriceSet, billing.CostAccrued, billing.BudgetExceeded, billing.ServingTokensReported),
        (("team", "team token, or _fleet"),),
    ),
    Channel(
        "dispatchOffer",
        "chamber.dispatch.offer.{cluster}.{workload}",
        DISPATCH,
        "Workloads a cluster's actuator offers for dispatch (their origin object stays suspended), or withdraws.",
        (dispatch.WorkloadOffered, dispatch.WorkloadWithdrawn),
        (("cluster", "origin cluster token"), ("workload", "workload id token")),
    ),
    Channel(
        "dispatchDecision",
        "chamber.dispatch.decision.{workload}",
        DISPATCH,
        "The dispatcher's decisions: the one cluster a workload runs in, and copies recalled.",
        (dispatch.WorkloadDispatched, dispatch.CopyRecalled),
        (("workload", "workload id token"),),
    ),
    Channel(
        "dispatchCopy",
        "chamber.dispatch.copy.{cluster}.{workload}",
        DISPATCH,
        "The phase of a workload's remote copy, as the actuator of the cluster holding it sees it.",
        (dispatch.CopyReported,),
        (("cluster", "cluster token"), ("workload", "workload id token")),
    ),
    Channel(
        "dispatchHeartbeat",
        "chamber.dispatch.heartbeat.{cluster}",
        DISPATCH,
        "A cluster's actuator is answering: its GPU capacity and price (the last 1000 beats are kept).",
        (dispatch.ClusterHeartbeat,),
        (("cluster", "cluster token"),),
    ),
)

DEAD_LETTER = Channel(
    "deadLetter",
    "chamber.dead.{stream}",
    DEAD,
    "Poison messages copied with their original headers, plus chamber-dead-reason and -detail.",
    (),
    (("stream", "lower-case name of the stream the message came from"),),
)


@dataclass(frozen=True)
class CommandChannel:
    """`chamber.cmd.<service>.<verb>`: core NATS request/reply, served by one queue group per service."""

    service: str
    verb: str
    description: str

    @property
    def id(self) -> str:
        return "cmd" + "".join(p.capitalize() for p in f"{self.service}_{self.verb}".split("_"))

    @property
    def address(self) -> str:
        return f"chamber.cmd.{self.service}.{self.verb}"


COMMANDS: tuple[CommandChannel, ...] = (
    CommandChannel("scheduler", "submit", "Submit a job (recorded as JobSubmitted)."),
    CommandChannel("scheduler", "cancel", "Cancel a job (recorded as JobCancelled)."),
    CommandChannel("scheduler", "queue", "Jobs in queue order with the scheduler's reasons, a page at a time."),
    CommandChannel("scheduler", "explain", "Why a job is where it is."),
    CommandChannel("quota", "set", "Replace a team's quota in a pool (recorded as TeamQuotaSet, BudgetSet)."),
    CommandChannel(
        "quota", "patch", "Change only the named settings of a team's quota (recorded as TeamQuotaSet, BudgetSet)."
    ),
    CommandChannel("quota", "pool_set", "Define a pool by GPU model or node label (recorded as PoolDefined)."),
    CommandChannel("quota", "pool_delete", "Remove a pool no quota and no node uses (recorded as PoolRemoved)."),
    CommandChannel("quota", "list", "Every quota setting, usage, borrowing and fair share per team; pools' capacity."),
    CommandChannel("health", "restore", "Restore an isolated node or GPU."),
    CommandChannel("health", "confirm", "Confirm a held isolation."),
    CommandChannel("health", "dismiss", "Dismiss a held isolation."),
    CommandChannel("health", "held", "Isolations held for an operator's decision."),
    CommandChannel("health", "policy", "The effective health policy."),
    CommandChannel("billing", "price", "Set the price of a GPU model (recorded as PriceSet)."),
    CommandChannel("billing", "prices", "The prices in force, and the fleet's GPU models without one."),
    CommandChannel("billing", "reclaimed", "GPU-hours idle reclaim gave back per team (ever, or in a month)."),
    CommandChannel("billing", "tokens", "Tokens a serving workload served (recorded as ServingTokensReported)."),
    CommandChannel("billing", "serving", "Cost per serving workload, and per million tokens where it reports them."),
    CommandChannel("recorder", "sql", "Read-only analytics SQL over the warehouse."),
    CommandChannel("perf", "status", "Running multi-node jobs with their slowdown verdicts."),
    CommandChannel("perf", "fabric", "NICs per node: state, rate, error and pause rates, flagged links."),
    CommandChannel("perf", "explain", "Why a job is slow: its slowdown episodes, culprit and evidence."),
    CommandChannel("perf", "ranks", "Per-rank activity over time of one job (the dashboard's job view)."),
    CommandChannel("perf", "idle_policy", "Set a team's idle-reclaim policy (recorded as IdlePolicySet)."),
    CommandChannel("perf", "idle", "Idle-reclaim policies per team and the jobs flagged idle."),
    CommandChannel("scheduler", "resume", "Queue again a job suspended as idle (recorded as JobResumeRequested)."),
    CommandChannel(
        "scheduler",
        "mig_abandon",
        "Give up a node's planned MIG change that did not apply (recorded as MigChangeAbandoned).",
    ),
    CommandChannel(
        "discovery", "forget", "Forget a lost node that left the fleet for good (recorded as NodeForgotten)."
    ),
    CommandChannel("sim", "inject", "Inject a fault into a simulated node (`chamber agent --simulate`)."),
)


@dataclass(frozen=True)
class KvBucket:
    """A JetStream key-value bucket: on the wire, messages on `$KV.<bucket>.<key>`."""

    bucket: str
    key: str  # the key pattern, with {parameters}
    writer: str
    description: str

    @property
    def id(self) -> str:
        return "kv" + "".join(p.capitalize() for p in self.bucket.removeprefix("chamber_").split("_"))

    @property
    def address(self) -> str:
        return f"$KV.{self.bucket}.{self.key}"


STEP_LOG_BUCKET = "chamber_step_logs"  # services/scheduler/step_logs.py writes it, agents read their node's keys

KV_BUCKETS: tuple[KvBucket, ...] = (
    KvBucket("chamber_fleet", "{cluster}.{node}", "discovery", "The current view of every node (JSON)."),
    KvBucket("chamber_quota", "{pool}.{team}", "quota", "Each team's quota row in a pool, for dashboards (JSON)."),
    KvBucket(
        "chamber_snapshots_{service}",
        "{service}",
        "each service host, its own",
        "Service state snapshots + stream positions (an object store per service).",
    ),
    KvBucket(
        "chamber_lease_{service}",
        "{lease}",
        "scheduler, recorder",
        "A service's leader leases, one key each (TTL); key `leader` for the service's own lease.",
    ),
    KvBucket("chamber_recorders", "{holder}", "recorder", "Live recorders sharing telemetry partitions (TTL)."),
    KvBucket(
        STEP_LOG_BUCKET,
        "{cluster}.{node}.{job}",
        "scheduler",
        "The step log a running Kubernetes workload names (`chamber.io/step-log`), for the agent of each of its "
        'nodes (JSON: {"job", "path", "gpu_indices"}).',
    ),
)
