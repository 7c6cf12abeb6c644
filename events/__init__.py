"""Chamber's shared language: event types, subjects, streams, and the wire codec."""

from events.base import Event, event_type
from events.billing import BudgetExceeded, CostAccrued, PriceSet
from events.catalog import ALL_EVENTS, by_type
from events.codec import DecodeError, Envelope, UnknownEventType, decode, encode
from events.faults import FaultKind, GpuFaultDetected, Severity
from events.fleet import (
    GpuIsolated,
    GpuRestored,
    NodeDiscovered,
    NodeIsolated,
    NodeLost,
    NodeRestored,
    NodeStatus,
    NodeUpdated,
)
from events.jobs import (
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobSuspended,
    Placement,
    PreemptionReason,
    PriorityClass,
)
from events.quota import BudgetSet, FairShareUpdated, PoolDefined, TeamQuotaSet
from events.streams import STREAMS, StreamSpec
from events.subjects import subject_for
from events.telemetry import (
    GpuInfo,
    GpuSample,
    NodeInventory,
    NodeSample,
    NvLinkCounters,
    ProcessInfo,
    RowRemapState,
)

__all__ = [
    "ALL_EVENTS",
    "STREAMS",
    "BudgetExceeded",
    "BudgetSet",
    "CostAccrued",
    "DecodeError",
    "Envelope",
    "Event",
    "FairShareUpdated",
    "FaultKind",
    "GpuFaultDetected",
    "GpuInfo",
    "GpuIsolated",
    "GpuRestored",
    "GpuSample",
    "JobCancelled",
    "JobCompleted",
    "JobFailed",
    "JobPreempted",
    "JobRequeued",
    "JobResumed",
    "JobScheduled",
    "JobSpec",
    "JobStarted",
    "JobSubmitted",
    "JobSuspended",
    "NodeDiscovered",
    "NodeInventory",
    "NodeIsolated",
    "NodeLost",
    "NodeRestored",
    "NodeSample",
    "NodeStatus",
    "NodeUpdated",
    "NvLinkCounters",
    "Placement",
    "PoolDefined",
    "PreemptionReason",
    "PriceSet",
    "PriorityClass",
    "ProcessInfo",
    "RowRemapState",
    "Severity",
    "StreamSpec",
    "TeamQuotaSet",
    "UnknownEventType",
    "by_type",
    "decode",
    "encode",
    "event_type",
    "subject_for",
]
