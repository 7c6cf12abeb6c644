"""Multi-cluster dispatch on a seeded simulation: three clusters, three teams with skewed demand, each
cluster scheduled by the real scheduler core (services/scheduler/core), workloads placed by the
dispatch decision (services/dispatch/core.py) against the best static assignment of teams to clusters.

Prints JSON: mean_wait_ratio_vs_best_static (< 1: dispatch waits less), max_wait_ratio_vs_best_static,
remote_copies_per_workload (1.0: exactly one copy), duplicates_after_cluster_loss (0: a lost
cluster's workloads run once elsewhere; its copies, fenced, never run when it comes back).
Usage: python bench/multicluster.py [seed] [jobs]
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
import sys
from dataclasses import dataclass, field

from events import JobCancelled, JobCompleted, JobSpec, JobSubmitted, NodeDiscovered
from events.telemetry import GpuInfo
from services.dispatch import core as dispatch
from services.scheduler.core import SchedulerState, events_for, evolve, schedule
from services.scheduler.core.state import FINISHED, JobState

CLUSTERS = {"east": 2.0, "west": 2.0, "north": 2.2}  # price per GPU-hour
NODES, GPUS_PER_NODE = 4, 8
TEAMS = {"vision": 0.6, "nlp": 0.3, "research": 0.1}  # share of the submissions
MEAN_RUNTIME_S = 3600.0
LOSS_AT_S, LOST_CLUSTER = 6 * 3600.0, "west"


@dataclass
class Job:
    id: str
    team: str
    gpus: int
    at: float
    runtime_s: float
    clusters: tuple[str, ...]


@dataclass
class Sim:
    states: dict[str, SchedulerState] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    ends: list[tuple[float, str, str]] = field(default_factory=list)  # (end, cluster, job)


def workload(seed: int, n: int) -> list[Job]:
    rng = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / 300.0)  # about 80 % of the three clusters
        team = rng.choices(list(TEAMS), weights=list(TEAMS.values()))[0]
        pinned = ("north",) if team == "research" and rng.random() < 0.5 else ()  # data lives there
        gpus = rng.choice((1, 2, 4, 8, 8, 16))
        jobs.append(Job(f"j{i:04d}", team, gpus, t, rng.expovariate(1 / MEAN_RUNTIME_S) + 60.0, pinned))
    return jobs


def fleet() -> Sim:
    sim = Sim()
    for c in CLUSTERS:
        state = SchedulerState()
        for n in range(NODES):
            gpus = [GpuInfo(index=i, uuid=f"{c}-{n}-{i}", model="H100") for i in range(GPUS_PER_NODE)]
            evolve(state, NodeDiscovered(cluster=c, node=f"{c}-n{n}", at=0.0, gpus=gpus))
        sim.states[c] = state
    return sim


def view(sim: Sim, c: str, seen: float) -> dispatch.ClusterView:
    state = sim.states[c]
    running = sum(j.gpus for j in state.jobs.values() if j.state == JobState.RUNNING)
    queued = sum(j.gpus for j in state.jobs.values() if j.state in (JobState.PENDING, JobState.SUSPENDED))
    capacity = NODES * GPUS_PER_NODE
    quota = {team: capacity for team in TEAMS}  # the bench's quotas let every team use every cluster
    return dispatch.ClusterView(c, capacity, capacity - running, queued, MEAN_RUNTIME_S, CLUSTERS[c], seen, quota)


def cycle(sim: Sim, c: str, now: float, jobs: dict[str, Job]) -> None:
    state = sim.states[c]
    for event, _ in events_for(schedule(state, now, None).decisions, now):
        evolve(state, event)
        job_id = getattr(event, "job_id", "")
        if state.jobs[job_id].state == JobState.RUNNING and job_id not in sim.started:
            sim.started[job_id] = now
            heapq.heappush(sim.ends, (now + jobs[job_id].runtime_s, c, job_id))


def touched_jobs(sim: Sim) -> set[str]:
    return {jid for jid, j in sim.states[LOST_CLUSTER].jobs.items() if j.state == JobState.RUNNING}


def running_in(sim: Sim, jid: str) -> int:
    return sum(1 for s in sim.states.values() if jid in s.jobs and s.jobs[jid].state == JobState.RUNNING)


def submit(sim: Sim, c: str, job: Job) -> None:
    spec = JobSpec(team=job.team, gpus_per_replica=min(job.gpus, GPUS_PER_NODE), replicas=max(1, job.gpus // 8))
    evolve(sim.states[c], JobSubmitted(job_id=job.id, at=job.at, spec=spec))


def run(jobs: list[Job], place: dict[str, str] | None, lose: bool = False) -> dict[str, object]:
    """`place`: team -> cluster (static); None: the dispatch decision. `lose`: LOST_CLUSTER stops
    answering at LOSS_AT_S and comes back after twice the timeout."""
    sim, by_id = fleet(), {j.id: j for j in jobs}
    ds, copies, duplicates = dispatch.DispatchState(), 0, set[str]()
    workloads: dict[str, dispatch.Workload] = {}
    back_at = LOSS_AT_S + 2 * dispatch.LOST_AFTER_S
    seen = dict.fromkeys(CLUSTERS, 0.0)
    lost_checked = returned = False
    arrivals = iter(jobs)
    nxt = next(arrivals, None)
    while nxt is not None or sim.ends:
        now = min(nxt.at if nxt is not None else float("inf"), sim.ends[0][0] if sim.ends else float("inf"))
        for c in CLUSTERS:  # heartbeats: every cluster answers, except the lost one while it is away
            if not (lose and c == LOST_CLUSTER and LOSS_AT_S <= now < back_at):
                seen[c] = now
        touched: set[str] = set()
        if lose and not lost_checked and now >= LOSS_AT_S + dispatch.LOST_AFTER_S:
            lost_checked = True
            views = [view(sim, c, seen[c]) for c in CLUSTERS]
            for action in dispatch.cluster_lost(ds, workloads, views, now):
                if isinstance(action, dispatch.CreateCopy):
                    copies += 1
                    sim.started.pop(action.workload, None)
                    submit(sim, action.cluster, by_id[action.workload])
                    touched.add(action.cluster)
        if lose and not returned and now >= back_at:
            returned = True  # it answers again: copies it still holds that are not live are deleted
            state = sim.states[LOST_CLUSTER]
            for jid, j in sorted(state.jobs.items()):
                gen = ds.generations.get(jid, 0)
                if j.state in FINISHED or not dispatch.stale(ds, jid, LOST_CLUSTER, gen if jid in ds.copies else 0):
                    continue
                evolve(state, JobCancelled(job_id=jid, at=now, reason="stale copy (fenced while the cluster was lost)"))
            touched.add(LOST_CLUSTER)
        while sim.ends and sim.ends[0][0] <= now:
            _, c, jid = heapq.heappop(sim.ends)
            live = ds.copies.get(jid)
            if live is None or live.cluster != c or sim.states[c].jobs[jid].state != JobState.RUNNING:
                continue  # the end of a copy that was fenced and requeued elsewhere
            evolve(sim.states[c], JobCompleted(job_id=jid, at=now))
            dispatch.finished(ds, jid, "completed")
            touched.add(c)
        if nxt is not None and nxt.at <= now:
            if place is not None:
                target = nxt.clusters[0] if nxt.clusters else place[nxt.team]
                ds.copies[nxt.id] = dispatch.Copy(target, 1)
                copies += 1
            else:
                w = dispatch.Workload(nxt.id, nxt.team, nxt.gpus, origin="east", clusters=nxt.clusters)
                workloads[w.id] = w
                actions = dispatch.dispatch(ds, w, [view(sim, c, seen[c]) for c in CLUSTERS], now)
                copies += len(actions)
                target = actions[0].cluster if actions else "east"
            submit(sim, target, nxt)
            touched.add(target)
            nxt = next(arrivals, None)
        for c in sorted(touched):
            if not (lose and c == LOST_CLUSTER and LOSS_AT_S <= now < back_at):
                cycle(sim, c, now, by_id)
        if returned:  # a workload running in two clusters at once (the lost one back) is a duplicate
            duplicates |= {jid for jid in touched_jobs(sim) if running_in(sim, jid) > 1}
    waits = [sim.started[j.id] - j.at for j in jobs if j.id in sim.started]
    return {
        "mean_wait_s": sum(waits) / len(waits),
        "max_wait_s": max(waits),
        "started": len(waits),
        "copies": copies,
        "duplicates": len(duplicates),  # workloads seen running in two clusters at once
    }


def main(seed: int, n: int) -> dict[str, object]:
    jobs = workload(seed, n)
    teams = list(TEAMS)
    static = {}
    for assignment in itertools.product(CLUSTERS, repeat=len(teams)):
        place = dict(zip(teams, assignment, strict=True))
        static[assignment] = run(jobs, place)
    best = min(static, key=lambda a: float(static[a]["mean_wait_s"]))  # type: ignore[arg-type]
    dyn, loss = run(jobs, None), run(jobs, None, lose=True)
    best_mean, best_max = float(static[best]["mean_wait_s"]), float(static[best]["max_wait_s"])  # type: ignore[arg-type]
    return {
        "seed": seed,
        "jobs": n,
        "clusters": {c: NODES * GPUS_PER_NODE for c in CLUSTERS},
        "team_share": TEAMS,
        "best_static": dict(zip(teams, best, strict=True)),
        "best_static_mean_wait_s": round(best_mean, 1),
        "dispatch_mean_wait_s": round(float(dyn["mean_wait_s"]), 1),  # type: ignore[arg-type]
        "mean_wait_ratio_vs_best_static": round(float(dyn["mean_wait_s"]) / best_mean, 3),  # type: ignore[arg-type]
        "max_wait_ratio_vs_best_static": round(float(dyn["max_wait_s"]) / best_max, 3),  # type: ignore[arg-type]
        "remote_copies_per_workload": round(int(dyn["copies"]) / n, 3),  # type: ignore[call-overload]
        "cluster_loss": {"cluster": LOST_CLUSTER, "at_s": LOSS_AT_S, "timeout_s": dispatch.LOST_AFTER_S},
        "copies_per_workload_with_loss": round(int(loss["copies"]) / n, 3),  # type: ignore[call-overload]
        "duplicates_after_cluster_loss": loss["duplicates"],
        "started_with_loss": loss["started"],
    }


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    print(json.dumps(main(args[0] if args else 1, args[1] if len(args) > 1 else 400), indent=2))
