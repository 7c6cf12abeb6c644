"""Labelled slowdown scenarios on the simulated fleet, run through the REAL pieces: the simulator's
fabric and GPUs (node_agent.sim), the agent's detectors (GPU and NIC), the perf core and the health
core with the default policy. Used by `bench/fabric.py` and the perf tests; no NATS, a virtual clock.

One scenario: a gang of `gang_nodes` x 8 GPUs runs on a fleet; at `fault_at` a fault is injected on a
random rank (or nothing, for healthy controls: noise, a phase change, load imbalance).

`noise="hard"` adds what the detector's thresholds were not tuned on, in every scenario: the job's
iteration time jitters +-15 % from step to step (data-dependent steps), every rank jitters +-10 % on
its own, every rank is permanently up to 15 % slower than the fastest (load imbalance), healthy NICs
show sporadic symbol errors (1-40 at a time) and pause-frame micro-bursts (up to 5,000 in a second on
one node); a `two_faults` scenario puts a slow GPU and a degraded NIC on two nodes of one gang; and a
`healthy_input_stall` control makes every rank wait on its input for 60 s (slower, GPUs idle, no culprit).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from events.base import Event
from events.fabric import CulpritKind, JobSlowdownCleared, JobSlowdownDetected
from events.faults import GpuFaultDetected
from events.fleet import NodeDiscovered
from events.jobs import JobScheduled, Placement
from node_agent.detectors import DetectorState, detect
from node_agent.fabric_detectors import FabricDetectorState, detect_nic
from node_agent.sim.fleet import JobProfile, SimFleet
from node_agent.sim.models import gpu_model
from services.health import core as health
from services.health.policy import load_policy
from services.perf import core as perf

CLUSTER = "sim"
GPUS = 8
FAULTS = ("gpu_slow", "nic_down", "nic_flap", "nic_degraded", "nic_errors", "pfc_storm")
CONTROLS = ("healthy_noise", "healthy_phase", "healthy_imbalance")
# Hard noise only: for 60 s every rank waits on its input pipeline (0.5x compute per step, GPUs idle).
# No GPU, NIC or switch is at fault, but the job is slower and nothing diverges across ranks.
INPUT_STALL = "healthy_input_stall"
TWO_FAULTS = "two_faults"  # gpu_slow on one node and nic_degraded on another, at once (hard noise only)
STEP_JITTER = 0.15  # hard noise: job-wide iteration-time jitter
RANK_JITTER = 0.10  # hard noise: per-rank compute jitter
IMBALANCE = 0.15  # hard noise: permanent per-rank slowdown, up to
ERROR_NOISE_P = 0.05  # hard noise: chance per second of a few symbol errors on some healthy NIC
PAUSE_BURST_P = 0.05  # hard noise: chance per second of a pause micro-burst on one node
EXPECTED_KIND = {
    "gpu_slow": CulpritKind.GPU,
    "nic_down": CulpritKind.NIC,
    "nic_flap": CulpritKind.NIC,
    "nic_degraded": CulpritKind.NIC,
    "nic_errors": CulpritKind.NIC,
    "pfc_storm": CulpritKind.FABRIC,
}
TWO_FAULT_PARTS = ("gpu_slow", "nic_degraded")


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # a fault kind, or one of CONTROLS
    gang_nodes: int
    seed: int
    fault_at: float = 90.0
    after_s: float = 150.0  # how long to run after the fault
    fleet_nodes: int | None = None  # default: the gang plus one leaf of bystanders
    clear_after_s: float | None = None  # the fault ends (repaired) this long after it began
    ras: bool = True  # False: no NCCL RAS on the nodes; progress is read from NIC traffic instead
    noise: str = "base"  # "hard": the noise the thresholds were not tuned on (module docstring)
    record: bool = False  # keep the perf core's input log in Outcome.perf_log (the conformance suite)

    @property
    def faulty(self) -> bool:
        return self.kind in FAULTS or self.kind == TWO_FAULTS


@dataclass
class Outcome:
    scenario: Scenario
    target: dict[str, object] = field(default_factory=dict)  # node / gpu / nic / leaf the fault hit
    detected: JobSlowdownDetected | None = None
    early: list[JobSlowdownDetected] = field(default_factory=list)  # verdicts before the fault (false)
    cleared: list[JobSlowdownCleared] = field(default_factory=list)
    isolations: list[health.Decision] = field(default_factory=list)
    speed_during: float = 1.0  # iterations per second during the fault / before it
    perf_state: perf.PerfState | None = None
    perf_cpu_s: float = 0.0  # time spent in the perf core (evolve + decide), for its cost per sample
    node_samples: int = 0
    perf_log: list[Event] = field(default_factory=list)  # what perf folded, in order (Scenario.record)

    @property
    def detection_s(self) -> float | None:
        if self.detected is None or not self.scenario.faulty:
            return None
        return self.detected.at - self.scenario.fault_at

    @property
    def attributed(self) -> bool:
        """The verdict names the fault's culprit (for two faults at once: either of them)."""
        d = self.detected
        if d is None or not self.scenario.faulty:
            return False
        if self.scenario.kind == TWO_FAULTS:
            parts = self.target.get("parts", [])
            return any(_names(d, kind, t) for kind, t in zip(TWO_FAULT_PARTS, parts, strict=True))  # type: ignore[call-overload]
        return _names(d, self.scenario.kind, self.target)

    @property
    def first_move_at(self) -> float | None:
        """When the health policy took a gang GPU or node out of service (the job moves off it)."""
        moves = [d for d in self.isolations if d.action in ("isolate_gpu", "isolate_node")]
        return min((d.event.at for d in moves if d.event is not None), default=None)  # type: ignore[attr-defined]


