"""Discovery core: the fleet inventory, folded from agent inventories and samples, Kubernetes Node
observations and health decisions; `decide(state, now)` tells FLEET what changed.

What FLEET has been told (`announced`, `status`) is kept apart from what was observed; `decide`
emits the difference, and folding those events back moves `announced` on, so each change is told
once. A node whose heartbeats stop is `suspect` after `suspect_after_intervals` missed intervals and
`lost` after `lost_after_s`; those events are dated when the threshold was crossed (not when a tick
noticed), so replays give the same events with the same ids. A lost node Kubernetes deleted is
forgotten (`NodeForgotten`) `lost_after_s` later, and an operator may forget any lost node
(`forget`); a forgotten node's record is dropped, and if it reports again it is discovered anew.
No clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from events.base import Event
from events.codec import stable_id
from events.fleet import (
    GpuIsolated,
    GpuRestored,
    IsolationDismissed,
    IsolationHeld,
    NodeDiscovered,
    NodeForgotten,
    NodeIsolated,
    NodeLost,
    NodeRestored,
    NodeStatus,
    NodeUpdated,
)
from events.telemetry import GpuInfo, HostInfo, NodeInventory, NodeSample
from services.discovery.cloud import cloud_labels, host_labels
from services.timefmt import iso

GPU_RESOURCE = "nvidia.com/gpu"
AMD_GPU_RESOURCE = "amd.com/gpu"
# GPU feature discovery labels worth carrying into the fleet view (product, memory, count, family...).
GFD_PREFIX = "nvidia.com/"
K8S_CAPACITY_LABEL = "chamber.io/k8s-gpu-capacity"
K8S_ALLOCATABLE_LABEL = "chamber.io/k8s-gpu-allocatable"


@dataclass(frozen=True)
class KubeNode:
    """One Kubernetes Node object, as the shell read it."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    capacity_gpus: int | None = None
    allocatable_gpus: int | None = None
    unschedulable: bool = False
    provider_id: str = ""  # spec.providerID, e.g. aws:///us-east-1a/i-0abc (empty on-premises)
    allocatable_cpu_milli: int | None = None  # status.allocatable cpu / memory: what pods may use
    allocatable_memory_mib: int | None = None


@dataclass(frozen=True)
class KubeNodesListed:
    """A full listing of a cluster's Kubernetes nodes at `at` (nodes missing from it were deleted)."""

    cluster: str
    at: float
    nodes: tuple[KubeNode, ...]


@dataclass
class NodeRecord:
    cluster: str
    node: str
    first_seen_at: float
    # observed
    gpus: list[GpuInfo] = field(default_factory=list)
    agent_labels: dict[str, str] = field(default_factory=dict)
    host: HostInfo | None = None  # the machine's firmware identity, from the agent's inventory
    agent_capacity: tuple[int | None, int | None] = (None, None)  # (milli-CPUs, MiB) the agent read
    agent: bool = False
    kube: KubeNode | None = None
    kube_seen_at: float = 0.0
    kube_deleted_at: float | None = None  # when a listing first missed it (Kubernetes deleted the Node)
    last_seen_at: float | None = None
    interval_s: float = 1.0
    changed_at: float = 0.0  # when the observed GPUs or labels last changed
    util: dict[int, float | None] = field(default_factory=dict)
    # told to FLEET
    announced: bool = False
    status: NodeStatus = NodeStatus.HEALTHY
    announced_gpus: list[GpuInfo] = field(default_factory=list)
    announced_labels: dict[str, str] = field(default_factory=dict)
    announced_capacity: tuple[int | None, int | None] = (None, None)
    # from health decisions (for the view)
    isolated: str | None = None
    gpu_isolated: dict[int, str] = field(default_factory=dict)
    held: dict[int | None, str] = field(default_factory=dict)
    version: int = 0  # bumped on every change; the shell rewrites a KV entry when it moves

    def labels(self) -> dict[str, str]:
        out = dict(self.agent_labels)
        out.update(host_labels(self.host))  # a node Kubernetes does not list: the firmware alone
        if self.kube is not None:
            out.update({k: v for k, v in self.kube.labels.items() if k.startswith(GFD_PREFIX)})
            # provider, region, zone, type: the node's labels win, the firmware fills the gaps
            out.update(cloud_labels(self.kube.labels, self.kube.provider_id, self.host))
            if self.kube.capacity_gpus is not None:
                out[K8S_CAPACITY_LABEL] = str(self.kube.capacity_gpus)
            if self.kube.allocatable_gpus is not None:
                out[K8S_ALLOCATABLE_LABEL] = str(self.kube.allocatable_gpus)
        return dict(sorted(out.items()))

    def capacity(self) -> tuple[int | None, int | None]:
        """(milli-CPUs, MiB) work may use: Kubernetes' allocatable where it says, else the agent's reading."""
        cpu, memory = self.agent_capacity
        if self.kube is not None:
            cpu = self.kube.allocatable_cpu_milli if self.kube.allocatable_cpu_milli is not None else cpu
            memory = self.kube.allocatable_memory_mib if self.kube.allocatable_memory_mib is not None else memory
        return cpu, memory


