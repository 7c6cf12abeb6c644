"""Health core: a pure policy engine over faults, samples and fleet events.

`evolve(state, input)` folds one input (a fault, a sample, a fleet event, this core's own decisions
among them) into the state; `decide(state, now)` turns pending faults and expired probations into
decision values, each carrying its reason, fault ids and the event to publish. Every decision has an
event (recording a fault is `FaultRecorded`, restarting a probation `IsolationExtended`): the decider
host folds a decision only when its event comes back from the log, so replaying the log rebuilds the
state, and a decision is made once. Operator commands (`confirm`, `restore`, `dismiss`) are
functions of the state too; their events are the log.

Replay folds FAULTS, FLEET and TELEMETRY in one order, but a live race may differ; the state does not
depend on it: what FAULTS alone decides (de-duplication, repeat counting for escalation) is kept
apart from what the decisions on FLEET settled (`settled`), so a fault folded after its decision
counts and settles exactly as one folded before it.

State is mutable for speed (a 1,000-node fleet samples ~1,000 times a second) but only `evolve`
changes it. No clock, no I/O, no randomness: replaying the same inputs and ticks gives the same
decisions, with the same event ids.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import NoReturn

from events.base import Event
from events.codec import stable_id
from events.faults import GpuFaultDetected, Severity
from events.fleet import (
    FaultRecorded,
    GpuIsolated,
    GpuRestored,
    IsolationDismissed,
    IsolationExtended,
    IsolationHeld,
    NodeDiscovered,
    NodeForgotten,
    NodeIsolated,
    NodeLost,
    NodeRestored,
    NodeStatus,
    NodeUpdated,
)
from events.telemetry import GpuSample, NodeSample
from services.health.policy import RANK, Action, Policy, Restore, Rule

NodeKey = tuple[str, str]  # (cluster, node)
Target = tuple[str, str, int | None]  # (cluster, node, gpu index or None for the whole node)
SEEN_FAULTS_KEPT = 100_000  # de-duplicates a detector's retries; older ids cannot come back in practice


class HealthRefusal(Exception):
    """An operator command that does not apply to the current state; the message says what to do."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class Isolation:
    at: float
    reason: str
    fault_ids: list[str]
    until: float | None  # None: restore by an operator only
    flaps: int = 0  # consecutive re-isolations soon after a restore (flap damping)


@dataclass
class NodeHealth:
    cluster: str
    node: str
    status: NodeStatus = NodeStatus.HEALTHY
    gpus: dict[int, str] = field(default_factory=dict)  # index -> uuid
    isolated: Isolation | None = None
    gpu_isolated: dict[int, Isolation] = field(default_factory=dict)
    dirty_gpus: set[int] = field(default_factory=set)  # latest sample shows an unresolved memory fault
    clean_since: dict[int, float] = field(default_factory=dict)  # gpu -> first clean sample after dirty

    def index_of(self, uuid: str | None) -> int | None:
        if uuid is None:
            return None
        return next((i for i, u in self.gpus.items() if u == uuid), None)


@dataclass(frozen=True)
class Pending:
    fault: GpuFaultDetected
    gpu_index: int | None
    rule: Rule
    action: Action
    reason: str
    fault_ids: tuple[str, ...]


@dataclass(frozen=True)
class Decision:
    """What the engine decided about one fault or target, and why, with the event that records it
    (`event` is set by every function of this module; the state changes only when it is folded)."""

    action: str  # record | extend | hold | isolate_gpu | isolate_node | restore_gpu | restore_node
    cluster: str
    node: str
    gpu_index: int | None
    reason: str
    fault_ids: tuple[str, ...] = ()
    rule: str = ""
    event: Event | None = None
    until: float | None = None  # for `extend`: the new end of probation


# The meaning of this core's fold, for its snapshots (services/runtime/state_codec.py): bump it when a
# change makes a state folded by the previous release wrong for this one (a field's meaning, what an
# event does); the first start after it folds the log from the start. Comments, logs, speed: no bump.
STATE_VERSION = 2  # 2: faults carry ras_block and afid; the policy has AMD and NCCL peer-dead rules