def _names(d: JobSlowdownDetected, kind: str, t: dict[str, object]) -> bool:
    if d.culprit is not EXPECTED_KIND[kind]:
        return False
    if d.culprit is CulpritKind.FABRIC:
        return d.leaf == t.get("leaf")
    if d.node != t.get("node"):
        return False
    return d.gpu_index == t.get("gpu")  # rail-optimised: NIC i serves GPU i


def busy_job_id(seed: int, prefix: str = "train") -> str:
    """A job id whose simulated profile computes (the simulator idles a share of jobs)."""
    for i in range(1000):
        job = f"{prefix}-{seed}-{i}"
        if not JobProfile.of(seed, job).idle:
            return job
    raise RuntimeError("no busy job id")  # pragma: no cover


def run(sc: Scenario) -> Outcome:
    rng = random.Random(f"scenario:{sc.name}:{sc.seed}")
    fleet_nodes = sc.fleet_nodes or sc.gang_nodes + 8
    fleet = SimFleet(seed=sc.seed, nodes=fleet_nodes, gpus_per_node=GPUS, model=gpu_model("H100-80GB"))
    names = list(fleet.nodes)
    gang = names[: sc.gang_nodes]
    job = busy_job_id(sc.seed)
    fleet.assign({n: dict.fromkeys(range(GPUS), job) for n in gang})
    rhythm = fleet.fabric.rhythms[job]
    if sc.kind == "healthy_imbalance":  # some ranks do more work, always: not a fault
        rhythm.imbalance = {(n, g): 1.0 + rng.uniform(0.0, 0.12) for n in gang for g in range(GPUS)}
    hard = sc.noise == "hard"
    base = {(n, g): 1.0 + rng.uniform(0.0, IMBALANCE) for n in gang for g in range(GPUS)} if hard else {}
    if hard and sc.kind == "healthy_imbalance":
        base = {r: b * rhythm.imbalance[r] for r, b in base.items()}

    pstate = perf.PerfState()
    hstate = health.new_state(load_policy())
    readers = {n: fleet.nodes[n].fabric_reader() for n in names}
    gpu_det = {n: DetectorState() for n in names}
    nic_det = {n: FabricDetectorState() for n in names}
    limits = {n: fleet.nodes[n].limits() for n in names}
    for n in names:
        health.evolve(hstate, NodeDiscovered(cluster=CLUSTER, node=n, at=0.0, gpus=fleet.nodes[n].inventory_gpus()))
    placements = [Placement(cluster=CLUSTER, node=n, gpu_indices=list(range(GPUS))) for n in gang]
    out = Outcome(sc, perf_state=pstate)
    fold = _recorder(pstate, out.perf_log) if sc.record else lambda e: perf.evolve(pstate, e)
    fold(JobScheduled(job_id=job, at=0.0, team="t", placements=placements, pool="default"))

    victim, gpu, nic = rng.choice(gang), rng.randrange(GPUS), rng.randrange(GPUS)
    # two_faults: the other node (drawn only there, so the other scenarios' noise stays as it was)
    second = rng.choice([n for n in gang if n != victim]) if sc.kind == TWO_FAULTS else victim
    iters_at: dict[float, float] = {}
    end = sc.fault_at + sc.after_s
    hiccup: tuple[float, tuple[str, int]] | None = None
    t = 0.0
    while t <= end:
        if t == sc.fault_at:
            out.target = _inject(fleet, sc, victim, gpu, nic, t, second)
        if sc.clear_after_s is not None and t == sc.fault_at + sc.clear_after_s:
            fleet.inject(victim, "clear", None, None, t)
        if sc.kind == "healthy_phase" and sc.fault_at <= t < sc.fault_at + 60:
            rhythm.phase = 1.6  # an eval pass: every rank computes longer
        else:
            rhythm.phase = 1.0
        stalled = sc.kind == INPUT_STALL and sc.fault_at <= t < sc.fault_at + 60
        rhythm.stall_s = 0.5 * rhythm.compute_s if stalled else 0.0
        if hard:
            hiccup = _hard_noise(rng, rhythm, base, gang, t, hiccup)
            _counter_noise(rng, fleet, names, out.target)
        else:
            hiccup = _hiccups(rng, rhythm, gang, t, hiccup)
        fleet.step(t)
        iters_at[t] = rhythm.iterations
        faults: list[Event] = []
        for n in names:
            reading = fleet.nodes[n].read(CLUSTER, int(t), t, 1.0)
            fabric = readers[n].read(CLUSTER, n, int(t), t, 1.0)
            if not sc.ras:
                fabric = msgspec.structs.replace(fabric, comms=[])
            started = time.process_time()
            fold(reading.sample)
            fold(fabric)
            out.perf_cpu_s += time.process_time() - started
            out.node_samples += 1
            health.evolve(hstate, reading.sample)
            gpu_det[n], found = detect(gpu_det[n], reading, limits[n])
            faults += [*found, *detect_nic(nic_det[n], fabric)]
        started = time.process_time()
        decided = perf.decide(pstate, t)
        out.perf_cpu_s += time.process_time() - started
        for event, _ in decided:
            fold(event)
            if isinstance(event, JobSlowdownDetected):
                if sc.faulty and t >= sc.fault_at and out.detected is None:
                    out.detected = event
                elif t < sc.fault_at or not sc.faulty:
                    out.early.append(event)
            elif isinstance(event, JobSlowdownCleared):
                out.cleared.append(event)
            elif isinstance(event, GpuFaultDetected):
                faults.append(event)
        for f in faults:
            health.evolve(hstate, f)
        for d in health.decide(hstate, t):
            health.evolve(hstate, d)
            if d.action in ("isolate_gpu", "isolate_node", "hold"):
                out.isolations.append(d)
        t += 1.0
    span = min(60.0, sc.fault_at - perf.WARMUP_S, sc.after_s)
    before = iters_at[sc.fault_at] - iters_at[sc.fault_at - span]
    during = iters_at[sc.fault_at + span] - iters_at[sc.fault_at]
    out.speed_during = during / before if before > 0 else 1.0
    return out


