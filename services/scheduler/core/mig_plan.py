"""MIG reconfiguration as a planned action: which GPUs get which new layout so the queue can run.

`plan(gpus, demand, now)` is pure. For each GPU it knows the model, whether MIG mode is on, the
instances made and which of them hold work, and when its layout last changed. Rules it keeps:

- an instance that holds work is never destroyed: only idle instances whose slices the new layout
  needs are drained (so a change disturbs no running instance);
- MIG mode is toggled only on a GPU that holds no work (on for MIG demand, off for whole-GPU demand);
- at most one change per GPU per `min_interval_s` (an hour by default): a layout change stops the
  GPU's idle instances and, on Kubernetes, cordons the node while the GPU Operator's MIG manager
  applies the `nvidia.com/mig.config` label, so changes are kept rare.

The queue is served first by idle instances that already exist, then GPU by GPU (MIG GPUs with the
fewest free slices first, then idle GPUs without MIG) with the layout that serves the most queued
GPU-equivalents, drains the fewest idle instances, and leaves the free slices most useful to the
queued mix (`mig.most_instances`: the same lookahead the packer scores placements with). Each change
becomes a `MigLayoutPlanned` event (`events.fleet`); the agent or the Kubernetes actuator reports
`MigLayoutApplied` once the GPU has it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from events.fleet import MigInstance, MigLayoutPlanned
from services.scheduler.core.mig import Instance, MigModel, mig_model, most_instances, span, used_mask

GpuKey = tuple[str, str, int]  # cluster, node, GPU index
HOUR = 3600.0


@dataclass(frozen=True)
class MigGpu:
    key: GpuKey
    model: str
    mig_enabled: bool
    layout: tuple[Instance, ...] = ()
    busy: frozenset[Instance] = frozenset()  # instances holding work
    whole_busy: bool = False  # MIG off and the GPU holds work
    last_change: float | None = None

    @property
    def idle(self) -> bool:
        return not self.busy and not self.whole_busy


@dataclass(frozen=True)
class LayoutChange:
    gpu: MigGpu
    after: tuple[Instance, ...]
    drain: tuple[Instance, ...]
    create: tuple[Instance, ...]
    enable_mig: bool = False
    disable_mig: bool = False
    serves: dict[str, int] = field(default_factory=dict)  # profile -> queued requests it serves

    def event(self, at: float, reason: str = "") -> MigLayoutPlanned:
        cluster, node, index = self.gpu.key
        return MigLayoutPlanned(
            cluster=cluster,
            node=node,
            gpu_index=index,
            at=at,
            model=self.gpu.model,
            before=_instances(self.gpu.layout),
            after=_instances(self.after),
            drain=_instances(self.drain),
            create=_instances(self.create),
            enable_mig=self.enable_mig,
            disable_mig=self.disable_mig,
            reason=reason,
            mig_config=mig_config_name(self.after) if not self.disable_mig else "all-disabled",
        )


def _instances(layout: Iterable[Instance]) -> list[MigInstance]:
    return [MigInstance(profile=p, start=s) for p, s in layout]


def mig_config_name(layout: Iterable[Instance]) -> str:
    """A name for the layout in the GPU Operator's mig-parted config style ("custom-1x3g.40gb-2x1g.10gb")."""
    counts = Counter(p for p, _ in layout)
    return "custom-" + "-".join(f"{n}x{p}" for p, n in sorted(counts.items())) if counts else "all-enabled"


def changeable(gpu: MigGpu, now: float, min_interval_s: float) -> bool:
    return gpu.last_change is None or now - gpu.last_change >= min_interval_s


