"""MIG on a simulated fleet: small jobs started per GPU-hour with MIG (layouts planned by the scheduler's
planner, `services/scheduler/core/mig_plan.py`) against whole-GPU scheduling, on the same trace.

The trace is SYNTHETIC (seeded; no public trace records MIG requests): 64 H100-80GB GPUs for
`--hours` (24), with Poisson arrivals of
  - inference services: 1g.10gb (60 %) or 2g.20gb, running an exponential time (mean 2 h, at most 8 h);
  - notebooks: 1g.10gb or 1g.20gb, running 30 min to 2 h (uniform);
  - training: one whole GPU, running 2 to 8 h (uniform).
`--load` multiplies the small jobs' arrival rates (at 1.0 MIG already starts every small job that
arrives, so the ratio there is bounded by arrivals, not by capacity). A small job asks for a MIG
profile; under whole-GPU scheduling it takes a whole GPU. Both schedulers
start queued jobs in arrival order on one-minute ticks, skipping those that do not fit (backfill).
With MIG, a small job runs on an idle instance of its profile; when the queue has work no instance
can take, the planner changes layouts (on the same tick) under its rules. Prints one JSON object:
small jobs started per GPU-hour (both, and the ratio), training jobs started, running instances a
reconfiguration disturbed, reconfigurations per GPU-hour and the most on one GPU within any hour.

`--live` runs the trace through the scheduler's own cycle instead (`schedule`, which plans layouts
through `services/scheduler/core/mig_live.py`) on 8 nodes of 8 GPUs labeled for the GPU Operator.

    python bench/mig.py [--seed 0] [--hours 24] [--load 1.0] [--operator | --live]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.scheduler.core.mig import Instance, mig_model, used_mask
from services.scheduler.core.mig_plan import MigGpu, plan

MODEL = "H100-80GB"
GPUS = 64
TICK = 60.0
HOUR = 3600.0
RATES_PER_HOUR = {"inference": 20.0, "notebook": 30.0, "training": 4.0}


@dataclass(frozen=True)
class Job:
    name: str
    kind: str
    arrive: float
    duration: float
    profile: str = ""  # empty: a whole GPU

    @property
    def small(self) -> bool:
        return bool(self.profile)


def trace(seed: int, hours: float, load: float = 1.0) -> list[Job]:
    rng = random.Random(seed)
    jobs: list[Job] = []
    for kind, base_rate in RATES_PER_HOUR.items():
        rate = base_rate * (load if kind != "training" else 1.0)
        t = rng.expovariate(rate / HOUR)
        while t < hours * HOUR:
            if kind == "inference":
                profile = "1g.10gb" if rng.random() < 0.6 else "2g.20gb"
                duration = min(rng.expovariate(1 / (2 * HOUR)), 8 * HOUR)
            elif kind == "notebook":
                profile = rng.choice(["1g.10gb", "1g.20gb"])
                duration = rng.uniform(0.5 * HOUR, 2 * HOUR)
            else:
                profile, duration = "", rng.uniform(2 * HOUR, 8 * HOUR)
            jobs.append(Job(f"{kind}-{len(jobs)}", kind, t, max(duration, TICK), profile))
            t += rng.expovariate(rate / HOUR)
    return sorted(jobs, key=lambda j: (j.arrive, j.name))


@dataclass
class Gpu:
    index: int
    mig: bool = False
    layout: list[Instance] = field(default_factory=list)
    running: dict[Instance, float] = field(default_factory=dict)  # instance -> end
    whole_until: float | None = None
    changes: list[float] = field(default_factory=list)

    def view(self) -> MigGpu:
        return MigGpu(
            ("sim", f"node{self.index // 8}", self.index % 8),
            MODEL,
            self.mig,
            tuple(self.layout),
            frozenset(self.running),
            whole_busy=self.whole_until is not None,
            last_change=self.changes[-1] if self.changes else None,
        )


def whole_gpu(jobs: list[Job], hours: float) -> Counter[str]:
    """Every job takes one whole GPU, in arrival order."""
    ends: list[float] = []
    queue: list[Job] = []
    started: Counter[str] = Counter()
    pending = list(jobs)
    t = 0.0
    while t < hours * HOUR:
        ends = [e for e in ends if e > t]
        while pending and pending[0].arrive <= t:
            queue.append(pending.pop(0))
        while queue and len(ends) < GPUS:
            job = queue.pop(0)
            ends.append(t + job.duration)
            started["small" if job.small else "training"] += 1
        t += TICK
    return started


@dataclass
class MigRun:
    started: Counter[str] = field(default_factory=Counter)
    disturbed: int = 0
    toggled_with_work: int = 0
    changes: int = 0


def with_mig(jobs: list[Job], hours: float, operator: bool = False) -> tuple[MigRun, list[Gpu]]:
    table = mig_model(MODEL)
    assert table is not None
    gpus = [Gpu(i) for i in range(GPUS)]
    run = MigRun()
    queue: list[Job] = []
    pending = list(jobs)
    t = 0.0
    while t < hours * HOUR:
        for g in gpus:  # jobs that ended free their instance or GPU
            g.running = {i: e for i, e in g.running.items() if e > t}
            if g.whole_until is not None and g.whole_until <= t:
                g.whole_until = None
        while pending and pending[0].arrive <= t:
            queue.append(pending.pop(0))
        queue = _start(queue, gpus, t, run)
        if queue:
            demand = Counter(j.profile for j in queue if j.small)
            whole = sum(1 for j in queue if not j.small)
            views = [g.view() for g in gpus]
            for change in plan(views, demand, t, whole_demand=whole, rewrites_whole_gpu=operator):
                g = gpus[int(change.gpu.key[1][4:]) * 8 + change.gpu.key[2]]
                run.disturbed += sum(1 for i in change.drain if i in g.running)
                run.toggled_with_work += (change.enable_mig or change.disable_mig) and (
                    bool(g.running) or g.whole_until is not None
                )
                g.mig = not change.disable_mig
                g.layout = list(change.after)
                g.changes.append(t)
                run.changes += 1
            queue = _start(queue, gpus, t, run)
        t += TICK
    for g in gpus:  # every layout the planner made is one NVML would accept
        slices = sum(table.profiles[p].memory for p, _ in g.layout)
        assert bin(used_mask(table, g.layout)).count("1") == slices, g.layout
    return run, gpus


def _start(queue: list[Job], gpus: list[Gpu], t: float, run: MigRun) -> list[Job]:
    left: list[Job] = []
    for job in queue:
        if job.small:
            spot = _idle_instance(gpus, job.profile)
            if spot is not None:
                gpus[spot[0]].running[spot[1]] = t + job.duration
                run.started["small"] += 1
                continue
        else:
            free = next((g for g in gpus if not g.mig and g.whole_until is None), None)
            if free is not None:
                free.whole_until = t + job.duration
                run.started["training"] += 1
                continue
        left.append(job)
    return left


def _idle_instance(gpus: list[Gpu], profile: str) -> tuple[int, Instance] | None:
    """An idle instance of the profile, on the GPU with the most running instances (so others empty)."""
    best: tuple[int, int, Instance] | None = None
    for g in gpus:
        if not g.mig:
            continue
        for inst in g.layout:
            if inst[0] == profile and inst not in g.running:
                key = (-len(g.running), g.index, inst)
                if best is None or key < best:
                    best = key
    return None if best is None else (best[1], best[2])


@dataclass
class LiveRun:
    started: Counter[str] = field(default_factory=Counter)
    disturbed: int = 0  # drained instances that held a job running when the change was planned
    stopped: int = 0  # jobs the cycle preempted (a node drained for a layout change)
    changes: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # (node, GPU) -> plan times
    mig_gpus_at_end: int = 0


def live(jobs: list[Job], hours: float) -> LiveRun:
    """The same trace through the scheduler's own cycle (`schedule`, which drives the planner through
    `mig_live.py`) on 8 nodes of 8 GPUs labeled for the GPU Operator's MIG manager: each planned layout
    is reported applied on the next tick (the actuator's cordon, wait, label and uncordon taken as one
    tick); jobs complete at their durations (a stopped job restarts from the beginning)."""
    from events import GpuInfo, GpuShare, JobCompleted, JobSpec, JobSubmitted, NodeDiscovered, ShareMode, TeamQuotaSet
    from events.fleet import MigLayoutApplied
    from services.scheduler.core import Admit, Preempt, SchedulerState, events_for, evolve, schedule
    from services.scheduler.core.decisions import PlanLayout
    from services.scheduler.core.mig_live import MANAGED_LABEL

    s = SchedulerState()
    evolve(s, TeamQuotaSet(team="t", pool="default", at=0.0, guaranteed_gpus=GPUS))
    for n in range(GPUS // 8):
        infos = [GpuInfo(index=i, uuid=f"GPU-{n}-{i}", model=MODEL) for i in range(8)]
        evolve(
            s,
            NodeDiscovered(cluster="sim", node=f"node{n}", at=0.0, gpus=infos, labels={MANAGED_LABEL: "all-disabled"}),
        )
    by_name = {j.name: j for j in jobs}
    run = LiveRun()
    ends: dict[str, float] = {}
    to_apply: list[MigLayoutApplied] = []
    pending = list(jobs)
    mark = None
    t = 0.0
    while t < hours * HOUR:
        for applied in to_apply:
            evolve(s, applied)
        to_apply = []
        for jid, end in sorted(ends.items(), key=lambda x: (x[1], x[0])):
            if end <= t:
                evolve(s, JobCompleted(job_id=jid, at=t))
                del ends[jid]
        while pending and pending[0].arrive <= t:
            j = pending.pop(0)
            share = GpuShare(mode=ShareMode.MIG, mig_profile=j.profile) if j.small else None
            spec = JobSpec(team="t", gpus_per_replica=1, name=j.name, share=share, expected_duration_s=j.duration)
            evolve(s, JobSubmitted(job_id=j.name, at=j.arrive, spec=spec))
        held = {  # (node, GPU, profile, start) of instances running jobs hold now
            (p.node, i, p.mig_profile, p.mig_start)
            for jid in ends
            for p in s.jobs[jid].placements
            for i in p.gpu_indices
            if p.mig_profile
        }
        cycle = schedule(s, t, mark)
        mark = cycle.mark
        for d in cycle.decisions:
            if isinstance(d, Admit) and d.job_id not in ends:
                run.started["small" if by_name[d.job_id].small else "training"] += 1
                ends[d.job_id] = t + by_name[d.job_id].duration
            elif isinstance(d, Preempt):
                run.stopped += 1
                ends.pop(d.job_id, None)
            elif isinstance(d, PlanLayout):
                e = d.event
                run.changes.setdefault((e.node, e.gpu_index), []).append(t)
                run.disturbed += sum((e.node, e.gpu_index, i.profile, i.start) in held for i in e.drain)
                to_apply.append(
                    MigLayoutApplied(
                        cluster=e.cluster,
                        node=e.node,
                        gpu_index=e.gpu_index,
                        at=t + TICK,
                        layout=list(e.after),
                        mig_enabled=not e.disable_mig,
                        planned_at=e.at,
                    )
                )
        for event, _ in events_for(cycle.decisions, t):
            evolve(s, event)
        t += TICK
    run.mig_gpus_at_end = sum(st.enabled for node in s.nodes.values() for st in node.mig.values())
    return run


def most_changes_in_an_hour(times: list[list[float]]) -> int:
    """The most changes one GPU had within any hour (`times`: each GPU's change times, in order)."""
    most = 0
    for ts in times:
        for i, t in enumerate(ts):
            most = max(most, sum(1 for u in ts[i:] if u < t + HOUR))
    return most


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--load", type=float, default=1.0, help="multiplies the small jobs' arrival rates")
    parser.add_argument(
        "--operator", action="store_true", help="apply as the GPU Operator does: only GPUs without running instances"
    )
    parser.add_argument(
        "--live", action="store_true", help="run the scheduler's own cycle (mig_live.py) on GPU Operator nodes"
    )
    args = parser.parse_args()
    jobs = trace(args.seed, args.hours, args.load)
    base = whole_gpu(jobs, args.hours)
    more: dict[str, int]
    if args.live:
        live_run = live(jobs, args.hours)
        started, disturbed, times = live_run.started, live_run.disturbed, list(live_run.changes.values())
        applied_as = "live cycle (mig_live.py), 8 GPU Operator nodes x 8 GPUs, applied one tick later"
        more, mig_gpus = {"jobs_stopped_for_layout_changes": live_run.stopped}, live_run.mig_gpus_at_end
    else:
        run, gpus = with_mig(jobs, args.hours, args.operator)
        started, disturbed, times = run.started, run.disturbed, [g.changes for g in gpus]
        applied_as = "gpu-operator (whole GPUs rewritten)" if args.operator else "per instance (NVML)"
        more, mig_gpus = {"mig_mode_toggled_with_work": run.toggled_with_work}, sum(g.mig for g in gpus)
    gpu_hours = GPUS * args.hours
    mig_rate = started["small"] / gpu_hours
    base_rate = base["small"] / gpu_hours
    changes = sum(len(t) for t in times)
    print(
        json.dumps(
            {
                "trace": "synthetic (seeded): inference, notebook and training arrivals on 64 x H100-80GB",
                "seed": args.seed,
                "hours": args.hours,
                "small_load": args.load,
                "applied_as": applied_as,
                "small_jobs_arrived": sum(1 for j in jobs if j.small),
                "training_jobs_arrived": sum(1 for j in jobs if not j.small),
                "small_jobs_per_gpu_hour": {"mig": round(mig_rate, 3), "whole_gpu": round(base_rate, 3)},
                "small_jobs_ratio": round(mig_rate / base_rate, 2) if base_rate else None,
                "training_jobs_started": {"mig": started["training"], "whole_gpu": base["training"]},
                "running_instances_disturbed": disturbed,
                **more,
                "reconfigurations": changes,
                "reconfigurations_per_gpu_hour": round(changes / gpu_hours, 4),
                "most_reconfigurations_on_one_gpu_in_an_hour": most_changes_in_an_hour(times),
                "mig_gpus_at_end": mig_gpus,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