def _recorder(state: perf.PerfState, log: list[Event]) -> Callable[[Event], object]:
    def fold(event: Event) -> object:
        log.append(event)
        return perf.evolve(state, event)

    return fold


def _inject(fleet: SimFleet, sc: Scenario, node: str, gpu: int, nic: int, t: float, second: str) -> dict[str, object]:
    if not sc.faulty:
        return {}
    if sc.kind == TWO_FAULTS:
        fleet.inject(node, "gpu_slow", gpu, None, t)
        fleet.inject(second, "nic_degraded", None, None, t, nic=nic)
        return {"parts": [{"node": node, "gpu": gpu}, {"node": second, "nic": nic, "gpu": nic}]}
    if sc.kind == "gpu_slow":
        fleet.inject(node, "gpu_slow", gpu, None, t)
        return {"node": node, "gpu": gpu}
    if sc.kind == "pfc_storm":
        fleet.inject(node, "pfc_storm", None, None, t)
        return {"node": node, "leaf": fleet.fabric.labels[node]["leaf"]}
    fleet.inject(node, sc.kind, None, None, t, nic=nic)
    return {"node": node, "nic": nic, "gpu": nic}


def _hiccups(
    rng: random.Random, rhythm: object, gang: list[str], t: float, current: tuple[float, tuple[str, int]] | None
) -> tuple[float, tuple[str, int]] | None:
    """Realistic noise for every scenario: now and then one rank stalls for 2 s (a GC pause, a slow
    data-loader batch) and its gang waits. It must flag nothing."""
    imbalance = rhythm.imbalance  # type: ignore[attr-defined]
    if current is not None and t >= current[0]:
        imbalance.pop(current[1], None) if current[1] not in imbalance or imbalance[current[1]] == 2.0 else None
        current = None
    if current is None and rng.random() < 0.05:
        rank = (rng.choice(gang), rng.randrange(GPUS))
        if rank not in imbalance:
            imbalance[rank] = 2.0
            current = (t + 2.0, rank)
    return current


