"""GPU shares in the live cycle: fractions of a GPU (time-slicing, MPS) and MIG instances.

A job with `spec.share` takes part of one GPU per replica. A GPU that holds any share is out of the
whole-GPU index (`Capacity`) and carries a `SharedGpu` on its node (`Node.shared`): the mode it is
shared by (jobs of different modes never share a GPU), the milli-GPU and GPU memory taken, the MIG
memory slices taken, and who holds what. When its last holder leaves, the GPU is whole again.

Placement (`place`) packs: a replica goes on a GPU already shared in its mode that has room, chosen
with the sharing scorer (sharing.py: the growth of FGD fragmentation for the expected mix of shared
requests, plus best fit), and takes a free whole GPU (best-fit node) only when none has room. A MIG
instance goes at a legal free start of a GPU whose model has the profile (mig.py); a GPU becomes a MIG
GPU when its first instance is placed. On a node whose layouts Chamber manages (mig_live.py: the GPU
Operator's mig.config label) an instance goes only into a free instance of the GPU's applied layout,
idle instances of such GPUs are found through `SchedulerState.mig_nodes`, and no instance is made on
a whole GPU there: the planner changes layouts (Chamber decides, the driver enforces).

Quotas count GPU-equivalents: a fraction by its share, a MIG instance by its profile's share of the
GPU (the mean of its compute and memory fractions), so four 1g slices never cost four GPUs.

In a cycle every change goes on the live state with its undo journaled in the capacity index
(`Capacity.undo`), which the cycle rolls back, as it does for whole GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from events import GpuShare, JobSpec, Placement, ShareMode
from services.scheduler.core import hostres
from services.scheduler.core.mig import MIG_MODELS, mig_model, occupancy, starts_in_mask
from services.scheduler.core.mig_live import layout_starts, managed, mig_held

if TYPE_CHECKING:
    from services.scheduler.core.sharing import Mix, PodRequest, State
    from services.scheduler.core.state import Job, Node
    from services.scheduler.core.work import Spot, Work

MILLI = 1000


@dataclass
class SharedGpu:
    """One GPU shared by jobs: its mode, what they take of it, and each holder's part."""

    mode: str  # a ShareMode value
    milli: int = 0  # milli-GPU taken
    memory_mib: int = 0  # GPU memory taken (fractions that asked for memory)
    mig_used: int = 0  # MIG memory slices taken (mig.occupancy masks)
    holders: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # job -> (milli, memory, mask)

    def add(self, job_id: str, milli: int, memory_mib: int, mask: int) -> None:
        m, mem, used = self.holders.get(job_id, (0, 0, 0))
        self.holders[job_id] = (m + milli, mem + memory_mib, used | mask)
        self.milli += milli
        self.memory_mib += memory_mib
        self.mig_used |= mask

    def drop(self, job_id: str) -> None:
        m, mem, used = self.holders.pop(job_id)
        self.milli -= m
        self.memory_mib -= mem
        self.mig_used &= ~used


# -- what a request costs ---------------------------------------------------------------------------
def mig_models_with(profile: str) -> list[str]:
    """The MIG models that have `profile`, sorted."""
    return sorted(m for m, t in MIG_MODELS.items() if profile in t.profiles)


def share_milli(share: GpuShare, model: str | None = None) -> int:
    """Milli-GPU-equivalents one replica counts for before it is placed: a fraction's `gpu_milli`; a MIG
    instance's profile share on `model`, or without one the largest among the models that have the
    profile (a name like 1g.10gb is a different share on an A100-40GB than on an A100-80GB), so a quota
    is never passed by a guess. Placed, a job counts its placements' shares. 0: no model has it (the
    door refuses such a request)."""
    if not share.mig_profile:
        return share.gpu_milli
    named = mig_model(model) if model else None
    tables = [named] if named is not None else [mig_model(m) for m in mig_models_with(share.mig_profile)]
    return max((t.share_milli(share.mig_profile) for t in tables if t and share.mig_profile in t.profiles), default=0)


def equivalents(spec: JobSpec) -> float:
    """The GPU-equivalents a job's quota counts while it waits: whole GPUs, or its replicas' shares."""
    if spec.share is None:
        return spec.total_gpus
    return round(spec.replicas * share_milli(spec.share, spec.gpu_model) / MILLI, 6)


def plus(total: float, change: float) -> float:
    """`total + change` for GPU counts: whole GPUs stay ints; with shares the sum is rounded to a
    millionth, so adding and taking back the same shares gives the same number again."""
    value = total + change
    return round(value, 6) if value.__class__ is float else value


