"""The simulated fabric: NICs per node (rail-optimised: NIC i serves GPU i), topology labels, and the
iteration rhythm of the jobs that run across it.

The model (one step per sampling interval, time passed in): every rank of a job computes, then the job's
collective goes at the speed of the slowest link the gang crosses, so

    iteration time T = max over ranks of compute_r  +  bytes per iteration / min over ranks of bandwidth_r

and rank r is busy compute_r / T of the time (its SM activity), waiting the rest. A throttled GPU makes
compute_r longer (its peers wait), a degraded, erroring or congested link lowers bandwidth_r (everyone
waits), a link that is down stops the job (a hang). Slowdowns therefore FOLLOW from the faults; nothing
paints them on a verdict. Jobs on one node talk over NVLink and do not touch the NICs.

Deterministic: noise comes from the node's seeded RNG (`random.Random`), time from the caller.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from events.fabric import CommProgress, FabricSample, LinkState, NicSample

NIC_RATE_GBPS = 400.0
NICS_PER_NODE = 8
DEGRADED_RATE_GBPS = 200.0  # a downshift: 4 lanes of 100G train as 2
ERROR_RATE_PER_S = 400.0  # symbol errors while `nic_errors` is on
ERROR_BANDWIDTH = 0.55  # share of the link left once retransmissions are paid
CONGESTED_BANDWIDTH = 0.45  # share left under a PFC storm at the leaf
STORM_PAUSE_PER_S = 20_000.0  # pause frames per NIC per second under a storm
BACKGROUND_PAUSE_PER_S = 2.0  # a healthy fabric pauses now and then
FLAP_PERIOD_S = 8.0  # a flapping link is down FLAP_DOWN_S of every FLAP_PERIOD_S
FLAP_DOWN_S = 3.0
COMM_SHARE = 0.4  # at full link speed, communication is 40 % of an iteration
OPS_PER_ITERATION = 64  # NCCL collectives per training iteration
NOISE = 0.02  # per-rank jitter of compute time per interval


class FabricFault(StrEnum):
    """The fabric faults `chamber sim-fault` can inject (plus `gpu_slow`, a straggler GPU)."""

    NIC_DOWN = "nic_down"
    NIC_FLAP = "nic_flap"
    NIC_DEGRADED = "nic_degraded"
    NIC_ERRORS = "nic_errors"
    PFC_STORM = "pfc_storm"
    GPU_SLOW = "gpu_slow"


@dataclass(frozen=True)
class Topology:
    """Node i sits in rack i // nodes_per_rack; a leaf switch (per rail) serves nodes_per_leaf nodes; a
    spine serves leaves_per_spine leaves. Names are `<prefix>-<n>` with configurable prefixes."""

    nodes_per_rack: int = 4
    nodes_per_leaf: int = 8
    leaves_per_spine: int = 8
    rack_prefix: str = "rack"
    leaf_prefix: str = "leaf"
    spine_prefix: str = "spine"

    def labels(self, position: int) -> dict[str, str]:
        leaf = position // self.nodes_per_leaf
        return {
            "rack": f"{self.rack_prefix}-{position // self.nodes_per_rack}",
            "leaf": f"{self.leaf_prefix}-{leaf}",
            "spine": f"{self.spine_prefix}-{leaf // self.leaves_per_spine}",
        }


@dataclass
class SimNic:
    index: int
    rate_gbps: float = NIC_RATE_GBPS
    down: bool = False
    flapping_since: float | None = None
    degraded: bool = False
    erroring: bool = False
    # cumulative counters, as sysfs shows them
    tx_bytes: float = 0.0
    rx_bytes: float = 0.0
    errors: float = 0.0
    pause: float = 0.0
    flaps: int = 0
    _was_up: bool = True
    # this interval's traffic, set by the job model
    load_bytes_per_s: float = 0.0

    def clear(self) -> None:
        self.down = self.degraded = self.erroring = False
        self.flapping_since = None

    def is_up(self, now: float) -> bool:
        if self.down:
            return False
        if self.flapping_since is not None:
            return (now - self.flapping_since) % FLAP_PERIOD_S >= FLAP_DOWN_S
        return True

    def speed_gbps(self) -> float:
        return DEGRADED_RATE_GBPS if self.degraded else self.rate_gbps

    def bandwidth(self, now: float, congested: bool) -> float:
        """Usable bytes/s this interval (0: the link is down)."""
        if not self.is_up(now):
            return 0.0
        bw = self.speed_gbps() * 1e9 / 8
        if self.erroring:
            bw *= ERROR_BANDWIDTH
        if congested:
            bw *= CONGESTED_BANDWIDTH
        return bw


@dataclass
class JobRhythm:
    """One job's iteration model; `phase` scales compute (eval, checkpoint), `imbalance` per rank."""

    compute_s: float
    bytes_per_iteration: float
    phase: float = 1.0
    imbalance: dict[tuple[str, int], float] = field(default_factory=dict)
    iterations: float = 0.0
    iteration_s: float | None = None  # the last interval's T (None: hung)
    # seconds per iteration every rank waits outside GPUs and fabric (input pipeline, storage): all idle
    stall_s: float = 0.0

    @classmethod
    def of(cls, seed: int, job_id: str) -> JobRhythm:
        rng = random.Random(f"{seed}:rhythm:{job_id}")
        compute = rng.uniform(0.6, 1.2)
        full_bw = NIC_RATE_GBPS * 1e9 / 8
        return cls(compute_s=compute, bytes_per_iteration=COMM_SHARE * compute * full_bw)


