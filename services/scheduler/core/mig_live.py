"""MIG layouts in the live scheduler: GPUs whose layout Chamber manages, and the planner driven by the queue.

A node is MIG-managed when it carries the NVIDIA GPU Operator's `nvidia.com/mig.config` label (the MIG
manager applies layouts there; discovery copies node labels). On such a node:

- a GPU's layout is what the last `MigLayoutApplied` said (none yet: MIG off, a whole GPU, as the
  GPU Operator's default `all-disabled` leaves it);
- a MIG request goes only into a free instance of its profile that the layout has (no instance is
  made on demand), and a GPU in MIG mode serves MIG requests only, even with no instance in use;
- a GPU with a planned change (`MigLayoutPlanned` folded, no `MigLayoutApplied` yet) and every other
  GPU of its node take no new work: the GPU Operator applies a node's layouts together, after the
  node's GPU pods are gone (services/kube/mig_config.py).

`plan_layouts` runs at the end of a cycle. When queued MIG jobs (their quota allows them) found no
instance, it plans target layouts with the planner (`mig_plan.plan`) on the managed nodes that may
change: in service, no GPU work on the node at all (so no running instance is disturbed and MIG mode
is never toggled under work), no change pending, and each GPU at most one change per
`MIN_INTERVAL_S`. Waiting whole-GPU jobs may turn MIG off on idle MIG GPUs the queue does not need.
Each change is a `PlanLayout` decision, a `MigLayoutPlanned` event. Nodes without the label keep the
simpler model: an instance is placed at any free legal start (its layout assumed made per instance).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.scheduler.core.decisions import PlanLayout
from services.scheduler.core.mig import Instance, mig_model, occupancy
from services.scheduler.core.mig_plan import GpuKey, LayoutChange, MigGpu, plan

if TYPE_CHECKING:
    from events.fleet import MigLayoutApplied, MigLayoutPlanned
    from services.scheduler.core.state import Node, SchedulerState
    from services.scheduler.core.work import Work

MANAGED_LABEL = "nvidia.com/mig.config"
MIN_INTERVAL_S = 3600.0  # at most one layout change per GPU per hour


@dataclass
class MigState:
    """One managed GPU's MIG layout, as applied, and a change planned for it."""

    enabled: bool = False
    layout: tuple[Instance, ...] = ()
    pending: tuple[Instance, ...] | None = None  # the planned layout, until applied (() with MIG off)
    pending_enabled: bool = True
    changed_at: float | None = None  # when its last change was planned (the rate limit)


def managed(node: Node) -> bool:
    """The node's MIG layouts are Chamber's to know and change (the label, or a layout folded for it)."""
    return MANAGED_LABEL in node.labels or bool(node.mig)


def mig_held(node: Node, gpu: int) -> bool:
    """The GPU is in MIG mode or being changed: out of the whole-GPU capacity."""
    st = node.mig.get(gpu)
    return st is not None and (st.enabled or st.pending is not None)


def reconfiguring(node: Node) -> bool:
    return any(st.pending is not None for st in node.mig.values())


def layout_starts(node: Node, gpu: int, profile: str, starts: list[int]) -> list[int] | None:
    """On a managed node, the free starts narrowed to the layout's instances of the profile (empty
    where the GPU is not in MIG mode); None on a node Chamber does not manage."""
    if not managed(node):
        return None
    st = node.mig.get(gpu)
    if st is None or not st.enabled or st.pending is not None:
        return []
    return [s for s in starts if (profile, s) in st.layout]


def fold_planned(s: SchedulerState, e: MigLayoutPlanned) -> None:
    node = s.nodes.get((e.cluster, e.node))
    if node is None or e.gpu_index not in node.gpus:
        return
    st = node.mig.setdefault(e.gpu_index, MigState())
    st.pending = tuple((i.profile, i.start) for i in e.after) if not e.disable_mig else ()
    st.pending_enabled = not e.disable_mig
    st.changed_at = e.at
    s.mig_nodes[node.nid] = None
    s.refresh_node(node)


def fold_applied(s: SchedulerState, e: MigLayoutApplied) -> None:
    node = s.nodes.get((e.cluster, e.node))
    if node is None or e.gpu_index not in node.gpus:
        return
    st = node.mig.setdefault(e.gpu_index, MigState())
    st.enabled = e.mig_enabled
    st.layout = tuple(sorted(((i.profile, i.start) for i in e.layout), key=lambda i: (i[1], i[0])))
    if not e.mig_enabled:
        st.layout = ()
    st.pending = None
    s.mig_nodes[node.nid] = None
    s.refresh_node(node)
    s.capacity_epoch += 1  # capacity changed shape: the next cycle looks at every queued job