@dataclass
class HealthState:
    policy: Policy
    nodes: dict[NodeKey, NodeHealth] = field(default_factory=dict)
    pending: list[Pending] = field(default_factory=list)
    held: dict[Target, IsolationHeld] = field(default_factory=dict)
    seen_faults: OrderedDict[str, None] = field(default_factory=OrderedDict)  # folded from FAULTS
    settled: OrderedDict[str, None] = field(default_factory=OrderedDict)  # named by a decision in the log
    repeats: dict[tuple[Target, str], deque[tuple[float, str]]] = field(default_factory=dict)
    isolations: deque[tuple[float, NodeKey]] = field(default_factory=deque)  # for the budget window
    restores: dict[Target, tuple[float, int]] = field(default_factory=dict)  # target -> (at, flaps)


def new_state(policy: Policy) -> HealthState:
    return HealthState(policy=policy)


def _forget(state: HealthState, key: NodeKey) -> None:
    """The node left the fleet for good: its isolations, held ones, faults waiting for a decision,
    repeats and flap memory go with it (the budget window keeps its isolations: it counts time)."""
    state.nodes.pop(key, None)
    for target in [t for t in state.held if t[:2] == key]:
        del state.held[target]
    for rkey in [r for r in state.repeats if r[0][:2] == key]:
        del state.repeats[rkey]
    for target in [t for t in state.restores if t[:2] == key]:
        del state.restores[target]
    state.pending = [p for p in state.pending if (p.fault.cluster, p.fault.node) != key]


# ---------------------------------------------------------------------------------------------- evolve


def evolve(state: HealthState, item: object) -> HealthState:
    """Fold one input or decision into the state. Unknown inputs are ignored; never raises on valid ones."""
    match item:
        case GpuFaultDetected():
            _on_fault(state, item)
        case NodeSample():
            _on_sample(state, item)
        case NodeDiscovered():
            node = _node(state, item.cluster, item.node)
            node.gpus.update({g.index: g.uuid for g in item.gpus if g.uuid})
        case NodeUpdated():
            node = _node(state, item.cluster, item.node)
            node.status = item.status
            node.gpus.update({g.index: g.uuid for g in item.gpus if g.uuid})
        case NodeLost():
            _node(state, item.cluster, item.node).status = NodeStatus.LOST
        case NodeForgotten():
            _forget(state, (item.cluster, item.node))
        case NodeIsolated():
            _on_isolated(state, (item.cluster, item.node, None), item.at, item.reason, item.fault_ids, item.until)
        case GpuIsolated():
            target = (item.cluster, item.node, item.gpu_index)
            _learn_uuid(_node(state, item.cluster, item.node), item.gpu_index, item.gpu_uuid)
            _on_isolated(state, target, item.at, item.reason, item.fault_ids, item.until)
        case NodeRestored():
            _on_restored(state, (item.cluster, item.node, None), item.at)
        case GpuRestored():
            _learn_uuid(_node(state, item.cluster, item.node), item.gpu_index, item.gpu_uuid)
            _on_restored(state, (item.cluster, item.node, item.gpu_index), item.at)
        case IsolationHeld():
            if item.gpu_index is not None:
                _learn_uuid(_node(state, item.cluster, item.node), item.gpu_index, item.gpu_uuid)
            state.held[(item.cluster, item.node, item.gpu_index)] = item
            _settle(state, item.fault_ids)
        case IsolationDismissed():
            state.held.pop((item.cluster, item.node, item.gpu_index), None)
            _settle(state, item.fault_ids)
        case IsolationExtended():
            iso = _isolation(state, (item.cluster, item.node, item.gpu_index))
            if iso is not None:
                iso.fault_ids.extend(f for f in item.fault_ids if f not in iso.fault_ids)
                if iso.until is not None and item.until is not None:
                    iso.until = max(iso.until, item.until)
            _settle(state, item.fault_ids)
        case FaultRecorded():
            _settle(state, item.fault_ids)
        case Decision():  # a decision value folds as its event (tests and the simulator fold them directly)
            if item.event is not None:
                evolve(state, item.event)
    return state


def _node(state: HealthState, cluster: str, node: str) -> NodeHealth:
    key = (cluster, node)
    found = state.nodes.get(key)
    if found is None:
        found = state.nodes[key] = NodeHealth(cluster, node)
    return found


def _isolation(state: HealthState, target: Target) -> Isolation | None:
    node = state.nodes.get(target[:2])
    if node is None:
        return None
    return node.isolated if target[2] is None else node.gpu_isolated.get(target[2])


def _drop_pending(state: HealthState, fault_ids: list[str] | tuple[str, ...]) -> None:
    if state.pending and fault_ids:
        ids = set(fault_ids)
        state.pending = [p for p in state.pending if p.fault.fault_id not in ids]


