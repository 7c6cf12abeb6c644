"""Shared-GPU placement: whole GPUs and fractions of one GPU, scored by what a placement leaves for the
requests that are expected next.

A GPU is a capacity of 1000 milli-GPU (and its memory); a request takes either part of one GPU (`num_gpu
== 1`, `gpu_milli < 1000`, a share) or `num_gpu` whole GPUs. Nodes also carry CPU and memory, which every
placement respects, and at most `MAX_PODS` pods.

Nodes in the same state (model, CPU, memory, the multiset of GPU capacity left) are interchangeable, so
the packer keeps them in groups keyed by that state and scores each distinct state once per request; the
fragmentation of a state for a given request mix is cached. A 1,213-node inventory has a few hundred
distinct states at most, which is what keeps one placement within a couple of milliseconds.

Policies are small scoring functions in `POLICIES` (lower is better); ties end at the lowest node index,
so runs are deterministic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

MILLI = 1000  # milli-GPU in one GPU
MAX_PODS = 1001  # pods one node may hold (the kubelet default is 110; the openb protocol allows 1001)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks for. `gpu_milli` is per GPU; `models` is an allow-list (empty: any model)."""

    cpu_milli: int = 0
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    models: frozenset[str] = frozenset()

    @property
    def shares(self) -> bool:
        """Part of one GPU, which other pods may share."""
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI

    @property
    def per_gpu(self) -> int:
        """Milli-GPU it needs free on each GPU it takes (a whole GPU unless it shares one)."""
        if self.num_gpu == 0:
            return 0
        return self.gpu_milli if self.shares else MILLI

    @property
    def gpu_milli_total(self) -> int:
        """Milli-GPU it takes in all (what FGD's protocol counts as requested)."""
        return self.per_gpu * self.num_gpu

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


# The state nodes are grouped by: model, CPU left, memory left, whether the pod limit is reached, and
# the GPU capacity left per GPU, sorted (GPUs of one node are interchangeable here).
State = tuple[str, int, int, bool, tuple[int, ...]]


@dataclass(slots=True)
class _Node:
    spec: NodeSpec
    cpu_left: int
    mem_left: int
    gpu_left: list[int]  # per GPU index
    pods: int = 0

    def state(self) -> State:
        return (
            self.spec.model,
            self.cpu_left,
            self.mem_left,
            self.pods >= MAX_PODS,
            tuple(sorted(self.gpu_left)),
        )


def fits_state(state: State, pod: PodRequest) -> bool:
    model, cpu, mem, full, gpus = state
    if full or cpu < pod.cpu_milli or mem < pod.memory_mib or not pod.allows(model):
        return False
    if pod.num_gpu == 0:
        return True
    need = pod.per_gpu
    return sum(1 for g in gpus if g >= need) >= pod.num_gpu


def _options(state: State, pod: PodRequest) -> list[tuple[int, ...]]:
    """The distinct GPU-left tuples (sorted) the pod could leave on a node in `state`.

    A share may go on any GPU with room (one option per distinct capacity left); whole GPUs are taken
    from the fullest-free ones that suffice (for whole GPUs every free GPU is alike)."""
    gpus = state[4]
    if pod.num_gpu == 0:
        return [gpus]
    need = pod.per_gpu
    if pod.shares:
        out = []
        seen: set[int] = set()
        for i, g in enumerate(gpus):
            if g >= need and g not in seen:
                seen.add(g)
                out.append(tuple(sorted((*gpus[:i], g - need, *gpus[i + 1 :]))))
        return out
    left = list(gpus)
    taken = 0
    for i, g in enumerate(left):  # ascending: the tightest GPUs that still have room go first
        if g >= need and taken < pod.num_gpu:
            left[i] = g - need
            taken += 1
    return [tuple(sorted(left))]


def after(state: State, pod: PodRequest, gpus: tuple[int, ...], pods: int) -> State:
    model, cpu, mem, _, _ = state
    return (model, cpu - pod.cpu_milli, mem - pod.memory_mib, pods + 1 >= MAX_PODS, gpus)


# --- the expected request mix ------------------------------------------------------------------------


@dataclass
class Mix:
    """Request shapes and their probabilities: what the packer expects to be asked for next.

    Built from the recent GPU requests: the most frequent shapes covering `coverage` of them (FGD's
    "typical pods"; Chamber keeps every shape, coverage 1.0, which did better on the traces)."""

    shapes: list[tuple[PodRequest, float]] = field(default_factory=list)

    @classmethod
    def of(cls, pods: Iterable[PodRequest], coverage: float = 1.0) -> Mix:
        counts = Counter(p for p in pods if p.num_gpu > 0)
        total = sum(counts.values())
        if not total:
            return cls()
        chosen: list[tuple[PodRequest, int]] = []
        covered = 0
        # Most frequent first; ties by shape so the mix is the same in every run.
        for shape, n in sorted(counts.items(), key=lambda kv: (-kv[1], _shape_key(kv[0]))):
            if covered >= coverage * total:
                break
            chosen.append((shape, n))
            covered += n
        return cls([(shape, n / covered) for shape, n in chosen])


