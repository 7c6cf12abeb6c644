"""Channels: subject patterns, their stream and the event types on them (for AsyncAPI and tests)."""

from __future__ import annotations

from dataclasses import dataclass

from events import billing, fabric, faults, fleet, jobs, quota, telemetry
from events.base import Event
from events.streams import BILLING, DEAD, FAULTS, FLEET, JOBS, QUOTA, TELEMETRY, StreamSpec


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
        "One sample of all GPUs of a node per interval.",
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
        "Nodes and GPUs discovered, updated, lost, isolated (or held, confirmed, dismissed) and restored.",
        (
            fleet.NodeDiscovered,
            fleet.NodeUpdated,
            fleet.NodeLost,
            fleet.NodeIsolated,
            fleet.NodeRestored,
            fleet.GpuIsolated,
            fleet.GpuRestored,
            fleet.IsolationHeld,
            fleet.IsolationDismissed,
        ),
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
        ),
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
        (quota.PoolDefined, quota.TeamQuotaSet, quota.FairShareUpdated, quota.BudgetSet),
        (("team", "team token, or _fleet"),),
    ),
    Channel(
        "billing",
        "chamber.billing.{team}",
        BILLING,
        "Prices, accrued cost and budgets exceeded (`_fleet` for prices and idle cost).",
        (billing.PriceSet, billing.CostAccrued, billing.BudgetExceeded),
        (("team", "team token, or _fleet"),),
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
