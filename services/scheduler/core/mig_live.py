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
change: in service, no GPU work on the node at all (none placed in this cycle either: so no running
instance is disturbed and MIG mode is never toggled under work), no change pending, and each GPU at
most one change per `MIN_INTERVAL_S`. Instances a pending change will make count as made, so the
same queue is not planned for twice. Since a node keeps its layouts for as long as it holds work,
it is planned for what it will serve meanwhile, not only for the queue of the moment: MIG mode gets
the MIG work's part of the GPUs (running and queued work, in GPU-equivalents, against the whole GPUs
held and queued; at most `GROWTH` times the MIG work's GPU-equivalents; whole nodes at a time), and
each GPU turned to MIG is filled with instances of the profiles in use, in their proportions
(`_ahead`, `_filled`). The last whole GPU is never turned to MIG ahead of the queue. Waiting
whole-GPU jobs may turn MIG off on idle MIG GPUs the queue does not need. Where no node may change,
one node per cycle may be drained for the most urgent waiting MIG job: the node whose every job that
job may preempt (the preemption rules) and that loses the least work (since each job's last
checkpoint), and only when the layout it would then get serves the queue. Each change is a
`PlanLayout` decision, a `MigLayoutPlanned` event; each job stopped a `Preempt`. Nodes without the
label keep the simpler model: an instance is placed at any free legal start (its layout assumed made per instance).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from services.scheduler.core.decisions import PlanLayout, Preempt
from services.scheduler.core.mig import Instance, mig_model, occupancy, starts_in_mask
from services.scheduler.core.mig_plan import GpuKey, LayoutChange, MigGpu, plan

if TYPE_CHECKING:
    from events.fleet import MigChangeAbandoned, MigLayoutApplied, MigLayoutPlanned
    from services.scheduler.core.state import Job, Node, SchedulerState
    from services.scheduler.core.work import Work

MANAGED_LABEL = "nvidia.com/mig.config"
MIN_INTERVAL_S = 3600.0  # at most one layout change per GPU per hour
# MIG mode is given at most this many times the GPU-equivalents of the MIG work running and queued now
# (room for it to grow while the nodes changed for it keep their layouts): without a bound the first
# MIG job on an idle fleet would turn every node to MIG. Chosen with bench/mig.py --live, seed 0, load
# 2.0 (the least that starts every small job there: 2 gives 1.60x whole-GPU scheduling, 4 2.39x, 6
# 2.61x); loads 1.0 and 3.0 and seed 1 held out (docs/sharing.md).
GROWTH = 6


@dataclass
class MigState:
    """One managed GPU's MIG layout, as applied, and a change planned for it."""

    enabled: bool = False
    layout: tuple[Instance, ...] = ()
    pending: tuple[Instance, ...] | None = None  # the planned layout, until applied (() with MIG off)
    pending_enabled: bool = True
    changed_at: float | None = None  # when its last change was planned (the rate limit)
    abandoned_at: float | None = None  # an operator gave its pending change up (the actuator uncordons)


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
    st.abandoned_at = None
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
    st.abandoned_at = None
    s.mig_nodes[node.nid] = None
    s.refresh_node(node)
    s.capacity_epoch += 1  # capacity changed shape: the next cycle looks at every queued job


def fold_abandoned(s: SchedulerState, e: MigChangeAbandoned) -> None:
    """The GPUs keep their applied layout; the change's time stays their last (the hourly limit holds)."""
    node = s.nodes.get((e.cluster, e.node))
    if node is None:
        return
    for gpu in e.gpus:
        st = node.mig.get(gpu)
        if st is not None and st.pending is not None:
            st.pending, st.abandoned_at = None, e.at
    s.mig_nodes[node.nid] = None
    s.refresh_node(node)
    s.capacity_epoch += 1


def abandoned(node: Node) -> float | None:
    """When an operator last gave up a change on the node, while no newer one is planned or applied."""
    if reconfiguring(node):
        return None
    return max((st.abandoned_at for st in node.mig.values() if st.abandoned_at is not None), default=None)


