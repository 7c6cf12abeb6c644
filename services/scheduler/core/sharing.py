"""Shared-GPU placement: whole GPUs and fractions of one GPU, scored by what a placement leaves for the
requests that are expected next.

A GPU is a capacity of 1000 milli-GPU (and its memory); a request takes either part of one GPU (`num_gpu
== 1`, `gpu_milli < 1000`, a share) or `num_gpu` whole GPUs. Nodes also carry CPU and memory, which every
placement respects, and at most `MAX_PODS` pods.

Nodes in the same state (model, CPU, memory, the multiset of GPU capacity left) are interchangeable, so
the packer keeps them in groups keyed by that state and scores each distinct state once per request; the
fragmentation of a state for a given request mix is cached. A 1,213-node inventory has a few hundred
distinct states at most, which is what keeps one placement within a couple of milliseconds.

MIG GPUs (a node with `mig=True` and a model in `mig.MIG_MODELS`) serve MIG requests only (`mig_profile`
set): a request fits where one of the profile's legal placements is free, and the packer chooses the
node, the GPU and the start slice with the same scorer, its fragmentation counting, for every expected
shape, the capacity left that the shape could no longer be made in (`mig.most_instances`). A MIG GPU's
capacity in milli-GPU is what its instances' shares (`MigModel.share_milli`) leave.

Policies are small scoring functions in `POLICIES` (lower is better); ties end at the lowest node index,
so runs are deterministic.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.scheduler.core.mig import (
    MIG_MODELS,
    MigError,
    MigModel,
    mig_model,
    most_instances,
    occupancy,
    profile_of,
    starts_in_mask,
)

MILLI = 1000  # milli-GPU in one GPU
MAX_PODS = 1001  # pods one node may hold (the kubelet default is 110; the openb protocol allows 1001)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks for. `gpu_milli` is per GPU; `models` is an allow-list (empty: any model).
    A MIG request (`mig_profile`, e.g. "1g.10gb") takes one instance on one MIG GPU; its `gpu_milli` is
    the instance's share of a GPU (`mig_request` fills it in)."""

    cpu_milli: int = 0
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    models: frozenset[str] = frozenset()
    mig_profile: str = ""

    @property
    def shares(self) -> bool:
        """Part of one GPU by time or SM share, which other such pods may share."""
        return not self.mig_profile and self.num_gpu == 1 and 0 < self.gpu_milli < MILLI

    @property
    def per_gpu(self) -> int:
        """Milli-GPU it needs free on each GPU it takes (a whole GPU unless it shares one or is MIG)."""
        if self.num_gpu == 0:
            return 0
        return self.gpu_milli if self.shares or self.mig_profile else MILLI

    @property
    def gpu_milli_total(self) -> int:
        """Milli-GPU it takes in all (what FGD's protocol counts as requested)."""
        return self.per_gpu * self.num_gpu

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models


def mig_request(profile: str, model: str, cpu_milli: int = 0, memory_mib: int = 0) -> PodRequest:
    """A request for one `profile` instance on a MIG GPU of `model` (MigError if it has no such profile)."""
    profile_of(model, profile)
    table = mig_model(model)
    assert table is not None
    return PodRequest(cpu_milli, memory_mib, 1, table.share_milli(profile), frozenset({model}), profile)


def mig_request_on_any(
    profile: str, models: frozenset[str] = frozenset(), cpu_milli: int = 0, memory_mib: int = 0
) -> PodRequest:
    """A request for one `profile` instance on any of `models` (empty: any MIG model) that has it; its
    share is the first such model's. MigError when none has the profile."""
    having = sorted(m for m in (models or MIG_MODELS) if (t := mig_model(m)) and profile in t.profiles)
    if not having:
        where = f"among {', '.join(sorted(models))} " if models else ""
        raise MigError(f"no GPU model {where}has MIG profile {profile!r}")
    first = mig_request(profile, having[0], cpu_milli, memory_mib)
    return PodRequest(cpu_milli, memory_mib, 1, first.gpu_milli, frozenset(having), profile)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    mig: bool = False  # its GPUs are in MIG mode (and serve MIG requests only)


# The state nodes are grouped by: model, CPU left, memory left, whether the pod limit is reached, the
# GPU capacity left per GPU, sorted (GPUs of one node are interchangeable here), and on MIG nodes the
# (used memory-slice mask, capacity left) per GPU, sorted (empty elsewhere).
MigGpu = tuple[int, int]
State = tuple[str, int, int, bool, tuple[int, ...], tuple[MigGpu, ...]]