def _remember(ids: OrderedDict[str, None], fault_id: str) -> None:
    ids[fault_id] = None
    while len(ids) > SEEN_FAULTS_KEPT:
        ids.popitem(last=False)


def _settle(state: HealthState, fault_ids: list[str] | tuple[str, ...]) -> None:
    """A decision in the log named these faults: they are not weighed again, whichever of FAULTS and
    FLEET a replay (or a live race) folds first."""
    _drop_pending(state, fault_ids)
    for fid in fault_ids:
        _remember(state.settled, fid)


def _learn_uuid(node: NodeHealth, index: int, uuid: str | None) -> None:
    """A UUID named by a fault or a decision, for a GPU the inventory has not named (the inventory wins).

    Learned whatever else the input does: a replay may fold FLEET before FAULTS (or before the
    inventory), and the isolated GPU must still be known by the UUID its annotation was written with.
    """
    if uuid and index not in node.gpus:
        node.gpus[index] = uuid


def _on_fault(state: HealthState, fault: GpuFaultDetected) -> None:
    node = _node(state, fault.cluster, fault.node)
    gpu = fault.gpu_index if fault.gpu_index is not None else node.index_of(fault.gpu_uuid)
    if gpu is not None:
        _learn_uuid(node, gpu, fault.gpu_uuid)
    if fault.fault_id in state.seen_faults:
        return  # a detector's retry
    _remember(state.seen_faults, fault.fault_id)
    rule = state.policy.rule_for(fault)
    action = rule.action
    reason = f"{rule.key}: {rule.description or rule.key}"
    if fault.detail:
        reason += f" ({fault.detail})"
    fault_ids: tuple[str, ...] = (fault.fault_id,)
    if fault.severity == Severity.CRITICAL and rule.if_critical and RANK[rule.if_critical] > RANK[action]:
        action = rule.if_critical
        reason += f"; rated critical by the detector: {action}"
    if action == Action.RECORD and rule.escalate is not None:
        seen = state.repeats.setdefault(((fault.cluster, fault.node, gpu), rule.key), deque())
        seen.append((fault.observed_at, fault.fault_id))
        while seen and seen[0][0] <= fault.observed_at - rule.escalate.window_s:
            seen.popleft()
        if len(seen) >= rule.escalate.count:
            action = rule.escalate.action
            where = f"GPU {gpu}" if gpu is not None else "the node"
            reason += f"; seen {len(seen)} times in {rule.escalate.window_s:g}s on {where}: escalated to {action}"
            fault_ids = tuple(fid for _, fid in seen)
            seen.clear()
    if action == Action.ISOLATE_GPU and gpu is None:
        action = Action.ISOLATE_NODE
        reason += "; the fault names no GPU, so the node is isolated"
    if fault.fault_id in state.settled:
        return  # its decision was folded first: counted above for escalation, not weighed again
    state.pending.append(Pending(fault, gpu, rule, action, reason, fault_ids))


def _dirty(gpu: GpuSample) -> bool:
    """A sample that shows a memory fault still in effect (DCGM MEM FAIL conditions, pending remap)."""
    if gpu.ecc_dbe_volatile:
        return True
    if gpu.retired_pages_pending:
        return True
    remap = gpu.row_remap
    return remap is not None and bool(remap.pending or remap.failure)


def _on_sample(state: HealthState, sample: NodeSample) -> None:
    node = _node(state, sample.cluster, sample.node)
    for gpu in sample.gpus:
        if gpu.index not in node.gpus and gpu.uuid:
            node.gpus[gpu.index] = gpu.uuid
        if sample.slow_omitted:  # the fields `_dirty` reads are as in the last sample that carried them
            continue
        if _dirty(gpu):
            node.dirty_gpus.add(gpu.index)
            node.clean_since.pop(gpu.index, None)
        elif gpu.index in node.dirty_gpus:
            node.dirty_gpus.discard(gpu.index)
            node.clean_since[gpu.index] = sample.observed_at