# -- planning in the cycle --------------------------------------------------------------------------------
Group = tuple["Counter[str]", "list[int]", "list[Job]"]  # MIG demand by profile, whole GPUs wanted, MIG jobs in order


def plan_layouts(
    work: Work, waiting: Mapping[str, str], full: bool, min_interval_s: float = MIN_INTERVAL_S
) -> list[PlanLayout | Preempt]:
    """Layout changes for the queued work the cycle left waiting (`waiting`: job id -> why, in queue
    order), see the module's text. A full cycle looked at every queued job: the demand is the whole
    queue's. An incremental one only at the jobs that joined since: it plans only if one of them is a MIG
    job, for what those ask (older ones were planned for by the cycles that saw them). Instances a pending
    change will make count as made. Where no node may change, at most one node is drained (`_drain`)."""
    s = work.s
    if not s.mig_nodes:
        return []
    if not full and not any(_mig_job(s, jid) for jid in waiting):
        return []
    out: list[PlanLayout | Preempt] = []
    changed: set[GpuKey] = set()
    drained = False
    for classes, (demand, whole, mig_jobs) in sorted(_groups(work, waiting).items()):
        if not demand and not whole[0]:
            continue
        views, fixed = _views(work, set(classes), changed, min_interval_s, set())
        population = _population(work, set(classes), demand, whole[0])
        changes = _plan(work, views, fixed, changed, demand, whole[0], min_interval_s, population)
        if demand and not any(c.serves for c in changes) and not drained and _unserved(views, demand):
            victims = _drain(work, set(classes), mig_jobs[0], min_interval_s)
            if victims is not None:  # the layouts the node would get once empty: worth it only if they serve
                nid, chosen = victims
                views, fixed = _views(work, set(classes), changed, min_interval_s, {nid})
                trial = set(changed)
                after = _plan(work, views, fixed, trial, demand, whole[0], min_interval_s, population)
                if any(c.serves for c in after):
                    drained = True
                    out += _preempt(work, mig_jobs[0], chosen)
                    changed |= trial
                    changes += after
        out += [PlanLayout(c.event(work.now, _reason(c))) for c in changes]
    return out


def _groups(work: Work, waiting: Mapping[str, str]) -> dict[tuple[int, ...], Group]:
    """The waiting MIG and whole-GPU jobs their quota allows, by the capacity classes they may use."""
    from services.scheduler.core import quota
    from services.scheduler.core.state import QUEUED

    s = work.s
    groups: dict[tuple[int, ...], Group] = {}
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
        demand, whole, mig_jobs = groups.setdefault(classes, (Counter(), [0], []))
        if share is not None and share.mig_profile:
            demand[share.mig_profile] += job.spec.replicas
            mig_jobs.append(job)
        else:
            whole[0] += job.spec.total_gpus
    return groups


def _plan(
    work: Work,
    views: list[MigGpu],
    fixed: set[GpuKey],
    changed: set[GpuKey],
    demand: Counter[str],
    whole: int,
    min_interval_s: float,
    population: Population,
) -> list[LayoutChange]:
    """The planner's changes for the queued demand and what the MIG work in these classes keeps using
    (`_ahead`): a managed node changes only while it holds no GPU work, so the layouts it gets are the
    ones it runs with until its work is gone. Each GPU turned to MIG gets its free slices filled with
    instances of the profiles in use (`_filled`); `serves` counts the queued requests only."""
    out: list[LayoutChange] = []
    if not views:
        return out
    mix, _ = population
    left = demand - _idle(views)  # what the idle instances (made, or planned) leave unserved
    whole_left = sum(1 for g in views if not g.mig_enabled)  # GPUs not in MIG mode (nor turning to it)
    for change in plan(
        views,
        demand | _ahead(views, population),
        work.now,
        whole_demand=whole,
        min_interval_s=min_interval_s,
        rewrites_whole_gpu=True,
    ):
        if change.gpu.key in fixed or change.gpu.key in changed:
            continue
        if not change.disable_mig:
            change = _filled(change, mix, left)
            if change.enable_mig and not change.serves and whole_left <= 1:
                continue  # ahead of the queue only: the last whole GPU stays, for whole-GPU work to come
            whole_left -= change.enable_mig
        changed.add(change.gpu.key)
        out.append(change)
    return out