@dataclass(slots=True)
class _Node:
    spec: NodeSpec
    cpu_left: int
    mem_left: int
    gpu_left: list[int]  # per GPU index
    pods: int = 0
    mig_used: list[int] = field(default_factory=list)  # per GPU index, on MIG nodes: memory slices taken

    def state(self) -> State:
        return (
            self.spec.model,
            self.cpu_left,
            self.mem_left,
            self.pods >= MAX_PODS,
            tuple(sorted(self.gpu_left)),
            tuple(sorted(zip(self.mig_used, self.gpu_left, strict=True))) if self.mig_used else (),
        )


def _mig_table(state: State, pod: PodRequest) -> MigModel | None:
    """The MIG table a MIG request would use on a node in `state` (None: it cannot run there)."""
    if not state[5]:
        return None
    table = mig_model(state[0])
    return table if table is not None and pod.mig_profile in table.profiles else None


def fits_state(state: State, pod: PodRequest, need: int | None = None) -> bool:
    """Whether a node in `state` can hold the pod (`need`: its `per_gpu`, when the caller has it)."""
    model, cpu, mem, full, gpus, mig = state
    if full or cpu < pod.cpu_milli or mem < pod.memory_mib or (pod.models and model not in pod.models):
        return False
    if pod.num_gpu == 0:
        return True
    if pod.mig_profile or mig:  # MIG requests only on MIG GPUs, and MIG GPUs only for them
        table = _mig_table(state, pod)
        return table is not None and any(starts_in_mask(table, used, pod.mig_profile) for used, _ in mig)
    # `gpus` is sorted: the GPUs with at least `need` left are the tail from the first such one.
    return len(gpus) - bisect_left(gpus, pod.per_gpu if need is None else need) >= pod.num_gpu


# One way a pod can land on a node: the GPU capacity left after it (sorted), the MIG GPUs after it
# (sorted), and for a MIG request the GPU state it goes on and the start slice.
Option = tuple[tuple[int, ...], tuple[MigGpu, ...], MigGpu | None, int | None]


def _mig_options(state: State, pod: PodRequest) -> list[Option]:
    table = _mig_table(state, pod)
    if table is None:
        return []
    share = table.share_milli(pod.mig_profile)
    mig = state[5]
    out: list[Option] = []
    for i, gpu in enumerate(mig):
        if gpu in mig[:i]:
            continue  # an identical GPU gives identical options
        used, left = gpu
        for start in starts_in_mask(table, used, pod.mig_profile):
            after_gpu = (used | occupancy(table, pod.mig_profile, start), left - share)
            new_mig = tuple(sorted((*mig[:i], after_gpu, *mig[i + 1 :])))
            out.append((tuple(sorted(g for _, g in new_mig)), new_mig, gpu, start))
    return out


def _options(state: State, pod: PodRequest) -> list[Option]:
    """The distinct ways the pod could land on a node in `state`.

    A share may go on any GPU with room (one option per distinct capacity left); whole GPUs are taken
    from the fullest-free ones that suffice (for whole GPUs every free GPU is alike); a MIG instance
    may go at any free legal start on any GPU (one option per distinct GPU state and start)."""
    gpus = state[4]
    if pod.num_gpu == 0:
        return [(gpus, state[5], None, None)]
    if pod.mig_profile:
        return _mig_options(state, pod)
    need = pod.per_gpu
    if pod.shares:
        out: list[Option] = []
        seen: set[int] = set()
        for i, g in enumerate(gpus):
            if g >= need and g not in seen:
                seen.add(g)
                out.append((tuple(sorted((*gpus[:i], g - need, *gpus[i + 1 :]))), (), None, None))
        return out
    left = list(gpus)
    taken = 0
    for i, g in enumerate(left):  # ascending: the tightest GPUs that still have room go first
        if g >= need and taken < pod.num_gpu:
            left[i] = g - need
            taken += 1
    return [(tuple(sorted(left)), (), None, None)]


def after(state: State, pod: PodRequest, option: Option, pods: int) -> State:
    model, cpu, mem, _, _, _ = state
    return (model, cpu - pod.cpu_milli, mem - pod.memory_mib, pods + 1 >= MAX_PODS, option[0], option[1])