@dataclass
class DiscoveryState:
    suspect_after_intervals: int = 3
    lost_after_s: float = 60.0
    nodes: dict[tuple[str, str], NodeRecord] = field(default_factory=dict)


def new_state(*, suspect_after_intervals: int = 3, lost_after_s: float = 60.0) -> DiscoveryState:
    return DiscoveryState(suspect_after_intervals=suspect_after_intervals, lost_after_s=lost_after_s)


def _record(state: DiscoveryState, cluster: str, node: str, at: float) -> NodeRecord:
    key = (cluster, node)
    rec = state.nodes.get(key)
    if rec is None:
        rec = state.nodes[key] = NodeRecord(cluster=cluster, node=node, first_seen_at=at, changed_at=at)
    elif at < rec.first_seen_at:
        # the earliest of everything heard about it, whichever stream a replay folded first
        rec.first_seen_at = at
    return rec


# ---------------------------------------------------------------------------------------------- evolve


def evolve(state: DiscoveryState, item: object) -> DiscoveryState:
    match item:
        case NodeSample():
            rec = _record(state, item.cluster, item.node, item.observed_at)
            rec.agent = True
            if rec.last_seen_at is None or item.observed_at >= rec.last_seen_at:
                rec.last_seen_at = item.observed_at
                rec.interval_s = item.interval_s if item.interval_s > 0 else rec.interval_s
                rec.util = {g.index: g.utilization_pct for g in item.gpus}
                if not rec.gpus:  # no inventory yet: know the GPUs by index and uuid at least
                    rec.gpus = [GpuInfo(index=g.index, uuid=g.uuid, model="unknown") for g in item.gpus]
                    rec.changed_at = item.observed_at
            rec.version += 1
        case NodeInventory():
            rec = _record(state, item.cluster, item.node, item.observed_at)
            rec.agent = True
            capacity = (item.cpu_milli, item.memory_mib)
            seen = (rec.gpus, rec.agent_labels, rec.host, rec.agent_capacity)
            if (item.gpus, item.labels, item.host, capacity) != seen:
                rec.changed_at = item.observed_at
            rec.agent_capacity = capacity
            rec.gpus = list(item.gpus)
            rec.agent_labels = dict(item.labels)
            rec.host = item.host
            if rec.last_seen_at is None or item.observed_at > rec.last_seen_at:
                rec.last_seen_at = item.observed_at
            rec.version += 1
        case KubeNodesListed():
            _on_kube_listing(state, item)
        case NodeDiscovered() | NodeUpdated():
            rec = _record(state, item.cluster, item.node, item.at)
            rec.announced = True
            rec.status = item.status if isinstance(item, NodeUpdated) else NodeStatus.HEALTHY
            rec.announced_gpus = list(item.gpus)
            rec.announced_labels = dict(item.labels)
            rec.announced_capacity = (item.cpu_milli, item.memory_mib)
            rec.version += 1
        case NodeLost():
            rec = _record(state, item.cluster, item.node, item.at)
            rec.announced = True
            rec.status = NodeStatus.LOST
            rec.version += 1
        case NodeForgotten():
            _on_forgotten(state, item)
        case NodeIsolated():
            rec = _record(state, item.cluster, item.node, item.at)
            rec.isolated = item.reason
            rec.held.pop(None, None)
            rec.version += 1
        case NodeRestored():
            rec = _record(state, item.cluster, item.node, item.at)
            rec.isolated = None
            rec.version += 1
        case GpuIsolated():
            rec = _record(state, item.cluster, item.node, item.at)
            rec.gpu_isolated[item.gpu_index] = item.reason
            rec.held.pop(item.gpu_index, None)
            rec.version += 1
        case GpuRestored():
            rec = _record(state, item.cluster, item.node, item.at)
            rec.gpu_isolated.pop(item.gpu_index, None)
            rec.version += 1
        case IsolationHeld():
            rec = _record(state, item.cluster, item.node, item.at)
            rec.held[item.gpu_index] = item.reason
            rec.version += 1
        case IsolationDismissed():
            rec = _record(state, item.cluster, item.node, item.at)
            rec.held.pop(item.gpu_index, None)
            rec.version += 1
    return state


