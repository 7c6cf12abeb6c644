"""The event-driven simulation: a virtual clock, a fleet of nodes, and a policy deciding.

Each instant: fold what happened (arrivals, completions, node faults and repairs) into the policy,
ask it to decide, apply its stops then starts. Pure and deterministic: faults come from a seeded
generator and time only moves by the event heap.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Protocol

from services.tracesim.faults import FaultModel
from services.tracesim.model import Action, SimJob, Start, Stop
from services.tracesim.quotas import TeamQuota
from services.tracesim.trace import TraceJob

ARRIVE, FINISH, FAIL, REPAIR, WARN = 0, 1, 2, 3, 4  # order within one instant: arrivals first


@dataclass(frozen=True)
class FleetSpec:
    gpus: int
    gpus_per_node: int = 8
    gpu_model: str = "H100-80GB"

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)

    def node_size(self, node: int) -> int:
        """The last node holds the remainder when gpus is not a multiple of gpus_per_node."""
        if node < self.nodes - 1 or self.gpus % self.gpus_per_node == 0:
            return self.gpus_per_node
        return self.gpus % self.gpus_per_node


class Policy(Protocol):
    name: str

    def setup(self, fleet: FleetSpec, quotas: dict[str, TeamQuota]) -> None: ...
    def submitted(self, job: SimJob, now: float) -> None: ...
    def finished(self, job: SimJob, now: float) -> None: ...
    def node_down(self, node: int, now: float) -> None: ...
    def node_up(self, node: int, now: float) -> None: ...
    def decide(self, now: float) -> list[Action]: ...


@dataclass
class Sample:
    t: float
    allocated: int
    queued: int


@dataclass
class Outcome:
    policy: str
    fleet: FleetSpec
    jobs: dict[str, SimJob]
    quotas: dict[str, TeamQuota]
    first_submit: float
    last_submit: float
    end: float
    allocated_gpu_s: float
    stranded_gpu_s: float
    capacity_gpu_s: float
    window_allocated_gpu_s: float = 0.0  # within first..last submit: while work keeps arriving
    window_capacity_gpu_s: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    unfinished: int = 0
    faults: int = 0  # node faults planned
    precursors: int = 0  # of which with a detectable precursor (with a fault model)


class Simulation:
    def __init__(
        self,
        jobs: list[TraceJob],
        fleet: FleetSpec,
        quotas: dict[str, TeamQuota],
        policy: Policy,
        *,
        fault_rate_per_node_day: float = 0.0,
        repair_s: float = 4 * 3600.0,
        seed: int = 0,
        until: float | None = None,
        sample_every_s: float = 600.0,
        fault_model: FaultModel | None = None,
    ) -> None:
        """`fault_model` None: a node fault costs its jobs the work since their last checkpoint, no
        more (the ceiling of what moving them on a warning saves); else see faults.py."""
        self.fleet = fleet
        self.quotas = quotas
        self.policy = policy
        self.until = until
        self.jobs = {j.id: SimJob(j) for j in jobs}
        self.heap: list[tuple[float, int, int, str, int]] = []
        self._n = 0
        for j in jobs:
            self._push(j.submit_s, ARRIVE, j.id)
        self.free = [fleet.node_size(n) for n in range(fleet.nodes)]
        self.down: set[int] = set()
        self.waiting_sizes: dict[int, int] = {}  # GPUs -> waiting jobs of that size (stranded metric)
        self.queued = 0
        self.allocated = 0
        self.sample_every_s = sample_every_s
        self.fault_model = fault_model
        self.warned: dict[int, float] = {}  # nodes taken out on a precursor -> when they will fail
        self.faults = self.precursors = 0
        if fault_rate_per_node_day > 0 and jobs:
            self._plan_faults(fault_rate_per_node_day, repair_s, seed, jobs)

    def _push(self, t: float, kind: int, job_id: str, token: int = 0) -> None:
        self._n += 1
        heapq.heappush(self.heap, (t, kind, self._n, job_id, token))

    def _plan_faults(self, rate: float, repair_s: float, seed: int, jobs: list[TraceJob]) -> None:
        """Poisson node failures over the trace's span (plus the longest job), seeded."""
        rng = random.Random(seed)
        # Which faults have a precursor: a stream of its own, so the fault times stay as without a model.
        warning = random.Random(f"precursor-{seed}")
        model = self.fault_model
        horizon = max(j.submit_s for j in jobs) + max(j.duration_s for j in jobs)
        mean_gap = 86400.0 / rate
        for node in range(self.fleet.nodes):
            t = jobs[0].submit_s + rng.expovariate(1 / mean_gap)
            while t < horizon:
                self._push(t, FAIL, str(node))
                self._push(t + repair_s, REPAIR, str(node))
                self.faults += 1
                if model is not None and warning.random() < model.precursor_share:
                    self.precursors += 1
                    if model.warns:
                        self._push(t - model.lead_s + model.detection_s, WARN, str(node))
                t += repair_s + rng.expovariate(1 / mean_gap)

    # -- applying decisions ------------------------------------------------------------------------
    def _start(self, action: Start, now: float) -> None:
        job = self.jobs[action.job_id]
        assert not job.running, f"{job.t.id} started twice"
        held = sum(action.placement.values())
        assert held == job.t.gpus, f"{job.t.id} placed on {held} GPUs, needs {job.t.gpus}"
        for node, n in action.placement.items():
            assert node not in self.down, f"{job.t.id} placed on down node {node}"
            self.free[node] -= n
            assert self.free[node] >= 0, f"node {node} over-allocated by {job.t.id}"
        job.placement = dict(action.placement)
        job.run_start = now
        if job.queued_since is not None:
            job.queued_s += now - job.queued_since
            job.queued_since = None
        if job.first_start is None:
            job.first_start = now
        self._unwait(job)
        self.allocated += held
        self._push(now + job.remaining_s, FINISH, job.t.id, job.token)

    def _stop(self, job: SimJob, now: float, cause: str) -> None:
        """The run ends early: progress rolls back to its last checkpoint; the rest is lost."""
        assert job.run_start is not None
        ran = now - job.run_start
        model = self.fault_model
        interval = job.t.checkpoint_interval_s or (model.checkpoint_s if model is not None else None)
        remaining = job.remaining_s
        kept = math.floor(ran / interval) * interval if interval else 0.0
        kept = min(kept, remaining)
        job.done_work_s += kept
        job.run_gpu_s += ran * job.t.gpus
        job.lost_gpu_s += (ran - kept) * job.t.gpus
        if cause != "preempted":  # a node fault
            job.lost_to_faults_gpu_s += (ran - kept) * job.t.gpus
            hang = model.hang_s * job.t.gpus if model is not None else 0.0
            fails = [self.warned[n] for n in job.placement if n in self.down and n in self.warned]
            if fails and len(fails) == sum(1 for n in job.placement if n in self.down):
                job.fault_moves += 1  # moved on the precursor: no hang
                # Had the scheduler waited: the job runs on until the failure (unless it ends first),
                # then loses the work since its checkpoint and hangs.
                ran_on = ran + min(fails) - now
                if ran_on < remaining:
                    kept_on = math.floor(ran_on / interval) * interval if interval else 0.0
                    job.waiting_cost_gpu_s += (ran_on - kept_on) * job.t.gpus + hang
            else:  # failed under the job: it hangs until the collective times out, held and idle
                job.hang_gpu_s += hang
                job.run_gpu_s += hang
                job.lost_gpu_s += hang
                job.lost_to_faults_gpu_s += hang
                job.waiting_cost_gpu_s += (ran - kept) * job.t.gpus + hang
        self._release(job)
        job.token += 1
        if cause == "preempted":
            job.preemptions += 1
        else:
            job.requeues += 1
        job.queued_since = now
        self._wait(job)

    def _release(self, job: SimJob) -> None:
        for node, n in job.placement.items():
            self.free[node] += n
        self.allocated -= job.t.gpus
        job.placement = {}
        job.run_start = None

    def _wait(self, job: SimJob) -> None:
        self.queued += 1
        self.waiting_sizes[job.t.gpus] = self.waiting_sizes.get(job.t.gpus, 0) + 1

    def _unwait(self, job: SimJob) -> None:
        self.queued -= 1
        self.waiting_sizes[job.t.gpus] -= 1

    def _stranded_now(self) -> int:
        """Healthy free GPUs that waiting jobs could have used (each waiting job that would fit)."""
        if not self.queued:
            return 0
        up = [f for n, f in enumerate(self.free) if n not in self.down]
        total, biggest = sum(up), max(up, default=0)
        if total == 0:
            return 0
        gpn = self.fleet.gpus_per_node
        fits = sum(
            size * count
            for size, count in self.waiting_sizes.items()
            if count and (size <= biggest if size <= gpn else size <= total)
        )
        return min(total, fits)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> Outcome:
        policy = self.policy
        policy.setup(self.fleet, self.quotas)
        first = min((j.t.submit_s for j in self.jobs.values()), default=0.0)
        last_submit = max((j.t.submit_s for j in self.jobs.values()), default=0.0)
        last_t = first
        allocated_gpu_s = stranded_gpu_s = capacity_gpu_s = 0.0
        window_allocated = window_capacity = 0.0
        stranded = 0
        samples: list[Sample] = []
        next_sample = first
        while self.heap:
            now = self.heap[0][0]
            if self.until is not None and now > first + self.until:
                now = first + self.until
                dt = now - last_t
                allocated_gpu_s += self.allocated * dt
                stranded_gpu_s += stranded * dt
                capacity_gpu_s += self._capacity() * dt
                last_t = now
                break
            dt = now - last_t
            allocated_gpu_s += self.allocated * dt
            stranded_gpu_s += stranded * dt
            capacity_gpu_s += self._capacity() * dt
            in_window = max(0.0, min(now, last_submit) - last_t)
            window_allocated += self.allocated * in_window
            window_capacity += self._capacity() * in_window
            last_t = now
            while self.heap and self.heap[0][0] == now:
                _, kind, _, key, token = heapq.heappop(self.heap)
                if kind == ARRIVE:
                    job = self.jobs[key]
                    job.queued_since = now
                    self._wait(job)
                    policy.submitted(job, now)
                elif kind == FINISH:
                    job = self.jobs[key]
                    if token != job.token or not job.running:
                        continue  # preempted since: this finish is stale
                    assert job.run_start is not None
                    job.run_gpu_s += (now - job.run_start) * job.t.gpus
                    job.done_work_s = job.t.duration_s
                    job.end = now
                    self._release(job)
                    policy.finished(job, now)
                elif kind == FAIL:
                    node = int(key)
                    if node in self.warned:  # its jobs were moved off on the precursor
                        del self.warned[node]
                        continue
                    self.down.add(node)
                    policy.node_down(node, now)
                elif kind == WARN:
                    node = int(key)
                    if node not in self.down:  # out of service now; it fails a little later
                        self.down.add(node)
                        warned = self.fault_model
                        assert warned is not None  # only a fault model plans warnings
                        self.warned[node] = now + warned.lead_s - warned.detection_s
                        policy.node_down(node, now)
                else:
                    node = int(key)
                    self.down.discard(node)
                    self.warned.pop(node, None)
                    policy.node_up(node, now)
            actions = policy.decide(now)
            for action in actions:
                if isinstance(action, Stop):
                    self._stop(self.jobs[action.job_id], now, action.cause)
            for action in actions:
                if isinstance(action, Start):
                    self._start(action, now)
            stranded = self._stranded_now()
            if now >= next_sample:
                samples.append(Sample(now, self.allocated, self.queued))
                next_sample = now + self.sample_every_s
        unfinished = sum(1 for j in self.jobs.values() if j.end is None)
        for j in self.jobs.values():  # still queued at the end: that stretch counts up to the end
            if j.queued_since is not None:
                j.queued_s += max(last_t - j.queued_since, 0.0)
                j.queued_since = None
        return Outcome(
            policy=policy.name,
            fleet=self.fleet,
            jobs=self.jobs,
            quotas=self.quotas,
            first_submit=first,
            last_submit=last_submit,
            end=last_t,
            allocated_gpu_s=allocated_gpu_s,
            stranded_gpu_s=stranded_gpu_s,
            capacity_gpu_s=capacity_gpu_s,
            window_allocated_gpu_s=window_allocated,
            window_capacity_gpu_s=window_capacity,
            samples=samples,
            unfinished=unfinished,
            faults=self.faults,
            precursors=self.precursors,
        )

    def _capacity(self) -> int:
        if not self.down:
            return self.fleet.gpus
        return self.fleet.gpus - sum(self.fleet.node_size(n) for n in self.down)