# --- the expected request mix ------------------------------------------------------------------------


@dataclass
class Mix:
    """Request shapes and their probabilities: what the packer expects to be asked for next.

    Built from the recent GPU requests: the most frequent shapes covering `coverage` of them (FGD's
    "typical pods"; Chamber keeps every shape, coverage 1.0, which did better on the traces)."""

    shapes: list[tuple[PodRequest, float]] = field(default_factory=list)
    # CPU (milli) the expected GPU requests bring per milli-GPU they ask for (0 when they say nothing
    # of CPU), and the same with the CPU of pods without GPUs counted too (`Packer.cpu_ratio` chooses).
    cpu_per_milli: float = 0.0
    cpu_per_milli_all: float = 0.0

    @classmethod
    def of(cls, pods: Iterable[PodRequest], coverage: float = 1.0) -> Mix:
        pods = list(pods)
        counts = Counter(p for p in pods if p.num_gpu > 0)
        total = sum(counts.values())
        if not total:
            return cls()
        gpu_milli = sum(p.gpu_milli_total for p in pods)
        cpu_all = sum(p.cpu_milli for p in pods) / gpu_milli if gpu_milli else 0.0
        chosen: list[tuple[PodRequest, int]] = []
        covered = 0
        # Most frequent first; ties by shape so the mix is the same in every run.
        for shape, n in sorted(counts.items(), key=lambda kv: (-kv[1], _shape_key(kv[0]))):
            if covered >= coverage * total:
                break
            chosen.append((shape, n))
            covered += n
        gpu_milli = sum(n * shape.gpu_milli_total for shape, n in chosen)
        cpu_per_milli = sum(n * shape.cpu_milli for shape, n in chosen) / gpu_milli if gpu_milli else 0.0
        return cls([(shape, n / covered) for shape, n in chosen], cpu_per_milli, cpu_all)


def _shape_key(p: PodRequest) -> tuple[int, int, int, int, tuple[str, ...]]:
    return (p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib, tuple(sorted(p.models)))


def stranded(state: State, cpu_per_milli: float) -> float:
    """Milli-GPU left on a node that its CPU left could not feed at `cpu_per_milli` (0 when that is 0):
    what the node would strand if the expected requests filled it."""
    if not cpu_per_milli:
        return 0.0
    return max(0.0, sum(state[4]) - state[1] / cpu_per_milli)


def fragment(state: State, mix: Mix, with_memory: bool = False) -> float:
    """FGD's fragmentation of a node state for a request mix (Weng et al., ATC '23): for each expected
    shape, the GPU capacity left that the shape could not use — all of it when the shape cannot run
    on the node at all (model, CPU, GPU), else the GPUs whose capacity left is below its per-GPU need —
    weighted by the shape's probability. `with_memory` also counts host memory as a reason a shape
    cannot run (FGD's own definition looks at CPU and GPU only). On MIG nodes: `mig_fragment`."""
    model, cpu, mem, full, gpus, mig = state
    left = sum(gpus)
    if left == 0:
        return 0.0
    if mig:
        return mig_fragment(state, mix, with_memory)
    total = 0.0
    for shape, p in mix.shapes:
        if (
            full
            or not shape.allows(model)
            or cpu < shape.cpu_milli
            or (with_memory and mem < shape.memory_mib)
            or shape.num_gpu == 0
            or shape.mig_profile
        ):
            total += p * left
            continue
        need = shape.per_gpu
        usable = sum(1 for g in gpus if g >= need)
        if usable < shape.num_gpu:
            total += p * left
        else:
            total += p * sum(g for g in gpus if g < need)
    return total


def mig_fragment(state: State, mix: Mix, with_memory: bool = False) -> float:
    """Fragmentation of a MIG node state: for each expected shape, the capacity left that the shape
    could not be made in — all of it where it cannot run on the node (not MIG, model, CPU, memory,
    no such profile), else per GPU what is left after as many instances of it as still fit."""
    model, cpu, mem, full, gpus, mig = state
    table = mig_model(model)
    left = sum(gpus)
    total = 0.0
    for shape, p in mix.shapes:
        if (
            table is None
            or full
            or not shape.mig_profile
            or shape.mig_profile not in table.profiles
            or not shape.allows(model)
            or cpu < shape.cpu_milli
            or (with_memory and mem < shape.memory_mib)
        ):
            total += p * left
            continue
        share = table.share_milli(shape.mig_profile)
        total += p * sum(max(0, g - share * most_instances(table, used, shape.mig_profile)) for used, g in mig)
    return total