def _shape_key(p: PodRequest) -> tuple[int, int, int, int, tuple[str, ...]]:
    return (p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib, tuple(sorted(p.models)))


def fragment(state: State, mix: Mix, with_memory: bool = False) -> float:
    """FGD's fragmentation of a node state for a request mix (Weng et al., ATC '23): for each expected
    shape, the GPU capacity left that the shape could not use — all of it when the shape cannot run
    on the node at all (model, CPU, GPU), else the GPUs whose capacity left is below its per-GPU need —
    weighted by the shape's probability. `with_memory` also counts host memory as a reason a shape
    cannot run (FGD's own definition looks at CPU and GPU only)."""
    model, cpu, mem, full, gpus = state
    left = sum(gpus)
    if left == 0:
        return 0.0
    total = 0.0
    for shape, p in mix.shapes:
        if (
            full
            or not shape.allows(model)
            or cpu < shape.cpu_milli
            or (with_memory and mem < shape.memory_mib)
            or shape.num_gpu == 0
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


class _MixArrays:
    """The mix as columns, so `fragment` of one state is a handful of vector operations (the same
    arithmetic as `fragment`, which stays the readable definition the tests compare this with)."""

    def __init__(self, mix: Mix, models: Iterable[str]) -> None:
        shapes = [s for s, _ in mix.shapes]
        self.p = np.array([p for _, p in mix.shapes], dtype=np.float64)
        self.cpu = np.array([s.cpu_milli for s in shapes], dtype=np.int64)
        self.mem = np.array([s.memory_mib for s in shapes], dtype=np.int64)
        self.need = np.array([s.per_gpu for s in shapes], dtype=np.int64)
        self.num = np.array([s.num_gpu for s in shapes], dtype=np.int64)
        self.allowed = {m: np.array([s.allows(m) for s in shapes], dtype=bool) for m in models}

    def fragment(self, state: State, with_memory: bool) -> float:
        model, cpu, mem, full, gpus = state
        left = sum(gpus)
        if left == 0 or not len(self.p):
            return 0.0
        if full:
            return float(self.p.sum() * left)
        ordered = np.asarray(gpus, dtype=np.int64)  # already sorted ascending
        below = np.searchsorted(ordered, self.need, side="left")  # GPUs with less than the need
        prefix = np.concatenate(([0], np.cumsum(ordered)))
        runs = self.allowed[model] & (self.cpu <= cpu) & (self.num > 0) & (len(gpus) - below >= self.num)
        if with_memory:
            runs &= self.mem <= mem
        per_shape = np.where(runs, prefix[below], left)
        return float(self.p @ per_shape)


# --- policies: score(packer, state, option_state, node spec) -> lower is better -------------------------

Score = Callable[["Packer", State, State, NodeSpec, PodRequest], float]


def _bestfit(packer: Packer, before: State, new: State, spec: NodeSpec, pod: PodRequest) -> float:
    """Least capacity left on the node after the placement (GPU and CPU, each as a share of the node)."""
    gpu_cap = spec.gpus * MILLI
    gpu = sum(new[4]) / gpu_cap if gpu_cap else 0.0
    return gpu + new[1] / spec.cpu_milli if spec.cpu_milli else gpu


def _fgd(packer: Packer, before: State, new: State, spec: NodeSpec, pod: PodRequest) -> float:
    """FGD: the smallest growth of the node's fragmentation for the expected mix."""
    return packer.frag(new) - packer.frag(before)


# Chamber's weights: BESTFIT_WEIGHT chosen on the openb `default` and `gpushare100` traces (seeds 0, 1),
# SCARCITY_WEIGHT on `gpuspec25` (seed 0); every other trace is held out (bench/packing.py says which).
BESTFIT_WEIGHT = 50.0  # milli-GPU of fragmentation one node's worth of GPU left is worth
SCARCITY_WEIGHT = 0.5  # milli-GPU of penalty per milli-GPU placed on a model others depend on


def _chamber(packer: Packer, before: State, new: State, spec: NodeSpec, pod: PodRequest) -> float:
    """FGD's gradient (host memory counted too), plus best fit on GPUs (so ties and near-ties go to
    the node the placement leaves fullest), plus GPU-model scarcity: a placement on a model that
    requests restricted to few models depend on costs in proportion to how tight that model is."""
    grad = packer.frag(new, with_memory=True) - packer.frag(before, with_memory=True)
    gpu_cap = spec.gpus * MILLI
    left = sum(new[4]) / gpu_cap if gpu_cap else 0.0
    scarce = packer.model_demand(spec.model) * pod.gpu_milli_total
    return grad + BESTFIT_WEIGHT * left + SCARCITY_WEIGHT * scarce


POLICIES: dict[str, Score] = {"bestfit": _bestfit, "fgd": _fgd, "chamber": _chamber}


class PackError(ValueError):
    """An inventory or request the packer cannot use (bad numbers, unknown policy)."""


class Packer:
    """Places pods on an inventory, once each, irrevocably; `place` returns (node name, GPU indices)."""

    def __init__(self, nodes: Sequence[NodeSpec], policy: str = "chamber", mix: Mix | None = None) -> None:
        if policy not in POLICIES:
            raise PackError(f"unknown policy {policy!r}; choose one of {', '.join(sorted(POLICIES))}")
        self.policy = policy
        self._score = POLICIES[policy]
        self.nodes = [_Node(n, n.cpu_milli, n.memory_mib, [MILLI] * n.gpus) for n in nodes]
        self.groups: dict[State, set[int]] = {}
        for i, node in enumerate(self.nodes):
            self.groups.setdefault(node.state(), set()).add(i)
        self.mix = mix or Mix()
        self._frag: dict[tuple[State, bool], float] = {}
        self._model_demand: dict[str, float] = {}
        self.set_mix(self.mix)

    def set_mix(self, mix: Mix) -> None:
        self.mix = mix
        self._frag.clear()
        self._columns = _MixArrays(mix, {n.spec.model for n in self.nodes})
        self._model_demand = _model_scarcity(mix, self.nodes)

    def frag(self, state: State, with_memory: bool = False) -> float:
        key = (state, with_memory)
        value = self._frag.get(key)
        if value is None:
            value = self._frag[key] = self._columns.fragment(state, with_memory)
        return value

    def model_demand(self, model: str) -> float:
        """How much of the expected demand is tied to this model, against its share of the capacity
        (0: no request needs it; 1: requests that need it would fill it)."""
        return self._model_demand.get(model, 0.0)

    def place(self, pod: PodRequest) -> tuple[str, list[int]] | None:
        """Choose and take a place for `pod`; None when no node can hold it (nothing changes then)."""
        best: tuple[float, int, State, tuple[int, ...]] | None = None
        for state, members in self.groups.items():
            if not fits_state(state, pod):
                continue
            nid = min(members)
            node = self.nodes[nid]
            for gpus in _options(state, pod):
                new = after(state, pod, gpus, node.pods)
                score = self._score(self, state, new, node.spec, pod)
                key = (score, nid)
                if best is None or key < (best[0], best[1]):
                    best = (score, nid, state, gpus)
        if best is None:
            return None
        _, nid, state, gpus = best
        return self.nodes[nid].spec.name, self._take(nid, state, pod, gpus)

    def _take(self, nid: int, state: State, pod: PodRequest, target: tuple[int, ...]) -> list[int]:
        node = self.nodes[nid]
        members = self.groups[state]
        members.discard(nid)
        if not members:
            del self.groups[state]
        chosen = _indices(node.gpu_left, pod, target)
        for i in chosen:
            node.gpu_left[i] -= pod.per_gpu
        node.cpu_left -= pod.cpu_milli
        node.mem_left -= pod.memory_mib
        node.pods += 1
        self.groups.setdefault(node.state(), set()).add(nid)
        return chosen

    def allocated_milli(self) -> int:
        return sum(n.spec.gpus * MILLI - sum(n.gpu_left) for n in self.nodes)

    def capacity_milli(self) -> int:
        return sum(n.spec.gpus * MILLI for n in self.nodes)


def _model_scarcity(mix: Mix, nodes: Sequence[_Node]) -> dict[str, float]:
    """Per model: the expected GPU demand of requests restricted to a set of models that includes it
    (split evenly over that set), as a share of all expected GPU demand, over the model's share of the
    fleet's GPU capacity."""
    capacity: dict[str, int] = {}
    for n in nodes:
        capacity[n.spec.model] = capacity.get(n.spec.model, 0) + n.spec.gpus * MILLI
    total_cap = sum(capacity.values())
    total_demand = sum(p * shape.gpu_milli_total for shape, p in mix.shapes)
    if not total_cap or not total_demand:
        return {}
    tied: dict[str, float] = {}
    for shape, p in mix.shapes:
        allowed = [m for m in shape.models if capacity.get(m)]
        for m in allowed:
            tied[m] = tied.get(m, 0.0) + p * shape.gpu_milli_total / len(allowed)
    return {m: (d / total_demand) / (capacity[m] / total_cap) for m, d in tied.items()}


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