def mode_of(share: GpuShare) -> str:
    return ShareMode.MIG.value if share.mig_profile else share.mode.value


def describe(share: GpuShare) -> str:
    """`1g.10gb MIG instance` / `250 milli-GPU (mps, 4096 MiB)`: what one replica asks for."""
    if share.mig_profile:
        return f"{share.mig_profile} MIG instance"
    memory = f", {share.memory_mib} MiB" if share.memory_mib else ""
    return f"{share.gpu_milli} milli-GPU ({share.mode.value}{memory})"


def holding(placement: Placement, share: GpuShare, model: str) -> tuple[int, int, int] | None:
    """(milli, memory, MIG mask) a placement holds of its GPU; None where it is not legal there."""
    if share.mig_profile:
        table = mig_model(model)
        start = placement.mig_start
        if table is None or share.mig_profile not in table.profiles or start is None:
            return None
        if start not in table.profiles[share.mig_profile].starts:
            return None
        return (table.share_milli(share.mig_profile), 0, occupancy(table, share.mig_profile, start))
    return (placement.share_milli, share.memory_mib, 0)


def room(sg: SharedGpu, mode: str, milli: int, memory_mib: int, mask: int, gpu_memory: int | None) -> bool:
    """Whether one more holder of this part fits on the shared GPU."""
    if sg.mode != mode:
        return False
    if mask:
        return not sg.mig_used & mask
    if sg.milli + milli > MILLI:
        return False
    return not (memory_mib and gpu_memory is not None and sg.memory_mib + memory_mib > gpu_memory)


# -- the cycle's scratch changes (journaled in the capacity index) ----------------------------------
def take(work: Work, nid: int, gpu: int, job_id: str, mode: str, part: tuple[int, int, int]) -> None:
    """Give `job_id` this part of a GPU on the scratch view (a free whole GPU becomes shared)."""
    node = work.s.node_by_id[nid]
    cap = work.cap
    sg = node.shared.get(gpu)
    if sg is None:
        if not mig_held(node, gpu):  # a managed MIG GPU is out of the whole-GPU index already
            cap.take_exact(nid, [gpu])
        sg = node.shared[gpu] = SharedGpu(mode)
        cap.undo(lambda: _forget(node, gpu))
        if nid not in work.s.shared_nodes:  # (a node whose shares all end in the cycle stays listed: harmless)
            work.s.shared_nodes[nid] = None
            cap.undo(lambda: work.s.shared_nodes.pop(nid, None))
    before = (sg.milli, sg.memory_mib, sg.mig_used, sg.holders.get(job_id))
    sg.add(job_id, *part)
    cap.undo(lambda: _restore(sg, job_id, before))


def give(work: Work, job: Job) -> None:
    """Take back what a running job holds of shared GPUs on the scratch view (a GPU left by its last
    holder is whole and free again, if healthy)."""
    nodes, cap = work.s.nodes, work.cap
    for p in job.placements:
        node = nodes.get((p.cluster, p.node))
        if node is None:
            continue
        for i in p.gpu_indices:
            sg = node.shared.get(i)
            if sg is None or job.id not in sg.holders:
                continue
            before = (sg.milli, sg.memory_mib, sg.mig_used, sg.holders[job.id])
            sg.drop(job.id)
            cap.undo(lambda sg=sg, before=before: _restore(sg, job.id, before))  # type: ignore[misc]
            if not sg.holders:
                del node.shared[i]
                cap.undo(lambda node=node, i=i, sg=sg: node.shared.__setitem__(i, sg))  # type: ignore[misc]
                if node.offers(i) and not mig_held(node, i):
                    cap.give(node.nid, [i])


def _forget(node: Node, gpu: int) -> None:
    del node.shared[gpu]


def _restore(sg: SharedGpu, job_id: str, before: tuple[int, int, int, tuple[int, int, int] | None]) -> None:
    sg.milli, sg.memory_mib, sg.mig_used, held = before
    if held is None:
        sg.holders.pop(job_id, None)
    else:
        sg.holders[job_id] = held


# -- placement ----------------------------------------------------------------------------------
Choice = tuple[float, int, int, int | None]  # (score, node id, GPU index, MIG start)