Population = tuple["Counter[str]", int]  # MIG instances by profile, whole GPUs: running and queued


def _population(work: Work, classes: set[int], demand: Counter[str], whole: int) -> Population:
    """The GPU work in these classes of managed nodes: the MIG instances running jobs hold (by profile)
    plus the queued MIG requests, and the whole GPUs held plus those queued. By Little's law this is
    what the arrivals keep busy at once (arrival rate x time held), long-running work weighing more."""
    s = work.s
    mix, whole_gpus = Counter(demand), whole
    for nid in s.mig_nodes:
        node = s.node_by_id[nid]
        if not managed(node) or work.cap.slots[nid].cls not in classes:
            continue
        whole_gpus += sum(1 for j in node.owners.values() if j not in work.gone)
        for gpu, sg in node.shared.items():
            table = mig_model(node.gpus.get(gpu, ""))
            if table is None or sg.mode != "mig":
                continue
            for jid, (_, _, mask) in sg.holders.items():
                job = s.jobs.get(jid)
                if jid in work.gone or job is None or job.spec.share is None or not job.spec.share.mig_profile:
                    continue
                p = job.spec.share.mig_profile
                mix[p] += max(1, bin(mask).count("1") // table.profiles[p].memory) if p in table.profiles else 0
    for jid, spot in work.fresh.items():  # admitted in this cycle: not held on the scratch view yet
        job = s.jobs.get(jid)
        if job is None or not any(nid in s.mig_nodes for nid, _ in spot):
            continue
        n = sum(len(gpus) for _, gpus in spot)
        if job.spec.share is not None and job.spec.share.mig_profile:
            mix[job.spec.share.mig_profile] += n
        elif job.spec.share is None:
            whole_gpus += n
    return +mix, whole_gpus


def _ahead(views: list[MigGpu], population: Population) -> Counter[str]:
    """MIG requests to plan for beyond the queue. The GPUs in these classes in MIG mode should be the MIG
    work's part of all the work (its GPU-equivalents against the whole GPUs held and queued), but no
    more than `GROWTH` times those GPU-equivalents, rounded up to whole nodes: a node holding both
    kinds of work changes only once both have ended, so MIG work and whole-GPU work are kept on nodes
    of their own. The GPUs missing are given to the profiles in use, in proportion; none are while MIG
    mode already has its part (whole-GPU work keeps the rest, and the planner turns no GPU that queued
    whole-GPU work needs to MIG)."""
    mix, whole_gpus = population
    table = mig_model(views[0].model)
    if table is None or not mix:
        return Counter()
    mig_eq = sum(n * table.share_milli(p) for p, n in mix.items() if p in table.profiles) / 1000
    if mig_eq <= 0:
        return Counter()
    target = min(math.ceil(len(views) * mig_eq / (mig_eq + whole_gpus)), math.ceil(GROWTH * mig_eq))
    missing = target - sum(1 for g in views if g.mig_enabled)
    if missing <= 0:
        return Counter()
    per_node = max(Counter(g.key[:2] for g in views).values())
    missing = math.ceil(missing / per_node) * per_node
    return Counter({p: int(missing * n / mig_eq) for p, n in sorted(mix.items()) if p in table.profiles})


def _filled(change: LayoutChange, mix: Counter[str], left: Counter[str]) -> LayoutChange:
    """The change with its GPU's free slices filled by instances of the profiles in use (`mix`): each
    time the one furthest below its part of the mix that still fits (ties: the smallest), and `serves`
    counting only what the queue asks (`left`: still unserved, updated)."""
    table = mig_model(change.gpu.model)
    if table is None:
        return change
    used = 0
    for p, start in change.after:
        used |= occupancy(table, p, start)
    order = sorted((p for p in mix if p in table.profiles), key=lambda p: (table.profiles[p].memory, p))
    have = Counter(p for p, _ in change.after)
    extra: list[Instance] = []
    while fitting := [p for p in order if starts_in_mask(table, used, p)]:
        p = min(fitting, key=lambda q: (have[q] / mix[q], order.index(q)))
        start = starts_in_mask(table, used, p)[0]
        used |= occupancy(table, p, start)
        extra.append((p, start))
        have[p] += 1
    made = Counter(p for p, _ in (*change.create, *extra))
    serves = {p: n for p in sorted(made) if (n := min(made[p], left[p])) > 0}
    left.subtract(serves)
    after = tuple(sorted((*change.after, *extra), key=lambda i: (i[1], i[0])))
    return replace(change, after=after, create=(*change.create, *extra), serves=serves)


def _unserved(views: list[MigGpu], demand: Counter[str]) -> bool:
    """More is asked than the idle instances (made, or planned) hold."""
    return bool(demand - _idle(views))


def _idle(views: list[MigGpu]) -> Counter[str]:
    return Counter(i[0] for g in views if g.mig_enabled for i in g.layout if i not in g.busy)


def _mig_job(s: SchedulerState, jid: str) -> bool:
    job = s.jobs.get(jid)
    return job is not None and job.spec.share is not None and bool(job.spec.share.mig_profile)


def _reason(change: LayoutChange) -> str:
    if change.disable_mig:
        return "whole-GPU jobs wait and this MIG GPU is idle"
    if not change.serves:
        return "instances ahead of the queued MIG jobs (a managed node changes only while it holds no GPU work)"
    wanted = ", ".join(f"{n}x{p}" for p, n in sorted(change.serves.items()))
    return f"queued MIG jobs ({wanted}) found no free instance"


def _jobs_on(work: Work, node: Node) -> set[str]:
    """The jobs holding GPUs of the node on the cycle's scratch view (less those it preempted)."""
    held = set(node.owners.values()).union(*(sg.holders for sg in node.shared.values()))
    return held - work.gone


def _fresh_nodes(work: Work) -> set[int]:
    """Nodes given work in this cycle (whole GPUs admitted are not in `Node.owners` until folded)."""
    return {nid for spot in work.fresh.values() for nid, _ in spot}


def _views(
    work: Work, classes: set[int], changed: set[GpuKey], min_interval_s: float, emptied: set[int]
) -> tuple[list[MigGpu], set[GpuKey]]:
    """The planner's view of the managed GPUs in these classes, and which of them may not change (their
    node holds GPU work, is out of service or already changing). A GPU with a change pending shows its
    planned layout (its instances serve the queue once made). `emptied`: nodes drained in this cycle."""
    s, slots = work.s, work.cap.slots
    views: list[MigGpu] = []
    fixed: set[GpuKey] = set()
    fresh = _fresh_nodes(work)
    for nid in sorted(s.mig_nodes):
        node = s.node_by_id[nid]
        if not managed(node) or slots[nid].cls not in classes:
            continue
        empty = nid in emptied
        busy_node = not empty and (nid in fresh or bool(_jobs_on(work, node)))
        frozen = busy_node or not node.in_service or reconfiguring(node) or bool(node.held)
        for gpu, model in sorted(node.gpus.items()):
            table = mig_model(model)
            if table is None:
                continue
            key: GpuKey = (node.cluster, node.name, gpu)
            st = node.mig.get(gpu) or MigState()
            sg = None if empty else node.shared.get(gpu)
            enabled, layout = st.enabled, st.layout
            if st.pending is not None:
                enabled, layout = st.pending_enabled, st.pending
            busy = frozenset(i for i in layout if sg is not None and sg.mig_used & occupancy(table, i[0], i[1]))
            if frozen or key in changed or gpu in node.bad_gpus:
                fixed.add(key)
            owner = node.owners.get(gpu)
            views.append(
                MigGpu(
                    key,
                    model,
                    enabled,
                    layout,
                    busy,
                    whole_busy=not empty
                    and (
                        (owner is not None and owner not in work.gone)
                        or (sg is not None and sg.mode != "mig" and bool(sg.holders))
                    ),
                    # a GPU that may not change is seen as just changed: the planner leaves it as it is
                    last_change=work.now if key in fixed else st.changed_at,
                )
            )
    return views, fixed


# -- draining a node for a layout --------------------------------------------------------------------------
def _drain(work: Work, classes: set[int], lead: Job, min_interval_s: float) -> tuple[int, list[Job]] | None:
    """When no managed node may change, the node whose GPU work is cheapest to stop for the waiting MIG
    job `lead` (the most urgent of them): every job on it preemptible by `lead` under the preemption
    rules (preemption.eligible), none placed in this cycle, and the least work lost (time since each
    job's last checkpoint x its GPUs: checkpointing jobs cost little). None where no node qualifies."""
    from services.scheduler.core import preemption

    s = work.s
    if not work.policy.preemption or not preemption.may_preempt(work, lead):
        return None
    fresh = _fresh_nodes(work)
    reclaim, urgent = preemption._reclaims(work, lead), not lead.spec.preemptible
    best: tuple[float, int, list[Job]] | None = None
    for nid in sorted(s.mig_nodes):
        node = s.node_by_id[nid]
        slot = work.cap.slots[nid]
        if slot.cls not in classes or nid in fresh or not node.in_service or node.held or reconfiguring(node):
            continue
        if not any(mig_model(m) for m in node.gpus.values()):
            continue
        if any(st.changed_at is not None and work.now - st.changed_at < min_interval_s for st in node.mig.values()):
            continue
        victims = [s.jobs[j] for j in sorted(_jobs_on(work, node)) if j in s.jobs]
        if not victims or not all(_may_stop(work, lead, v, reclaim, urgent) for v in victims):
            continue
        cost = sum(preemption.lost_work_gpu_s(v, work.now) for v in victims)
        if best is None or (cost, nid) < best[:2]:
            best = (cost, nid, victims)
    return None if best is None else (best[1], best[2])


def _may_stop(work: Work, lead: Job, victim: Job, reclaim: bool, urgent: bool) -> bool:
    from services.scheduler.core import preemption

    spec = victim.spec
    if not spec.preemptible or victim.id in work.fresh:
        return False
    return (
        preemption.eligible(
            lead.spec.team,
            lead.spec.priority.rank,
            spec.team,
            spec.priority.rank,
            reclaim=reclaim,
            victim_borrowing=work.borrowing(victim.pool, spec.team),
            urgent=urgent,
        )
        is not None
    )


def _preempt(work: Work, lead: Job, victims: list[Job]) -> list[Preempt]:
    from services.scheduler.core import preemption

    out: list[Preempt] = []
    for v in victims:
        reason = preemption.eligible(
            lead.spec.team,
            lead.spec.priority.rank,
            v.spec.team,
            v.spec.priority.rank,
            reclaim=preemption._reclaims(work, lead),
            victim_borrowing=work.borrowing(v.pool, v.spec.team),
            urgent=not lead.spec.preemptible,
        )
        assert reason is not None
        detail = (
            f"preempted by {lead.id} ({reason.value}): its node is drained for a MIG layout change "
            f"(the cheapest node to stop: work since the last checkpoint is lost)"
        )
        lost = preemption.lost_work_gpu_s(v, work.now)
        out.append(Preempt(v.id, v.spec.team, reason, lead.id, lost, detail, v.generation))
        work.release(v)
    return out