class _MixArrays:
    """The mix as columns, so `fragment` of one state is a handful of vector operations (the same
    arithmetic as `fragment`, which stays the readable definition the tests compare this with).

    A state's fragmentation depends on its CPU and memory only through which shapes they can hold, so
    it is kept by the rank of the CPU (and memory) left among the shapes' distinct asks: nodes whose
    CPU left differs by a pod that asks for no threshold in between share one entry. The parts that
    depend on the GPUs alone, and on the model and host alone, are kept too."""

    def __init__(self, mix: Mix, models: Iterable[str]) -> None:
        shapes = [s for s, _ in mix.shapes]
        self.p = np.array([p for _, p in mix.shapes], dtype=np.float64)
        self.cpu = np.array([s.cpu_milli for s in shapes], dtype=np.int64)
        self.mem = np.array([s.memory_mib for s in shapes], dtype=np.int64)
        self.need = np.array([s.per_gpu for s in shapes], dtype=np.int64)
        self.num = np.array([s.num_gpu if not s.mig_profile else 0 for s in shapes], dtype=np.int64)
        self.allowed = {m: np.array([s.allows(m) for s in shapes], dtype=bool) for m in models}
        self.cpus = sorted({s.cpu_milli for s in shapes})
        self.mems = sorted({s.memory_mib for s in shapes})
        self._kept: dict[tuple[str, int, int, tuple[int, ...]], float] = {}
        self._host: dict[tuple[str, int, int], np.ndarray] = {}  # shapes the model, CPU, memory allow
        self._gpus: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}  # shapes that fit, what stays

    def fragment(self, state: State, with_memory: bool) -> float:
        model, cpu, mem, full, gpus, _ = state
        left = sum(gpus)
        if left == 0 or not len(self.p):
            return 0.0
        if full:
            return float(self.p.sum() * left)
        ci = bisect_right(self.cpus, cpu)
        mi = bisect_right(self.mems, mem) if with_memory else -1
        key = (model, ci, mi, gpus)
        value = self._kept.get(key)
        if value is not None:
            return value
        host = self._host.get(key[:3])
        if host is None:
            host = self.allowed[model] & (self.cpu <= cpu)
            if with_memory:
                host &= self.mem <= mem
            self._host[(model, ci, mi)] = host
        parts = self._gpus.get(gpus)
        if parts is None:
            ordered = np.asarray(gpus, dtype=np.int64)  # already sorted ascending
            below = np.searchsorted(ordered, self.need, side="left")  # GPUs with less than the need
            prefix = np.concatenate(([0], np.cumsum(ordered)))
            parts = self._gpus[gpus] = ((self.num > 0) & (len(gpus) - below >= self.num), prefix[below])
        fits, unusable = parts
        value = self._kept[key] = float(self.p @ np.where(host & fits, unusable, left))
        return value


# --- policies: score(packer, state, option_state, node spec) -> lower is better -------------------------

Score = Callable[["Packer", State, State, NodeSpec, PodRequest], float]


def _bestfit(packer: Packer, before: State, new: State, spec: NodeSpec, pod: PodRequest) -> float:
    """Least capacity left on the node after the placement (GPU and CPU, each as a share of the node)."""
    gpu_cap = spec.gpus * MILLI
    gpu = sum(new[4]) / gpu_cap if gpu_cap else 0.0
    return gpu + new[1] / spec.cpu_milli if spec.cpu_milli else gpu


def _fgd(packer: Packer, before: State, new: State, spec: NodeSpec, pod: PodRequest) -> float:
    """FGD: the smallest growth of the node's fragmentation for the expected mix, scored as the authors'
    simulator scores it (hkust-adsl/kubernetes-scheduler-simulator, `fgd_score.go`): a Kubernetes
    node score, the integer part of 100 x sigmoid(fragmentation decrease / 1000), so growths within a
    few tens of milli-GPU tie (here the lowest node index wins them; Kubernetes picks among them at
    random). The exact growth, unrounded, allocates 0.8 to 2.9 points less on the openb lists."""
    decrease = packer.frag(before) - packer.frag(new)
    return -float(int(100 / (1 + math.exp(-decrease / 1000))))


