"""The fleet as discovery and health see it: nodes found, changed, lost, isolated and restored."""

from __future__ import annotations

from enum import StrEnum

import msgspec

from events.base import Event, Name, event_type
from events.telemetry import GpuInfo


class NodeStatus(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"  # heartbeats missed, not yet lost
    LOST = "lost"
    NO_AGENT = "no_agent"  # seen by Kubernetes, no agent reporting


class NodeDiscovered(Event, frozen=True, tag=event_type("fleet", "node_discovered")):
    cluster: Name
    node: Name
    at: float
    gpus: list[GpuInfo]
    source: str = "agent"  # agent | kubernetes
    labels: dict[str, str] = {}
    cpu_milli: int | None = None  # the CPU work may use on the node, milli-CPUs (None: unknown)
    memory_mib: int | None = None  # the host memory work may use on the node, MiB (None: unknown)


class NodeUpdated(Event, frozen=True, tag=event_type("fleet", "node_updated")):
    cluster: Name
    node: Name
    at: float
    status: NodeStatus
    gpus: list[GpuInfo]
    changes: list[str] = []
    labels: dict[str, str] = {}
    cpu_milli: int | None = None  # as in NodeDiscovered
    memory_mib: int | None = None


class NodeLost(Event, frozen=True, tag=event_type("fleet", "node_lost")):
    cluster: Name
    node: Name
    at: float
    last_seen_at: float
    reason: str = ""


class NodeForgotten(Event, frozen=True, tag=event_type("fleet", "node_forgotten")):
    """A lost node left the fleet for good: every service drops it (its history stays in the log).
    Discovery forgets a node Kubernetes deleted once it has been lost a while (`by` is "discovery"),
    or a lost node an operator names (`chamber fleet forget NODE`: `by` is who asked). If its agent
    reports again later, it is discovered anew."""

    cluster: Name
    node: Name
    at: float
    reason: str = ""
    by: str = "discovery"  # discovery (automatic) | the operator who asked


class NodeIsolated(Event, frozen=True, tag=event_type("fleet", "node_isolated")):
    """The whole node is out of service (cordoned); its jobs are requeued by the scheduler."""

    cluster: Name
    node: Name
    at: float
    reason: str
    fault_ids: list[str] = []
    until: float | None = None  # earliest automatic restore (probation), if any


class NodeRestored(Event, frozen=True, tag=event_type("fleet", "node_restored")):
    cluster: Name
    node: Name
    at: float
    reason: str
    by: str = "probation"  # probation | operator


class GpuIsolated(Event, frozen=True, tag=event_type("fleet", "gpu_isolated")):
    """One GPU is out of service; the node keeps serving with its other GPUs."""

    cluster: Name
    node: Name
    gpu_index: int
    at: float
    reason: str
    gpu_uuid: str | None = None
    fault_ids: list[str] = []
    until: float | None = None


class GpuRestored(Event, frozen=True, tag=event_type("fleet", "gpu_restored")):
    cluster: Name
    node: Name
    gpu_index: int
    at: float
    reason: str
    gpu_uuid: str | None = None
    by: str = "probation"


class IsolationHeld(Event, frozen=True, tag=event_type("fleet", "isolation_held")):
    """An isolation the policy asked for but the isolation budget held back: too large a share of the
    fleet was isolated within the window (a storm more likely means a broken detector or a shared
    cause). It waits for `chamber health confirm NODE [--gpu I]`."""

    cluster: Name
    node: Name
    at: float
    action: str  # isolate_gpu | isolate_node
    reason: str
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    fault_ids: list[str] = []


class IsolationDismissed(Event, frozen=True, tag=event_type("fleet", "isolation_dismissed")):
    """An operator declined an isolation the budget held back (`chamber health dismiss NODE [--gpu I]`)."""

    cluster: Name
    node: Name
    at: float
    reason: str
    gpu_index: int | None = None
    by: str = "operator"
    fault_ids: list[str] = []


class FaultRecorded(Event, frozen=True, tag=event_type("fleet", "fault_recorded")):
    """Health weighed faults and took no action: the policy only records them, a later restore
    superseded them, or an isolation is already held for them. The faults are settled: a replay
    does not weigh them again (the decision is in the log, not only in memory)."""

    cluster: Name
    node: Name
    at: float  # when the deciding fault was observed
    reason: str
    gpu_index: int | None = None
    rule: str = ""  # the policy rule that matched
    fault_ids: list[str] = []


class IsolationExtended(Event, frozen=True, tag=event_type("fleet", "isolation_extended")):
    """A fault on a node or GPU already isolated: its probation restarts. `until` is the new
    earliest automatic restore (None when the isolation waits for an operator)."""

    cluster: Name
    node: Name
    at: float  # when the fault was observed
    reason: str
    gpu_index: int | None = None
    fault_ids: list[str] = []
    until: float | None = None


class MigInstance(msgspec.Struct, frozen=True, kw_only=True):
    """One MIG GPU instance: its profile ("3g.40gb") and first memory slice."""

    profile: Name
    start: int


class MigLayoutPlanned(Event, frozen=True, tag=event_type("fleet", "mig_layout_planned")):
    """The scheduler chose a new MIG layout for one GPU: `drain` are the idle instances it destroys
    (never one holding work), `create` the instances it makes; `enable_mig`/`disable_mig` when the
    GPU's MIG mode changes (only on a GPU without work). On Kubernetes it is applied through the GPU
    Operator's `nvidia.com/mig.config` node label (`mig_config`)."""

    cluster: Name
    node: Name
    gpu_index: int
    at: float
    model: Name
    before: list[MigInstance] = []
    after: list[MigInstance] = []
    drain: list[MigInstance] = []
    create: list[MigInstance] = []
    enable_mig: bool = False
    disable_mig: bool = False
    reason: str = ""
    mig_config: str = ""


class MigLayoutApplied(Event, frozen=True, tag=event_type("fleet", "mig_layout_applied")):
    """The layout the GPU now has (reported back once the change is made)."""

    cluster: Name
    node: Name
    gpu_index: int
    at: float
    layout: list[MigInstance] = []
    mig_enabled: bool = True
    planned_at: float | None = None


class MigChangeAbandoned(Event, frozen=True, tag=event_type("fleet", "mig_change_abandoned")):
    """An operator gave up a planned MIG change that did not apply (`chamber mig abandon NODE`): the
    GPUs in `gpus` keep the layout last applied, Chamber lifts the cordon it set for the change, and the
    planner leaves those GPUs alone for its usual interval (one change per GPU per hour)."""

    cluster: Name
    node: Name
    at: float
    gpus: list[int] = []
    by: str = ""
    reason: str = ""