def plan(
    gpus: Sequence[MigGpu],
    demand: Counter[str] | dict[str, int],
    now: float,
    *,
    whole_demand: int = 0,
    min_interval_s: float = HOUR,
    rewrites_whole_gpu: bool = False,
) -> list[LayoutChange]:
    """Layout changes that let the queued MIG requests (`demand`: profile -> count) and whole-GPU
    requests (`whole_demand`) run, within the rules above. `rewrites_whole_gpu`: the change will be
    applied by a tool that recreates every instance of a GPU it reconfigures (the GPU Operator's MIG
    manager), so only GPUs none of whose instances hold work are changed."""
    remaining = Counter({p: n for p, n in demand.items() if n > 0})
    reserved: dict[GpuKey, set[Instance]] = {}
    for gpu in gpus:  # idle instances that exist already serve first, with no change
        if gpu.mig_enabled:
            for inst in gpu.layout:
                if inst not in gpu.busy and remaining[inst[0]] > 0:
                    remaining[inst[0]] -= 1
                    reserved.setdefault(gpu.key, set()).add(inst)
    out: list[LayoutChange] = []
    free_whole = sum(1 for g in gpus if not g.mig_enabled and g.idle)
    for gpu in _by_room(gpus):
        if not changeable(gpu, now, min_interval_s) or (rewrites_whole_gpu and gpu.busy):
            continue
        table = mig_model(gpu.model)
        if whole_demand > free_whole and gpu.mig_enabled and not gpu.busy and not reserved.get(gpu.key):
            out.append(LayoutChange(gpu, (), tuple(gpu.layout), (), disable_mig=True))
            free_whole += 1
            continue
        if table is None or +remaining == Counter():
            continue
        if not gpu.mig_enabled and (not gpu.idle or free_whole <= whole_demand):
            continue  # holds work, or whole-GPU requests need it as it is
        change = _best_change(table, gpu, reserved.get(gpu.key, set()), remaining)
        if change is not None:
            out.append(change)
            remaining -= Counter(change.serves)
            free_whole -= change.enable_mig
    return out


def _by_room(gpus: Sequence[MigGpu]) -> list[MigGpu]:
    """MIG GPUs first, the fullest first (new instances go where others run, so other GPUs can empty
    and go back to whole-GPU work); then GPUs without MIG."""

    def room(g: MigGpu) -> tuple[int, int, GpuKey]:
        table = mig_model(g.model)
        if table is None or not g.mig_enabled:
            return (1, 0, g.key)
        busy = used_mask(table, g.busy)
        return (0, bin(table.full_mask() & ~busy).count("1"), g.key)

    return sorted(gpus, key=room)


def _best_change(table: MigModel, gpu: MigGpu, keep: set[Instance], remaining: Counter[str]) -> LayoutChange | None:
    fixed = set(gpu.busy) | keep
    removable = [i for i in gpu.layout if i not in fixed] if gpu.mig_enabled else []
    fixed_mask = used_mask(table, fixed)
    wanted = [p for p in table.profiles if remaining[p] > 0]
    best: tuple[tuple[int, int, float], list[Instance]] | None = None
    for created in _packings(table, fixed_mask, wanted, remaining):
        if not created:
            continue
        new_mask = used_mask(table, created)
        drained = [i for i in removable if used_mask(table, [i]) & new_mask]
        kept = [i for i in removable if i not in drained]
        leftover = fixed_mask | new_mask | used_mask(table, kept)
        served = sum(table.share_milli(p) for p, _ in created)
        score = (served, -len(drained), _usefulness(table, leftover, remaining, created))
        if best is None or score > best[0]:
            best = (score, created)
    if best is None:
        return None
    created = best[1]
    new_mask = used_mask(table, created)
    drain = tuple(i for i in removable if used_mask(table, [i]) & new_mask)
    after = tuple(sorted((*fixed, *(i for i in removable if i not in drain), *created), key=lambda i: (i[1], i[0])))
    return LayoutChange(
        gpu,
        after,
        drain,
        tuple(created),
        enable_mig=not gpu.mig_enabled,
        serves=dict(Counter(p for p, _ in created)),
    )


def _usefulness(table: MigModel, used: int, remaining: Counter[str], created: list[Instance]) -> float:
    """How much of what is still queued (after this layout) the free slices left could hold."""
    after = remaining - Counter(p for p, _ in created)
    total = sum(after.values()) or 1
    return sum(n / total * most_instances(table, used, p) * table.share_milli(p) for p, n in after.items())


def _packings(table: MigModel, used: int, wanted: list[str], remaining: Counter[str]) -> Iterable[list[Instance]]:
    """Every set of new instances of the wanted profiles that fits the free slices (at most as many of
    each as are queued), by a walk over memory slices from 0."""

    def walk(slice_: int, used: int, counts: Counter[str]) -> Iterable[list[Instance]]:
        if slice_ >= table.memory_slices:
            yield []
            return
        yield from walk(slice_ + 1, used, counts)  # leave this slice as it is
        for name in wanted:
            p = table.profiles[name]
            if slice_ in p.starts and counts[name] < remaining[name] and not used & span(p, slice_):
                if p.max_instances is not None and counts[name] >= p.max_instances:
                    continue
                counts[name] += 1
                for rest in walk(slice_ + p.memory, used | span(p, slice_), counts):
                    yield [(name, slice_), *rest]
                counts[name] -= 1

    yield from walk(0, used, Counter())