# Chamber's weights: BESTFIT_WEIGHT chosen on the openb `default` and `gpushare100` traces (seeds 0, 1),
# STRANDING_WEIGHT on `default` and `gpushare100` (seeds 0, 1), its CPU ratio (`Mix.cpu_per_milli`) on
# those and `gpuspec25` and `cpu250` (seed 0); GPU-model scarcity has no constant of its own (it weighs
# the milli-GPU it expects refused as stranding does). Every other trace is held out (bench/packing.py
# says which).
BESTFIT_WEIGHT = 50.0  # milli-GPU of fragmentation one node's worth of GPU left is worth
STRANDING_WEIGHT = 3.0  # milli-GPU of penalty per milli-GPU a placement strands for want of CPU


def _chamber(packer: Packer, before: State, new: State, spec: NodeSpec, pod: PodRequest) -> float:
    """FGD's gradient (host memory counted too), plus best fit on GPUs (so ties and near-ties go to
    the node the placement leaves fullest), plus CPU stranding: the growth of the GPU capacity the
    node's CPU could no longer feed at the expected requests' CPU per milli-GPU (so CPU-heavy pods go
    where CPU is plentiful, CPU-light ones and pods without GPUs where it is not needed). GPU-model
    scarcity, which depends on the whole fleet's free capacity, is added per model by `_chamber_model`."""
    grad = packer.frag(new, with_memory=True) - packer.frag(before, with_memory=True)
    gpu_cap = spec.gpus * MILLI
    left = sum(new[4]) / gpu_cap if gpu_cap else 0.0
    strand = stranded(new, packer.cpu_ratio) - stranded(before, packer.cpu_ratio)
    return grad + BESTFIT_WEIGHT * left + STRANDING_WEIGHT * strand


def _chamber_model(packer: Packer, model: str, pod: PodRequest) -> float:
    """GPU-model scarcity: each milli-GPU placed on a model is a milli-GPU that requests tied to that
    model may later be refused, with about the chance that they fill what is free of it
    (`Packer.tightness`, capped at 1), weighed as the stranding term weighs milli-GPU that go unused.
    So pods that may run elsewhere leave a tight model to those that need it, and a pod restricted to
    several models goes to the least tight one."""
    return STRANDING_WEIGHT * min(1.0, packer.tightness(model)) * pod.gpu_milli_total


POLICIES: dict[str, Score] = {"bestfit": _bestfit, "fgd": _fgd, "chamber": _chamber}

# Per-policy terms that depend on the node's model and the whole fleet's state (not the node's state
# alone), so they are added to a group's kept score at each placement: (packer, model, pod) -> cost.
ModelCost = Callable[["Packer", str, PodRequest], float]
MODEL_COSTS: dict[str, ModelCost] = {"chamber": _chamber_model}


@dataclass(slots=True)
class _Group:
    """The nodes in one state: their ids, the lowest of them (ties go to it), and per request shape
    the best option there and its score (None: the shape does not fit), while the mix stays."""

    members: set[int]
    first: int
    roomy: bool  # the first node has room for more than one more pod (else nothing is kept)
    best: dict[int, tuple[float, Option] | None] = field(default_factory=dict)  # by `Packer._shapes`


_UNSCORED: Any = object()


class PackError(ValueError):
    """An inventory or request the packer cannot use (bad numbers, unknown policy)."""


@dataclass(frozen=True, slots=True)
class Spot:
    """Where a pod was placed: node, GPU indices, and for a MIG request the instance's start slice."""

    node: str
    gpus: list[int]
    mig_start: int | None = None