def _on_isolated(
    state: HealthState, target: Target, at: float, reason: str, fault_ids: list[str], until: float | None
) -> None:
    node = _node(state, target[0], target[1])
    flaps = _flaps(state, target, at)
    iso = Isolation(at=at, reason=reason, fault_ids=list(fault_ids), until=until, flaps=flaps)
    if target[2] is None:
        node.isolated = iso
    else:
        node.gpu_isolated[target[2]] = iso
    state.held.pop(target, None)
    state.isolations.append((at, (target[0], target[1])))
    while state.isolations and state.isolations[0][0] < at - state.policy.budget.window_s:
        state.isolations.popleft()  # outside any budget window from now on
    _settle(state, fault_ids)


def _on_restored(state: HealthState, target: Target, at: float) -> None:
    node = _node(state, target[0], target[1])
    iso = node.isolated if target[2] is None else node.gpu_isolated.get(target[2])
    if iso is None:
        return
    if target[2] is None:
        node.isolated = None
    else:
        node.gpu_isolated.pop(target[2], None)
    state.restores[target] = (at, iso.flaps)


def _flaps(state: HealthState, target: Target, at: float) -> int:
    """0 for a first isolation; n+1 when isolated again within the flap window of the last restore."""
    last = state.restores.get(target)
    if last is None or at - last[0] > state.policy.flap.window_s:
        return 0
    return last[1] + 1


def probation_s(state: HealthState, target: Target, at: float) -> float:
    p = state.policy
    return min(p.probation.default_s * p.flap.multiplier ** _flaps(state, target, at), p.flap.max_probation_s)


# ---------------------------------------------------------------------------------------------- decide


def decide(state: HealthState, now: float) -> list[Decision]:
    """1. pending faults -> record / extend / isolate / hold (budget); 2. expired probations -> restore.

    Reads the state only; each decision's event changes the state when it is folded from the log.
    """
    decisions: list[Decision] = []
    # Targets isolated and nodes newly affected earlier in this same pass (the state is not folded yet).
    taken: set[Target] = set()
    affected_now: set[NodeKey] = set()
    for p in state.pending:
        decisions.append(_decide_fault(state, p, taken, affected_now))
    # A fault in this pass restarts its target's probation: no restore for it now.
    extended = {(d.cluster, d.node, d.gpu_index) for d in decisions if d.action == "extend"}
    decisions.extend(d for d in _decide_restores(state, now) if (d.cluster, d.node, d.gpu_index) not in extended)
    return decisions


def _decide_fault(state: HealthState, p: Pending, taken: set[Target], affected_now: set[NodeKey]) -> Decision:
    f = p.fault
    node = _node_view(state, f.cluster, f.node)
    target: Target = (f.cluster, f.node, None if p.action == Action.ISOLATE_NODE else p.gpu_index)
    common = dict(cluster=f.cluster, node=f.node, gpu_index=target[2], fault_ids=p.fault_ids, rule=p.rule.key)
    if p.action == Action.RECORD:
        return _record(p, target, p.reason)
    restored_at = _last_restore(state, target)
    if restored_at is not None and restored_at >= f.observed_at:
        # Observed before a later restore: that decision already weighed it (an operator, or a probation
        # it extended). This also keeps a replay of FAULTS after FLEET from isolating again.
        return _record(p, target, f"{p.reason}; observed before the restore at {restored_at:.0f}: superseded")
    covering = _covering(node, target, taken)
    if covering is not None:
        iso_target, iso = covering
        until = None
        if iso is not None and iso.until is not None:
            until = f.observed_at + probation_s(state, iso_target, f.observed_at)
        reason = f"{p.reason}; already isolated, probation restarts"
        extended = IsolationExtended(
            cluster=f.cluster,
            node=f.node,
            at=f.observed_at,
            reason=reason,
            gpu_index=iso_target[2],
            fault_ids=list(p.fault_ids),
            until=until,
        )
        return Decision(
            action="extend",
            reason=reason,
            until=until,
            event=extended,
            **{**common, "gpu_index": iso_target[2]},  # type: ignore[arg-type]
        )
    if target in state.held:
        return _record(p, target, f"{p.reason}; an isolation is already held for confirmation")
    key: NodeKey = (f.cluster, f.node)
    if not _within_budget(state, key, f.observed_at, affected_now):
        b = state.policy.budget
        reason = (
            f"{p.reason}; held: the isolation budget ({b.max_share:.0%} of the fleet, at least {b.min_nodes} "
            f"nodes, per {b.window_s:g}s) is spent; confirm with `chamber health confirm {f.node}"
            + (f" --gpu {target[2]}`" if target[2] is not None else "`")
        )
        held = IsolationHeld(
            cluster=f.cluster,
            node=f.node,
            at=f.observed_at,
            action=str(p.action),
            reason=reason,
            gpu_index=target[2],
            gpu_uuid=node.gpus.get(target[2]) if node and target[2] is not None else None,
            fault_ids=list(p.fault_ids),
        )
        return Decision(action="hold", reason=reason, event=held, **common)  # type: ignore[arg-type]
    taken.add(target)
    affected_now.add(key)
    event = _isolation_event(state, target, f.observed_at, p.reason, list(p.fault_ids), p.rule.restore)
    return Decision(action=str(p.action), reason=p.reason, event=event, **common)  # type: ignore[arg-type]