# -- planning in the cycle --------------------------------------------------------------------------------
def plan_layouts(
    work: Work, waiting: Mapping[str, str], full: bool, min_interval_s: float = MIN_INTERVAL_S
) -> list[PlanLayout]:
    """Layout changes for the queued work the cycle left waiting (`waiting`: job id -> why), see the
    module's text. A full cycle looked at every queued job: the demand is the whole queue's. An
    incremental one only at the jobs that joined since: it plans only if one of them is a MIG job, for
    what those ask (older ones were planned for by the cycles that saw them)."""
    s = work.s
    if not s.mig_nodes:
        return []
    if not full and not any(_mig_job(s, jid) for jid in waiting):
        return []
    from services.scheduler.core import quota
    from services.scheduler.core.state import QUEUED

    groups: dict[tuple[int, ...], tuple[Counter[str], list[int]]] = {}
    for jid in waiting:
        job = s.jobs.get(jid)
        if job is None or job.state not in QUEUED:
            continue
        share = job.spec.share
        if share is not None and not share.mig_profile:
            continue
        classes = tuple(work.classes(job))
        if not classes or quota.block(work, job) is not None:
            continue
        demand, whole = groups.setdefault(classes, (Counter(), [0]))
        if share is not None and share.mig_profile:
            demand[share.mig_profile] += job.spec.replicas
        else:
            whole[0] += job.spec.total_gpus
    out: list[PlanLayout] = []
    changed: set[GpuKey] = set()
    for classes, (demand, whole) in sorted(groups.items()):
        if not demand and not whole[0]:
            continue
        views, fixed = _views(work, set(classes), changed, min_interval_s)
        if not views:
            continue
        for change in plan(
            views, demand, work.now, whole_demand=whole[0], min_interval_s=min_interval_s, rewrites_whole_gpu=True
        ):
            if change.gpu.key in fixed or change.gpu.key in changed:
                continue
            changed.add(change.gpu.key)
            out.append(PlanLayout(change.event(work.now, _reason(change))))
    return out


def _mig_job(s: SchedulerState, jid: str) -> bool:
    job = s.jobs.get(jid)
    return job is not None and job.spec.share is not None and bool(job.spec.share.mig_profile)


def _reason(change: LayoutChange) -> str:
    if change.disable_mig:
        return "whole-GPU jobs wait and this MIG GPU is idle"
    wanted = ", ".join(f"{n}x{p}" for p, n in sorted(change.serves.items()))
    return f"queued MIG jobs ({wanted}) found no free instance"


def _views(
    work: Work, classes: set[int], changed: set[GpuKey], min_interval_s: float
) -> tuple[list[MigGpu], set[GpuKey]]:
    """The planner's view of the managed GPUs in these classes, and which of them may not change (their
    node holds GPU work, is out of service or already changing)."""
    s, slots = work.s, work.cap.slots
    views: list[MigGpu] = []
    fixed: set[GpuKey] = set()
    for nid in s.mig_nodes:
        node = s.node_by_id[nid]
        if not managed(node) or slots[nid].cls not in classes:
            continue
        busy_node = bool(node.owners) or any(sg.holders for sg in node.shared.values())
        frozen = busy_node or not node.in_service or reconfiguring(node) or bool(node.held)
        for gpu, model in sorted(node.gpus.items()):
            table = mig_model(model)
            if table is None:
                continue
            key: GpuKey = (node.cluster, node.name, gpu)
            st = node.mig.get(gpu) or MigState()
            sg = node.shared.get(gpu)
            busy = frozenset(i for i in st.layout if sg is not None and sg.mig_used & occupancy(table, i[0], i[1]))
            if frozen or key in changed or gpu in node.bad_gpus:
                fixed.add(key)
            views.append(
                MigGpu(
                    key,
                    model,
                    st.enabled,
                    st.layout,
                    busy,
                    whole_busy=gpu in node.owners or (sg is not None and sg.mode != "mig" and bool(sg.holders)),
                    # a GPU that may not change is seen as just changed: the planner leaves it as it is
                    last_change=work.now if key in fixed else st.changed_at,
                )
            )
    return views, fixed