def _hard_noise(
    rng: random.Random,
    rhythm: object,
    base: dict[tuple[str, int], float],
    gang: list[str],
    t: float,
    stall: tuple[float, tuple[str, int]] | None,
) -> tuple[float, tuple[str, int]] | None:
    """Every step: job-wide and per-rank jitter over a permanent imbalance, plus the 2 s rank stalls."""
    if stall is not None and t >= stall[0]:
        stall = None
    if stall is None and rng.random() < 0.05:
        stall = (t + 2.0, (rng.choice(gang), rng.randrange(GPUS)))
    imbalance = {r: b * (1.0 + rng.uniform(-RANK_JITTER, RANK_JITTER)) for r, b in base.items()}
    if stall is not None:
        imbalance[stall[1]] = 2.0 * base[stall[1]]
    rhythm.imbalance = imbalance  # type: ignore[attr-defined]
    rhythm.phase *= 1.0 + rng.uniform(-STEP_JITTER, STEP_JITTER)  # type: ignore[attr-defined]
    return stall


def _counter_noise(rng: random.Random, fleet: SimFleet, names: list[str], target: dict[str, object]) -> None:
    """Sporadic symbol errors on some NIC and pause micro-bursts on some node: counters as real ones
    tick on a healthy fabric (written into the simulated cumulative counters the agent reads)."""
    if rng.random() < ERROR_NOISE_P:
        node, i = rng.choice(names), rng.randrange(GPUS)
        fleet.fabric.nics[node][i].errors += rng.randint(1, 40)
    if rng.random() < PAUSE_BURST_P:
        for n in fleet.fabric.nics[rng.choice(names)]:
            n.pause += rng.uniform(0.0, 5_000.0)


def plan(
    seeds: int = 2,
    gang_sizes: tuple[int, ...] = (8, 64),
    fault_at: float = 90.0,
    ras: bool = True,
    noise: str = "base",
) -> list[Scenario]:
    """The labelled set: every fault kind and every healthy control, per gang size and seed (with hard
    noise, two faults at once too)."""
    kinds = (*FAULTS, *CONTROLS, *((TWO_FAULTS, INPUT_STALL) if noise == "hard" else ()))
    out = []
    for size in gang_sizes:
        for seed in range(1, seeds + 1):
            for kind in kinds:
                name = f"{kind}-{size}n-s{seed}" + ("-hard" if noise == "hard" else "")
                out.append(Scenario(name, kind, size, seed, fault_at=fault_at, ras=ras, noise=noise))
    return out