def _allocatable(kube: KubeNode) -> tuple[int | None, int | None, int | None]:
    return kube.allocatable_gpus, kube.allocatable_cpu_milli, kube.allocatable_memory_mib


def _on_kube_listing(state: DiscoveryState, listing: KubeNodesListed) -> None:
    present = {n.name: n for n in listing.nodes}
    for name, kube in present.items():
        rec = _record(state, listing.cluster, name, listing.at)
        if rec.kube != kube:
            if rec.kube is None or rec.kube.labels != kube.labels or rec.kube.capacity_gpus != kube.capacity_gpus:
                rec.changed_at = listing.at
            if rec.kube is not None and _allocatable(rec.kube) != _allocatable(kube):
                rec.changed_at = listing.at
            rec.kube = kube
            rec.version += 1
        rec.kube_seen_at = listing.at
        rec.kube_deleted_at = None  # listed again (a Node deleted and made again under its name)
    for (cluster, name), rec in state.nodes.items():
        if cluster != listing.cluster or name in present:
            continue
        if rec.kube is not None:
            rec.kube = None  # deleted from Kubernetes
            rec.kube_seen_at = rec.kube_deleted_at = listing.at
            rec.version += 1
        elif rec.kube_deleted_at is None and not rec.kube_seen_at and _announced_from_kubernetes(rec):
            # Known from FLEET only (this discovery started after it was announced) as a Kubernetes
            # Node, and not listed now: deleted while the discovery was down. Without this a node an
            # autoscaler removed during a restart would stay lost for good.
            rec.kube_deleted_at = listing.at
            rec.version += 1


def _announced_from_kubernetes(rec: NodeRecord) -> bool:
    """FLEET was told Kubernetes' GPU counts for it: it was a Kubernetes Node."""
    return K8S_CAPACITY_LABEL in rec.announced_labels or K8S_ALLOCATABLE_LABEL in rec.announced_labels


