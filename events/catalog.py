"""Every event type Chamber publishes, looked up by CloudEvents type."""

from __future__ import annotations

from events.base import Event
from events.billing import BudgetExceeded, CostAccrued, PriceSet, ServingTokensReported
from events.dispatch import (
    ClusterHeartbeat,
    CopyRecalled,
    CopyReported,
    WorkloadDispatched,
    WorkloadOffered,
    WorkloadWithdrawn,
)
from events.fabric import FabricSample, JobSlowdownCleared, JobSlowdownDetected
from events.faults import GpuFaultDetected
from events.fleet import (
    FaultRecorded,
    GpuIsolated,
    GpuRestored,
    IsolationDismissed,
    IsolationExtended,
    IsolationHeld,
    MigChangeAbandoned,
    MigLayoutApplied,
    MigLayoutPlanned,
    NodeDiscovered,
    NodeForgotten,
    NodeIsolated,
    NodeLost,
    NodeRestored,
    NodeUpdated,
)
from events.idle import IdlePolicySet, JobIdleDetected, JobResumeRequested
from events.jobs import (
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobStarted,
    JobSubmitted,
    JobSuspended,
)
from events.quota import BudgetSet, FairShareUpdated, PoolDefined, PoolRemoved, TeamQuotaSet
from events.steps import RankStepTimings
from events.telemetry import NodeInventory, NodeSample

ALL_EVENTS: tuple[type[Event], ...] = (
    NodeInventory,
    NodeSample,
    FabricSample,
    RankStepTimings,
    GpuFaultDetected,
    NodeDiscovered,
    NodeUpdated,
    NodeLost,
    NodeForgotten,
    NodeIsolated,
    NodeRestored,
    GpuIsolated,
    GpuRestored,
    IsolationHeld,
    IsolationDismissed,
    FaultRecorded,
    IsolationExtended,
    MigLayoutPlanned,
    MigLayoutApplied,
    MigChangeAbandoned,
    JobSubmitted,
    JobScheduled,
    JobStarted,
    JobPreempted,
    JobSuspended,
    JobResumed,
    JobRequeued,
    JobCompleted,
    JobFailed,
    JobCancelled,
    PoolDefined,
    PoolRemoved,
    TeamQuotaSet,
    FairShareUpdated,
    BudgetSet,
    PriceSet,
    CostAccrued,
    BudgetExceeded,
    ServingTokensReported,
    JobSlowdownDetected,
    JobSlowdownCleared,
    IdlePolicySet,
    JobIdleDetected,
    JobResumeRequested,
    WorkloadOffered,
    WorkloadWithdrawn,
    WorkloadDispatched,
    CopyRecalled,
    CopyReported,
    ClusterHeartbeat,
)

_BY_TYPE: dict[str, type[Event]] = {cls.ce_type(): cls for cls in ALL_EVENTS}
assert len(_BY_TYPE) == len(ALL_EVENTS), "two event classes share a type"


def by_type(ce_type: str) -> type[Event] | None:
    return _BY_TYPE.get(ce_type)


def known_types() -> frozenset[str]:
    return frozenset(_BY_TYPE)