class Packer:
    """Places pods on an inventory, once each, irrevocably; `place` returns (node name, GPU indices),
    `place_at` a `Spot` (which also names a MIG instance's start slice)."""

    def __init__(self, nodes: Sequence[NodeSpec], policy: str = "chamber", mix: Mix | None = None) -> None:
        if policy not in POLICIES:
            raise PackError(f"unknown policy {policy!r}; choose one of {', '.join(sorted(POLICIES))}")
        self.policy = policy
        self._score = POLICIES[policy]
        self._model_cost = MODEL_COSTS.get(policy)
        for n in nodes:
            if n.mig and mig_model(n.model) is None:
                raise PackError(f"node {n.name}: GPU model {n.model!r} has no MIG table")
        self.nodes = [
            _Node(n, n.cpu_milli, n.memory_mib, [MILLI] * n.gpus, mig_used=[0] * n.gpus if n.mig else []) for n in nodes
        ]
        self.groups: dict[State, _Group] = {}
        for i, node in enumerate(self.nodes):
            self._join(node.state(), i)
        # Scores depend on the node state alone under these policies (best-fit also on the node's CPU
        # capacity), so each group keeps its best option per request shape until the mix changes.
        self._cached = policy != "bestfit"
        self._shapes: dict[PodRequest, int] = {}  # request shapes seen, numbered
        self.mix = mix or Mix()
        self._frag: dict[tuple[State, bool], float] = {}
        # Free milli-GPU per model and in all, kept as pods are placed (what model scarcity weighs).
        self._free: dict[str, int] = {}
        for node in self.nodes:
            self._free[node.spec.model] = self._free.get(node.spec.model, 0) + node.spec.gpus * MILLI
        self._free_total = sum(self._free.values())
        self._tied: dict[str, float] = {}
        self.set_mix(self.mix)

    def set_mix(self, mix: Mix) -> None:
        self.mix = mix
        self._frag.clear()
        for group in self.groups.values():
            group.best.clear()
        self._columns = _MixArrays(mix, {n.spec.model for n in self.nodes})
        self._tied = _tied_demand(mix, {n.spec.model for n in self.nodes if n.spec.gpus})
        # CPU per milli-GPU the stranding term expects: the GPU requests' own, unless the requests with
        # pods without GPUs counted ask more CPU per GPU than the fleet has (CPU is the scarcer
        # resource), when those pods' CPU is counted too, as they then compete for it.
        cpu = sum(n.spec.cpu_milli for n in self.nodes)
        gpu = sum(n.spec.gpus for n in self.nodes) * MILLI
        fleet = cpu / gpu if gpu else 0.0
        self.cpu_ratio = mix.cpu_per_milli_all if mix.cpu_per_milli_all > fleet else mix.cpu_per_milli

    def frag(self, state: State, with_memory: bool = False) -> float:
        key = (state, with_memory)
        value = self._frag.get(key)
        if value is None:
            if state[5]:
                value = mig_fragment(state, self.mix, with_memory)
            else:
                value = self._columns.fragment(state, with_memory)
            self._frag[key] = value
        return value

    def tightness(self, model: str) -> float:
        """How tight a GPU model is now: the share of the expected GPU demand tied to it (requests whose
        allow-list names it, split evenly over their list) against its share of the fleet's free GPU
        capacity (0: no request needs it; 1: if the free capacity filled up with the expected mix, the
        requests tied to it would just fill it; above 1 they would not fit)."""
        tied = self._tied.get(model, 0.0)
        if not tied:
            return 0.0
        free = self._free.get(model, 0)
        return tied * self._free_total / free if free else 0.0

    def place(self, pod: PodRequest) -> tuple[str, list[int]] | None:
        """Choose and take a place for `pod`; None when no node can hold it (nothing changes then)."""
        spot = self.place_at(pod)
        return None if spot is None else (spot.node, spot.gpus)

    def place_at(self, pod: PodRequest) -> Spot | None:
        """`place`, also saying at which slice a MIG instance starts."""
        best: tuple[float, int, State, Option] | None = None
        need = pod.per_gpu
        cached = self._cached
        nodes = self.nodes
        shape = self._shapes.setdefault(pod, len(self._shapes))  # hashed once, not once per group
        model_cost = self._model_cost
        costs: dict[str, float] = {}  # per model, for this pod
        for state, group in self.groups.items():
            found = group.best.get(shape, _UNSCORED) if cached else _UNSCORED
            if found is _UNSCORED:
                found = self._best_option(state, group, pod, shape, need)
            if found is None:
                continue
            score, option = found
            if model_cost is not None:
                extra = costs.get(state[0])
                if extra is None:
                    extra = costs[state[0]] = model_cost(self, state[0], pod)
                score += extra
            if best is None or score <= best[0]:
                nid = group.first
                if best is None or score < best[0] or nid < best[1]:
                    best = (score, nid, state, option)
        if best is None:
            return None
        _, nid, state, option = best
        return Spot(nodes[nid].spec.name, self._take(nid, state, pod, option), option[3])

    def _best_option(
        self, state: State, group: _Group, pod: PodRequest, shape: int, need: int
    ) -> tuple[float, Option] | None:
        """The lowest-scoring way the pod can land on the group's first node (the first such on ties),
        None when it cannot; kept for the group while its first node has room (`_lead`)."""
        if not fits_state(state, pod, need):
            found = None
        else:
            node = self.nodes[group.first]
            found = None
            for option in _options(state, pod):
                score = self._score(self, state, after(state, pod, option, node.pods), node.spec, pod)
                if found is None or score < found[0]:
                    found = (score, option)
        if self._cached and group.roomy:
            group.best[shape] = found
        return found

    def _join(self, state: State, nid: int) -> None:
        group = self.groups.get(state)
        if group is None:
            self.groups[state] = _Group({nid}, nid, self._roomy(nid))
        else:
            group.members.add(nid)
            if nid < group.first:
                self._lead(group, nid)

    def _roomy(self, nid: int) -> bool:
        return self.nodes[nid].pods + 1 < MAX_PODS

    def _lead(self, group: _Group, nid: int) -> None:
        """Make `nid` the group's first node: what is kept holds only while that node has room for more
        than one more pod (a state says whether its nodes are full, not how many pods they hold)."""
        group.first = nid
        roomy = self._roomy(nid)
        if not roomy:
            group.best.clear()
        group.roomy = roomy

    def _take(self, nid: int, state: State, pod: PodRequest, option: Option) -> list[int]:
        node = self.nodes[nid]
        had = sum(node.gpu_left)
        group = self.groups[state]
        group.members.discard(nid)
        if not group.members:
            del self.groups[state]
        elif nid == group.first:
            self._lead(group, min(group.members))
        if pod.mig_profile:
            chosen = [_mig_index(node, option)]
            table = mig_model(node.spec.model)
            assert table is not None and option[3] is not None
            node.mig_used[chosen[0]] |= occupancy(table, pod.mig_profile, option[3])
            node.gpu_left[chosen[0]] -= table.share_milli(pod.mig_profile)
        else:
            chosen = _indices(node.gpu_left, pod, option[0])
            for i in chosen:
                node.gpu_left[i] -= pod.per_gpu
        taken = had - sum(node.gpu_left)
        self._free[node.spec.model] -= taken
        self._free_total -= taken
        node.cpu_left -= pod.cpu_milli
        node.mem_left -= pod.memory_mib
        node.pods += 1
        self._join(node.state(), nid)
        return chosen

    def allocated_milli(self) -> int:
        return sum(n.spec.gpus * MILLI - sum(n.gpu_left) for n in self.nodes)

    def capacity_milli(self) -> int:
        return sum(n.spec.gpus * MILLI for n in self.nodes)