def place(work: Work, job: Job) -> Spot | None:
    """Place each replica's share on the scratch view, all or nothing; the MIG starts chosen are kept in
    `work.share_starts[job.id]` (for the placements `Work.admit` makes)."""
    share = job.spec.share
    assert share is not None
    classes = work.classes(job)
    if not classes:
        return None
    mark = work.cap.mark()
    spot: Spot = []
    starts: list[int | None] = []
    mode = mode_of(share)
    for _ in range(job.spec.replicas):
        found = _place_one(work, job.id, share, mode, classes, near(work, spot))
        if found is None:
            work.cap.rollback(mark)
            return None
        nid, gpu, start = found
        spot.append((nid, [gpu]))
        starts.append(start)
    work.share_starts[job.id] = starts
    return spot


def near(work: Work, spot: Spot) -> list[set[int]]:
    """Where a gang's next share looks first, as whole-GPU gangs do (`placement._spread`): the nodes
    its earlier replicas are on, then the rest of their topology domains; the sharing scorer chooses
    within each, and everywhere when neither has room. Nothing for a gang's first replica."""
    if not spot:
        return []
    nodes = {nid for nid, _ in spot}
    slots = work.cap.slots
    domains = {slots[nid].domain for nid in nodes} - {""}
    if not domains:
        return [nodes]
    return [nodes, {nid for nid, slot in enumerate(slots) if slot.domain in domains} - nodes]


def _place_one(
    work: Work, job_id: str, share: GpuShare, mode: str, classes: list[int], tiers: list[set[int]]
) -> tuple[int, int, int | None] | None:
    best: Choice | None = None
    for only in (*tiers, None):
        best = _best(work, share, mode, classes, only)
        if best is not None:
            break
    if best is None:
        return None
    _, nid, gpu, start = best
    node = work.s.node_by_id[nid]
    held = part(share, node.gpus[gpu], start)
    assert held is not None
    take(work, nid, gpu, job_id, mode, held)
    if work.host is not None and work.host.asking is not None:
        work.host.change(work, work.host.asking, [(nid, [gpu])], -1)  # its CPU and memory (hostres.py)
    return nid, gpu, start


def _best(work: Work, share: GpuShare, mode: str, classes: list[int], only: set[int] | None) -> Choice | None:
    """The scorer's best GPU for one share (on the nodes `only`, or anywhere): a GPU shared in its mode,
    an idle instance of a managed layout, else a free whole GPU."""
    best = _on_shared(work, share, mode, classes, only)
    if best is None and share.mig_profile and work.s.mig_nodes:
        best = _on_layout(work, share, classes, only)
    if best is None:
        best = _on_whole(work, share, mode, classes, only)
    return best


def part(share: GpuShare, model: str, start: int | None) -> tuple[int, int, int] | None:
    """(milli, memory, MIG mask) one replica's share takes of a GPU of `model` (a MIG one at `start`)."""
    if share.mig_profile:
        table = mig_model(model)
        if table is None or start is None:
            return None
        return (table.share_milli(share.mig_profile), 0, occupancy(table, share.mig_profile, start))
    return (share.gpu_milli, share.memory_mib, 0)


def _on_shared(
    work: Work, share: GpuShare, mode: str, classes: list[int], only: set[int] | None = None
) -> Choice | None:
    """The best GPU already shared in this mode that has room (None: none has)."""
    wanted = set(classes)
    slots, nodes = work.cap.slots, work.s.node_by_id
    best: Choice | None = None
    for nid in sorted(work.s.shared_nodes if only is None else only.intersection(work.s.shared_nodes)):
        node = nodes[nid]
        slot = slots[nid]
        if not slot.usable or slot.cls not in wanted:
            continue
        for gpu in sorted(node.shared):
            sg = node.shared[gpu]
            if sg.mode != mode or not node.offers(gpu):
                continue
            for choice in _choices(work, node, gpu, sg, share):
                if best is None or choice < best:
                    best = choice
    return best


def _on_layout(work: Work, share: GpuShare, classes: list[int], only: set[int] | None = None) -> Choice | None:
    """The best idle instance of a managed MIG GPU that no job uses yet (mig_live.py)."""
    wanted = set(classes)
    slots, nodes = work.cap.slots, work.s.node_by_id
    best: Choice | None = None
    for nid in sorted(work.s.mig_nodes if only is None else only.intersection(work.s.mig_nodes)):
        node, slot = nodes[nid], slots[nid]
        if not slot.usable or slot.cls not in wanted:
            continue
        for gpu in sorted(node.mig):
            if gpu in node.shared or not node.offers(gpu) or not node.mig[gpu].enabled:
                continue
            for choice in _choices(work, node, gpu, SharedGpu(ShareMode.MIG.value), share):
                if best is None or choice < best:
                    best = choice
    return best