def _record(p: Pending, target: Target, reason: str) -> Decision:
    """No action: the faults are settled by a `FaultRecorded` in the log."""
    f = p.fault
    event = FaultRecorded(
        cluster=f.cluster,
        node=f.node,
        at=f.observed_at,
        reason=reason,
        gpu_index=target[2],
        rule=p.rule.key,
        fault_ids=list(p.fault_ids),
    )
    return Decision("record", f.cluster, f.node, target[2], reason, p.fault_ids, p.rule.key, event=event)


def _last_restore(state: HealthState, target: Target) -> float | None:
    times = [r[0] for t in {target, (target[0], target[1], None)} if (r := state.restores.get(t)) is not None]
    return max(times) if times else None


def _node_view(state: HealthState, cluster: str, node: str) -> NodeHealth | None:
    return state.nodes.get((cluster, node))


def _covering(node: NodeHealth | None, target: Target, taken: set[Target]) -> tuple[Target, Isolation | None] | None:
    """The isolation that already covers `target`: the node's, or the GPU's own."""
    node_target: Target = (target[0], target[1], None)
    if node_target in taken:
        return node_target, None
    if target in taken:
        return target, None
    if node is None:
        return None
    if node.isolated is not None:
        return node_target, node.isolated
    if target[2] is not None and target[2] in node.gpu_isolated:
        return target, node.gpu_isolated[target[2]]
    return None


def _within_budget(state: HealthState, key: NodeKey, at: float, affected_now: set[NodeKey]) -> bool:
    """Nodes newly isolated (whole or a GPU) within the window must stay within the budget."""
    b = state.policy.budget
    affected = {k for t, k in state.isolations if at - b.window_s < t <= at} | affected_now
    if key in affected:
        return True  # this node is already counted: more GPUs on it are not a fleet-wide storm
    fleet = sum(1 for n in state.nodes.values() if n.status != NodeStatus.LOST) or 1
    allowed = max(b.min_nodes, math.floor(b.max_share * fleet))
    return len(affected) + 1 <= allowed


def _isolation_event(
    state: HealthState, target: Target, at: float, reason: str, fault_ids: list[str], restore: Restore
) -> Event:
    cluster, node_name, gpu = target
    until = None if restore == Restore.MANUAL else at + probation_s(state, target, at)
    flaps = _flaps(state, target, at)
    if flaps:
        reason += (
            f"; flapping ({flaps} re-isolation(s) soon after a restore): probation {until - at:g}s" if until else ""
        )
    if gpu is None:
        return NodeIsolated(cluster=cluster, node=node_name, at=at, reason=reason, fault_ids=fault_ids, until=until)
    node = state.nodes.get((cluster, node_name))
    return GpuIsolated(
        cluster=cluster,
        node=node_name,
        gpu_index=gpu,
        at=at,
        reason=reason,
        gpu_uuid=node.gpus.get(gpu) if node else None,
        fault_ids=fault_ids,
        until=until,
    )


def _decide_restores(state: HealthState, now: float) -> list[Decision]:
    out: list[Decision] = []
    require_clean = state.policy.probation.require_clean_sample
    for (cluster, name), node in state.nodes.items():
        if node.status in (NodeStatus.LOST, NodeStatus.SUSPECT):
            continue  # no heartbeat, no evidence of a clean probation
        if node.isolated is not None and _due(node.isolated, now):
            if require_clean and node.dirty_gpus:
                continue
            at = max([node.isolated.until or now, *node.clean_since.values()])
            reason = f"clean probation after: {node.isolated.reason}"
            event = NodeRestored(cluster=cluster, node=name, at=at, reason=reason, by="probation")
            out.append(
                Decision("restore_node", cluster, name, None, reason, tuple(node.isolated.fault_ids), event=event)
            )
        for gpu, iso in sorted(node.gpu_isolated.items()):
            if not _due(iso, now) or (require_clean and gpu in node.dirty_gpus):
                continue
            at = max(iso.until or now, node.clean_since.get(gpu, 0.0))
            reason = f"clean probation after: {iso.reason}"
            restored = GpuRestored(
                cluster=cluster,
                node=name,
                gpu_index=gpu,
                at=at,
                reason=reason,
                gpu_uuid=node.gpus.get(gpu),
                by="probation",
            )
            out.append(Decision("restore_gpu", cluster, name, gpu, reason, tuple(iso.fault_ids), event=restored))
    return out