def _on_forgotten(state: DiscoveryState, event: NodeForgotten) -> None:
    """Drop the node's record. What was observed of it after it was forgotten (its agent reported
    again, or a Kubernetes listing had it again, between the decision and its fold) starts a new
    record, never announced: it is discovered anew, as a new node."""
    rec = state.nodes.pop((event.cluster, event.node), None)
    if rec is None:
        return
    heard = rec.agent and rec.last_seen_at is not None and rec.last_seen_at > event.at
    listed = rec.kube is not None and rec.kube_seen_at > event.at
    if not (heard or listed):
        return
    since = max(rec.last_seen_at or 0.0, rec.kube_seen_at if listed else 0.0)
    fresh = _record(state, event.cluster, event.node, since)
    if heard:
        fresh.agent, fresh.gpus, fresh.agent_labels, fresh.host = True, list(rec.gpus), dict(rec.agent_labels), rec.host
        fresh.agent_capacity, fresh.last_seen_at, fresh.interval_s = (
            rec.agent_capacity,
            rec.last_seen_at,
            rec.interval_s,
        )
        fresh.util = dict(rec.util)
    if listed:
        fresh.kube, fresh.kube_seen_at = rec.kube, rec.kube_seen_at


# ---------------------------------------------------------------------------------------------- decide


def _kube_gpus(kube: KubeNode) -> list[GpuInfo]:
    """GPUs as Kubernetes knows them (count, GFD product and memory labels): no UUIDs without an agent."""
    if "amd.com/gpu.device-id" in kube.labels or "amd.com/gpu.product-name" in kube.labels:
        return _kube_amd_gpus(kube)
    model = kube.labels.get("nvidia.com/gpu.product", "unknown")
    memory = kube.labels.get("nvidia.com/gpu.memory")
    memory_mib = float(memory) if memory and memory.replace(".", "", 1).isdigit() else None
    return [GpuInfo(index=i, uuid="", model=model, memory_total_mib=memory_mib) for i in range(kube.capacity_gpus or 0)]


def _kube_amd_gpus(kube: KubeNode) -> list[GpuInfo]:
    """AMD's node labeller (ROCm/k8s-device-plugin): amd.com/gpu.device-id (74a1), .product-name, .vram (192G)."""
    from node_agent.amd_models import DEVICE_IDS, normalized_model

    labels = kube.labels
    device = labels.get("amd.com/gpu.device-id", "")
    try:
        name = DEVICE_IDS.get(int(device, 16), "") if device else ""
    except ValueError:
        name = ""
    name = name or labels.get("amd.com/gpu.product-name", "").replace("_", " ")
    vram = labels.get("amd.com/gpu.vram", "").upper().rstrip("B").rstrip("G")
    memory_mib = float(vram) * 1024 if vram.replace(".", "", 1).isdigit() else None
    model = normalized_model(name, memory_mib) if name else "unknown"
    return [
        GpuInfo(index=i, uuid="", model=model, memory_total_mib=memory_mib, vendor="amd")
        for i in range(kube.capacity_gpus or 0)
    ]


def desired_status(state: DiscoveryState, rec: NodeRecord, now: float) -> tuple[NodeStatus, float, str]:
    """What the node's status is at `now`, since when, and why."""
    if not rec.agent or rec.last_seen_at is None:
        if rec.kube is None:
            if rec.kube_seen_at:
                return NodeStatus.LOST, rec.kube_seen_at, "deleted from Kubernetes; no agent ever reported"
            if rec.kube_deleted_at is not None:
                return NodeStatus.LOST, rec.kube_seen_at, "deleted from Kubernetes while the discovery was down"
            # known from FLEET only (announced before this discovery started; nothing reported since)
            return NodeStatus.LOST, rec.kube_seen_at, "no heartbeat since the discovery started"
        return NodeStatus.NO_AGENT, rec.kube_seen_at or rec.first_seen_at, "seen by Kubernetes, no Chamber agent"
    silent = now - rec.last_seen_at
    if silent >= state.lost_after_s:
        reason = f"no heartbeat for {state.lost_after_s:g}s (last at {iso(rec.last_seen_at)})"
        return NodeStatus.LOST, rec.last_seen_at + state.lost_after_s, reason
    suspect_after = state.suspect_after_intervals * rec.interval_s
    if silent > suspect_after:
        reason = f"{state.suspect_after_intervals} heartbeat intervals of {rec.interval_s:g}s missed"
        return NodeStatus.SUSPECT, rec.last_seen_at + suspect_after, reason
    return NodeStatus.HEALTHY, rec.last_seen_at, "reporting"