def _on_whole(
    work: Work, share: GpuShare, mode: str, classes: list[int], only: set[int] | None = None
) -> Choice | None:
    """A free whole GPU on the best-fit node (of `only`, if given) of a class whose model can hold the share."""
    cap = work.cap
    usable = [c for c in classes if _model_holds(cap.class_keys[c][2], share)]
    if only is None:
        nid = cap.best_fit(usable, 1) if usable else None
    else:
        wanted, slots = set(usable), cap.slots
        fit = [(len(slots[n].free), n) for n in only if slots[n].usable and slots[n].free and slots[n].cls in wanted]
        nid = min(fit)[1] if fit else None
    if nid is None:
        return None
    node = work.s.node_by_id[nid]
    if share.mig_profile and managed(node):
        return None  # a managed GPU gets instances only by a planned layout
    gpu = cap.slots[nid].free[0]
    found = _choices(work, node, gpu, SharedGpu(mode), share)
    return min(found) if found else None


def _model_holds(model: str, share: GpuShare) -> bool:
    if not share.mig_profile:
        return True
    table = mig_model(model)
    return table is not None and share.mig_profile in table.profiles


def _choices(work: Work, node: Node, gpu: int, sg: SharedGpu, share: GpuShare) -> list[Choice]:
    """Every way the share could go on this GPU, scored by the sharing scorer (lower is better)."""
    if not hostres.room(work, node.nid):
        return []
    model = node.gpus[gpu]
    mix = work.share_mix(mode_of(share))
    left = MILLI - sg.milli
    cpu, cpu_after = hostres.cpu_left(work, node.nid, mix.cpu_per_milli)
    if share.mig_profile:
        table = mig_model(model)
        if table is None or share.mig_profile not in table.profiles:
            return []
        need = table.share_milli(share.mig_profile)
        before: State = (model, cpu, 0, False, (left,), ((sg.mig_used, left),))
        out: list[Choice] = []
        starts = starts_in_mask(table, sg.mig_used, share.mig_profile)
        if work.s.mig_nodes:
            narrowed = layout_starts(node, gpu, share.mig_profile, starts)
            starts = starts if narrowed is None else narrowed
        for start in starts:
            used = sg.mig_used | occupancy(table, share.mig_profile, start)
            new: State = (model, cpu_after, 0, False, (left - need,), ((used, left - need),))
            out.append((_score(mix, before, new), node.nid, gpu, start))
        return out
    if not room(sg, sg.mode, share.gpu_milli, share.memory_mib, 0, node.gpu_memory.get(gpu)):
        return []
    plain: State = (model, cpu, 0, False, (left,), ())
    after: State = (model, cpu_after, 0, False, (left - share.gpu_milli,), ())
    return [(_score(mix, plain, after), node.nid, gpu, None)]


def _score(mix: Mix, before: State, new: State) -> float:
    """The sharing scorer (sharing.py's chamber policy) on one GPU: the growth of FGD fragmentation for the
    expected mix, plus best fit, so near-ties go to the GPU the share leaves fullest, plus CPU stranding:
    the growth of this GPU's capacity its node's CPU left could not feed at the mix's CPU per milli-GPU
    (0 when no queued share asks for CPU; the states carry the node's CPU left, `hostres.cpu_left`)."""
    from services.scheduler.core import sharing  # numpy: only a cycle that places a share loads it

    grad = sharing.fragment(new, mix) - sharing.fragment(before, mix)
    ratio = mix.cpu_per_milli
    strand = sharing.stranded(new, ratio) - sharing.stranded(before, ratio) if ratio else 0.0
    return grad + sharing.BESTFIT_WEIGHT * new[4][0] / MILLI + sharing.STRANDING_WEIGHT * strand


def request(share: GpuShare, cpu_milli: int = 0) -> PodRequest:
    """The sharing scorer's request for a share (its shape in the expected mix), with the CPU each
    replica asks of its node."""
    from services.scheduler.core.sharing import PodRequest

    if share.mig_profile:
        having = frozenset(mig_models_with(share.mig_profile))
        milli = share_milli(share)
        return PodRequest(cpu_milli, num_gpu=1, gpu_milli=milli, models=having, mig_profile=share.mig_profile)
    return PodRequest(cpu_milli, num_gpu=1, gpu_milli=share.gpu_milli)