def _due(iso: Isolation, now: float) -> bool:
    return iso.until is not None and now >= iso.until


# ---------------------------------------------------------------------------------------------- commands


def restore(state: HealthState, cluster: str, node: str, gpu_index: int | None, now: float, by: str) -> Decision:
    """An operator's restore; refused when there is nothing Chamber isolated to restore."""
    found = state.nodes.get((cluster, node))
    iso = None if found is None else (found.isolated if gpu_index is None else found.gpu_isolated.get(gpu_index))
    if found is None or iso is None:
        what = f"GPU {gpu_index} of node {node}" if gpu_index is not None else f"node {node}"
        hint = ""
        if found is not None and gpu_index is None and found.gpu_isolated:
            hint = f"; isolated GPUs there: {sorted(found.gpu_isolated)} (pass --gpu I)"
        raise HealthRefusal(f"{what} in cluster {cluster} is not isolated by Chamber{hint}", field="node")
    reason = f"restored by {by}; was: {iso.reason}"
    event: Event
    if gpu_index is None:
        event = NodeRestored(cluster=cluster, node=node, at=now, reason=reason, by="operator")
        action = "restore_node"
    else:
        event = GpuRestored(
            cluster=cluster,
            node=node,
            gpu_index=gpu_index,
            at=now,
            reason=reason,
            gpu_uuid=found.gpus.get(gpu_index),
            by="operator",
        )
        action = "restore_gpu"
    return Decision(action, cluster, node, gpu_index, reason, tuple(iso.fault_ids), event=event)


def confirm(state: HealthState, cluster: str, node: str, gpu_index: int | None, now: float, by: str) -> Decision:
    """An operator's confirmation of an isolation the budget held back."""
    held = state.held.get((cluster, node, gpu_index))
    if held is None:
        _nothing_held(state, cluster, node)
    target: Target = (cluster, node, gpu_index)
    reason = f"{held.reason.split('; held:')[0]}; isolation confirmed by {by}"
    restore_mode = Restore.PROBATION
    event = _isolation_event(state, target, now, reason, list(held.fault_ids), restore_mode)
    action = "isolate_node" if gpu_index is None else "isolate_gpu"
    return Decision(action, cluster, node, gpu_index, reason, tuple(held.fault_ids), event=event)


def dismiss(state: HealthState, cluster: str, node: str, gpu_index: int | None, now: float, by: str) -> Decision:
    """An operator's refusal of a held isolation (a storm from a broken detector, say)."""
    held = state.held.get((cluster, node, gpu_index))
    if held is None:
        _nothing_held(state, cluster, node)
    reason = f"{held.reason.split('; held:')[0]}; isolation dismissed by {by}"
    event = IsolationDismissed(
        cluster=cluster, node=node, at=now, reason=reason, gpu_index=gpu_index, by=by, fault_ids=held.fault_ids
    )
    return Decision("dismiss", cluster, node, gpu_index, reason, tuple(held.fault_ids), event=event)


def _nothing_held(state: HealthState, cluster: str, node: str) -> NoReturn:
    waiting = sorted(f"{n}" + (f" --gpu {g}" if g is not None else "") for c, n, g in state.held if c == cluster)
    hint = f"; held now: {', '.join(waiting)}" if waiting else "; nothing is held"
    raise HealthRefusal(f"no isolation is held for {node} in cluster {cluster}{hint}", field="node")


def event_id(decision: Decision) -> str:
    """The deterministic id of a decision's event (JetStream drops a replayed re-emission)."""
    e = decision.event
    return stable_id(
        "health",
        type(e).__name__ if e is not None else decision.action,
        decision.cluster,
        decision.node,
        decision.gpu_index,
        ",".join(sorted(decision.fault_ids)),
        getattr(e, "at", ""),
    )