@dataclass
class GpuLoad:
    """What the job model tells a GPU for this interval: busy share and clock factor."""

    duty: float = 1.0
    clock: float = 1.0


class SimFabric:
    """NICs and topology of every node of a simulated fleet, and the jobs' rhythm across them."""

    def __init__(self, seed: int, nodes: list[str], *, nics_per_node: int = NICS_PER_NODE,
                 topology: Topology | None = None) -> None:  # fmt: skip
        self.seed = seed
        self.topology = topology or Topology()
        self.nics = {n: [SimNic(i) for i in range(nics_per_node)] for n in nodes}
        self.labels = {n: self.topology.labels(i) for i, n in enumerate(nodes)}
        self.rng = {n: random.Random(f"{seed}:fabric:{n}") for n in nodes}
        self.congested_leaves: set[str] = set()
        self.slow_gpus: dict[tuple[str, int], float] = {}  # (node, gpu) -> clock factor
        self.rhythms: dict[str, JobRhythm] = {}
        self.ranks: dict[str, list[tuple[str, int]]] = {}  # job -> (node, gpu), sorted
        self.local: dict[str, list[tuple[str, str, int]]] = {}
        self.loads: dict[tuple[str, int], GpuLoad] = {}
        self._last: float | None = None

    # --- faults ---------------------------------------------------------------------------------

    def nic(self, node: str, index: int | None) -> SimNic:
        nics = self.nics[node]
        i = 0 if index is None else index
        if not 0 <= i < len(nics):
            raise IndexError(f"node {node} has NICs 0..{len(nics) - 1}; --nic {i} is not one")
        return nics[i]

    def inject(self, node: str, fault: FabricFault, nic: int | None, gpu: int | None, now: float) -> dict[str, object]:
        match fault:
            case FabricFault.PFC_STORM:
                leaf = self.labels[node]["leaf"]
                self.congested_leaves.add(leaf)
                return {"node": node, "kind": fault.value, "leaf": leaf}
            case FabricFault.GPU_SLOW:
                self.slow_gpus[(node, 0 if gpu is None else gpu)] = 0.5
                return {"node": node, "kind": fault.value, "gpu": 0 if gpu is None else gpu}
        n = self.nic(node, nic)
        match fault:
            case FabricFault.NIC_DOWN:
                n.down = True
            case FabricFault.NIC_FLAP:
                n.flapping_since = now
            case FabricFault.NIC_DEGRADED:
                n.degraded = True
            case FabricFault.NIC_ERRORS:
                n.erroring = True
        return {"node": node, "kind": fault.value, "nic": n.index}

    def clear(self, node: str, gpu: int | None = None, nic: int | None = None) -> None:
        """End the node's fabric faults (a storm at its leaf too); only one GPU's or NIC's if named."""
        if gpu is not None or nic is not None:
            if gpu is not None:
                self.slow_gpus.pop((node, gpu), None)
            if nic is not None:
                self.nic(node, nic).clear()
            return
        for n in self.nics[node]:
            n.clear()
        self.congested_leaves.discard(self.labels[node]["leaf"])
        for key in [k for k in self.slow_gpus if k[0] == node]:
            del self.slow_gpus[key]

    # --- jobs -----------------------------------------------------------------------------------

    def assign(self, allocations: Mapping[str, Mapping[int, str]], active: Mapping[str, bool]) -> None:
        """node -> GPU -> job; `active` says which jobs compute (idle jobs hold GPUs and do nothing)."""
        ranks: dict[str, list[tuple[str, int]]] = {}
        for node, gpus in allocations.items():
            for gpu, job in gpus.items():
                if active.get(job, False):
                    ranks.setdefault(job, []).append((node, gpu))
        self.ranks = {job: sorted(r) for job, r in ranks.items()}
        self.local = {}  # node -> [(job, communicator id, ranks here)]: what NCCL RAS shows there
        for job in sorted(self.ranks):
            comm = hashlib.sha256(job.encode()).hexdigest()[:16]
            counts: dict[str, int] = {}
            for node, _ in self.ranks[job]:
                counts[node] = counts.get(node, 0) + 1
            for node, n in counts.items():
                self.local.setdefault(node, []).append((job, comm, n))
        for job in self.ranks:
            if job not in self.rhythms:
                self.rhythms[job] = JobRhythm.of(self.seed, job)
        for job in [j for j in self.rhythms if j not in self.ranks]:
            del self.rhythms[job]

    def step(self, now: float) -> None:
        """Advance every job and NIC to `now`: iterations, GPU duty, link traffic and counters."""
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        for nics in self.nics.values():
            for n in nics:
                n.load_bytes_per_s = 0.0
        self.loads = {}
        for job in sorted(self.ranks):
            self._step_job(job, now, dt)
        for node in sorted(self.nics):
            self._count(node, now, dt)

    def _step_job(self, job: str, now: float, dt: float) -> None:
        r, ranks = self.rhythms[job], self.ranks[job]
        computes = {}
        for node, gpu in ranks:
            jitter = 1.0 + (self.rng[node].random() - 0.5) * 2 * NOISE
            clock = self.slow_gpus.get((node, gpu), 1.0)
            computes[(node, gpu)] = r.compute_s * r.phase * r.imbalance.get((node, gpu), 1.0) * jitter / clock
        multi_node = len({n for n, _ in ranks}) > 1
        comm = 0.0
        if multi_node:
            slowest = min(self._rail(node, gpu).bandwidth(now, self._congested(node)) for node, gpu in ranks)
            comm = r.bytes_per_iteration / slowest if slowest > 0 else float("inf")
        t_iter = max(computes.values()) + comm + r.stall_s
        hung = t_iter == float("inf")
        r.iteration_s = None if hung else t_iter
        if not hung:
            r.iterations += dt / t_iter
        for (node, gpu), c in computes.items():
            self.loads[(node, gpu)] = GpuLoad(
                duty=0.0 if hung else c / t_iter, clock=self.slow_gpus.get((node, gpu), 1.0)
            )
            if multi_node and not hung:
                nic = self._rail(node, gpu)
                nic.load_bytes_per_s += r.bytes_per_iteration / t_iter

    def _rail(self, node: str, gpu: int) -> SimNic:
        nics = self.nics[node]
        return nics[gpu % len(nics)]

    def _congested(self, node: str) -> bool:
        return self.labels[node]["leaf"] in self.congested_leaves

    def _count(self, node: str, now: float, dt: float) -> None:
        rng = self.rng[node]
        congested = self.labels[node]["leaf"] in self.congested_leaves
        for n in self.nics[node]:
            up = n.is_up(now)
            if up and not n._was_up:
                n.flaps += 1  # link_downed counts each loss of link; counted when it comes back
            n._was_up = up
            if not up:
                continue
            n.tx_bytes += n.load_bytes_per_s * dt
            n.rx_bytes += n.load_bytes_per_s * dt
            if n.erroring:
                n.errors += ERROR_RATE_PER_S * dt * (0.5 + rng.random())
            pause = STORM_PAUSE_PER_S if congested else BACKGROUND_PAUSE_PER_S
            n.pause += pause * dt * (0.5 + rng.random())

    # --- what the agent reads -------------------------------------------------------------------

    def load(self, node: str, gpu: int) -> GpuLoad | None:
        return self.loads.get((node, gpu))

    def counters(self, node: str, now: float) -> list[tuple[SimNic, bool]]:
        return [(n, n.is_up(now)) for n in self.nics[node]]

    def comms(self, node: str) -> list[CommProgress]:
        """NCCL RAS's view on this node: one communicator per job with ranks here."""
        return [
            CommProgress(comm=comm, job=job, ops=int(self.rhythms[job].iterations * OPS_PER_ITERATION), ranks=n)
            for job, comm, n in self.local.get(node, ())
        ]