def _tied_demand(mix: Mix, models: Iterable[str]) -> dict[str, float]:
    """Per model (among `models`, those the fleet has): the share of the mix's expected GPU demand from
    requests restricted to a set of models that includes it, split evenly over the fleet's models in
    that set."""
    have = set(models)
    total = sum(p * shape.gpu_milli_total for shape, p in mix.shapes)
    if not total:
        return {}
    tied: dict[str, float] = {}
    for shape, p in mix.shapes:
        allowed = [m for m in shape.models if m in have]
        for m in allowed:
            tied[m] = tied.get(m, 0.0) + p * shape.gpu_milli_total / len(allowed) / total
    return tied


def _mig_index(node: _Node, option: Option) -> int:
    """The lowest GPU index in the MIG state the option goes on."""
    return next(i for i, gpu in enumerate(zip(node.mig_used, node.gpu_left, strict=True)) if gpu == option[2])


def _indices(gpu_left: list[int], pod: PodRequest, target: tuple[int, ...]) -> list[int]:
    """The GPU indices that turn `gpu_left` into the chosen (sorted) `target`: the lowest index among
    equal GPUs, so the answer is deterministic."""
    if pod.num_gpu == 0:
        return []
    need = pod.per_gpu
    if pod.shares:
        wanted = Counter(gpu_left)
        wanted.subtract(target)
        # The one capacity that shrank: the GPU that had it now has it minus `need`.
        had = next(g for g, n in sorted(wanted.items()) if n > 0)
        return [gpu_left.index(had)]
    order = sorted(range(len(gpu_left)), key=lambda i: (gpu_left[i], i))
    return sorted([i for i in order if gpu_left[i] >= need][: pod.num_gpu])