def forget_at(state: DiscoveryState, rec: NodeRecord, now: float) -> float | None:
    """When a lost node is forgotten by itself, if ever: only a node Kubernetes deleted (autoscalers
    delete a scaled-down node's Node object: it is gone for good), once it has been both lost and
    deleted for another `lost_after_s`. The same patience that made it lost: a node deleted and made
    again under its name, or whose agent was only cut off, comes back within it and keeps its
    history, and every service has folded the NodeLost (its jobs requeued) before the node leaves
    their state. A node Kubernetes never listed (plain agents, `chamber up`) is only forgotten when
    an operator asks (`forget`). Dated, like NodeLost, when the grace ran out: replays agree."""
    if rec.kube is not None or rec.kube_deleted_at is None or rec.status != NodeStatus.LOST:
        return None
    status, since, _ = desired_status(state, rec, now)
    if status != NodeStatus.LOST:
        return None
    return max(since, rec.kube_deleted_at) + state.lost_after_s


class ForgetRefused(Exception):
    """An operator's forget that cannot be done; `kind` as services.runtime.commands.REFUSAL_KINDS."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


def forget(state: DiscoveryState, cluster: str, node: str, now: float, by: str, reason: str = "") -> NodeForgotten:
    """An operator's `chamber fleet forget NODE`: only a node lost (and announced so), and no longer a
    Kubernetes Node (one still listed would be discovered again at the next listing)."""
    rec = state.nodes.get((cluster, node))
    if rec is None:
        raise ForgetRefused(f"no node {node} in cluster {cluster}: `chamber fleet` lists the nodes", "unknown")
    status, _, _ = desired_status(state, rec, now)
    if status != NodeStatus.LOST:
        shown = "ISOLATED" if rec.isolated is not None else str(status).upper()
        raise ForgetRefused(
            f"node {node} is {shown}: only a lost node can be forgotten; "
            f"stop its agent and wait until `chamber fleet` shows it LOST"
        )
    if rec.status != NodeStatus.LOST:
        raise ForgetRefused(f"node {node} is being announced as lost; try again in a few seconds", "catching_up")
    if rec.kube is not None:
        raise ForgetRefused(
            f"node {node} is still a Kubernetes Node: delete it (`kubectl delete node {node}`) and "
            f"discovery forgets it by itself after {state.lost_after_s:g}s"
        )
    return NodeForgotten(cluster=cluster, node=node, at=now, reason=reason or f"forgotten by {by}", by=by)


def decide(state: DiscoveryState, now: float) -> list[Event]:
    """Events for every difference between what was observed and what FLEET has been told."""
    out: list[Event] = []
    for rec in state.nodes.values():
        out.extend(_decide_node(state, rec, now))
    return out


def _decide_node(state: DiscoveryState, rec: NodeRecord, now: float) -> list[Event]:
    status, since, why = desired_status(state, rec, now)
    gpus = rec.gpus if rec.agent else (_kube_gpus(rec.kube) if rec.kube else rec.announced_gpus)
    labels = rec.labels()
    c, n = rec.cluster, rec.node
    if not rec.announced:
        if status == NodeStatus.LOST and rec.kube is None:
            return []  # appeared and vanished before it was ever announced
        source = "agent" if rec.agent else "kubernetes"
        cpu, memory = rec.capacity()
        found: list[Event] = [
            NodeDiscovered(
                cluster=c,
                node=n,
                at=rec.first_seen_at,
                gpus=gpus,
                source=source,
                labels=labels,
                cpu_milli=cpu,
                memory_mib=memory,
            )
        ]
        if status != NodeStatus.HEALTHY:
            found.append(_status_event(rec, status, max(since, rec.first_seen_at), why, gpus, labels, ["status"]))
        return found
    if status == NodeStatus.LOST:
        # Told once; a lost node's GPUs and labels are told when it comes back (a NodeLost again for
        # a change of labels would be a new message every dedup window: found by the conformance suite).
        if rec.status == NodeStatus.LOST:
            at = forget_at(state, rec, now)
            if at is None or now < at:
                return []
            reason = f"deleted from Kubernetes and lost for {state.lost_after_s:g}s"
            return [NodeForgotten(cluster=c, node=n, at=at, reason=reason, by="discovery")]
        return [NodeLost(cluster=c, node=n, at=since, last_seen_at=rec.last_seen_at or since, reason=why)]
    changes = []
    if status != rec.status:
        changes.append("status")
    if gpus != rec.announced_gpus:
        changes.append("gpus")
    if labels != rec.announced_labels:
        changes.append("labels")
    if rec.capacity() != rec.announced_capacity:
        changes.append("capacity")
    if not changes:
        return []
    at = since if changes == ["status"] else max(since, rec.changed_at)
    return [_status_event(rec, status, at, why, gpus, labels, changes)]


def _status_event(
    rec: NodeRecord,
    status: NodeStatus,
    at: float,
    why: str,
    gpus: list[GpuInfo],
    labels: dict[str, str],
    changes: list[str],
) -> Event:
    if status == NodeStatus.LOST:
        return NodeLost(cluster=rec.cluster, node=rec.node, at=at, last_seen_at=rec.last_seen_at or at, reason=why)
    cpu, memory = rec.capacity()
    return NodeUpdated(
        cluster=rec.cluster,
        node=rec.node,
        at=at,
        status=status,
        gpus=gpus,
        changes=changes,
        labels=labels,
        cpu_milli=cpu,
        memory_mib=memory,
    )


def event_id(event: Event) -> str:
    """Deterministic id: the same observation decided twice is one message (JetStream dedup)."""
    status = getattr(event, "status", "")
    changes = ",".join(getattr(event, "changes", []))
    return stable_id("discovery", type(event).__name__, event.cluster, event.node, status, changes, event.at)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------- view


def view(state: DiscoveryState, rec: NodeRecord, now: float) -> dict[str, Any]:
    """The node as `chamber fleet` shows it (the KV entry). Status: lost > isolated > suspect > healthy."""
    status, _, why = desired_status(state, rec, now)
    shown, reason = str(status), "" if status == NodeStatus.HEALTHY else why
    if status == NodeStatus.NO_AGENT:
        shown = str(NodeStatus.SUSPECT)  # the CLI contract's four states; `agent: false` says why
    if rec.isolated is not None and status != NodeStatus.LOST:
        shown, reason = "isolated", rec.isolated
    gpus = rec.gpus if rec.agent else (_kube_gpus(rec.kube) if rec.kube else rec.announced_gpus)
    return {
        "cluster": rec.cluster,
        "node": rec.node,
        "status": shown,
        "reason": reason,
        "agent": rec.agent,
        "last_seen_at": rec.last_seen_at,
        "labels": rec.labels(),
        "kubernetes": None
        if rec.kube is None
        else {
            "capacity_gpus": rec.kube.capacity_gpus,
            "allocatable_gpus": rec.kube.allocatable_gpus,
            "unschedulable": rec.kube.unschedulable,
        },
        "held": [
            {"gpu": g, "reason": r} for g, r in sorted(rec.held.items(), key=lambda kv: -1 if kv[0] is None else kv[0])
        ],
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "util": rec.util.get(g.index),
                "isolated": g.index in rec.gpu_isolated or rec.isolated is not None,
                "reason": rec.gpu_isolated.get(g.index) or (rec.isolated or ""),
                "vendor": g.vendor,
            }
            for g in gpus
        ],
    }


def kv_key(cluster: str, node: str) -> str:
    from events.subjects import token

    return f"{token(cluster)}.{token(node)}"