@dataclass
class SimNicReader:
    """The FabricAdapter's counterpart for a simulated node: the same rates/deltas from sim counters."""

    fabric: SimFabric
    node: str
    _prev: dict[int, tuple[float, float, float, float, float, int]] = field(default_factory=dict)

    def read(self, cluster: str, node: str, seq: int, now: float, interval_s: float) -> FabricSample:
        nics = []
        for n, up in self.fabric.counters(self.node, now):
            cur = (now, n.tx_bytes, n.rx_bytes, n.errors, n.pause, n.flaps)
            prev = self._prev.get(n.index)
            self._prev[n.index] = cur
            dt = now - prev[0] if prev else 0.0
            nics.append(
                NicSample(
                    name=f"mlx5_{n.index}/1",
                    index=n.index,
                    kind="ib",
                    state=LinkState.UP if up else LinkState.DOWN,
                    rate_gbps=n.speed_gbps() if up else None,
                    tx_bytes_per_s=round((cur[1] - prev[1]) / dt, 1) if prev and dt > 0 else None,
                    rx_bytes_per_s=round((cur[2] - prev[2]) / dt, 1) if prev and dt > 0 else None,
                    errors=int(cur[3]) - int(prev[3]) if prev else None,
                    discards=0 if prev else None,
                    pause=int(cur[4]) - int(prev[4]) if prev else None,
                    flaps=cur[5] - prev[5] if prev else None,
                    gpu_index=n.index,
                )
            )
        return FabricSample(
            cluster=cluster,
            node=node,
            seq=seq,
            observed_at=now,
            interval_s=interval_s,
            nics=nics,
            comms=self.fabric.comms(self.node),
            labels=self.fabric.labels[self.node],
        )
