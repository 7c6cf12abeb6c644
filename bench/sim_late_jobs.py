"""Why jobs wait in a simulated run: the chamber policy on a trace (the bundled ITP trace with
issue 19's class mix by default, or one of bench/fairness.py's traces with --bench-trace), and
where the jobs waited (time-weighted waiting reasons, recorded every scheduling cycle): per class
over all jobs, and for the jobs that waited longer than --late-hours; plus the work each kind of
preemption threw away, and for the jobs that need a whole node how long, when each arrived, no node
could have been free of non-preemptible work (`whole_node_jobs`: a floor no queue order beats);
per class, the longest waits and the class's mean without them (`longest_waits_by_class`).

    .venv/bin/python bench/sim_late_jobs.py [--gpus 1280] [--late-hours 27.7] [--preemption-worth R]
    .venv/bin/python bench/sim_late_jobs.py --bench-trace openb --seed 0 --gpus 40 --late-hours 24

Prints one JSON object. With `--preemption-worth 0` (preempt whenever allowed) it reproduces the
third pass of issue 19, whose late low jobs waited behind re-run work (README, priority classes).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from events import JobPreempted  # noqa: E402
from services.scheduler.core import schedule  # noqa: E402
from services.scheduler.core.state import estimate_s  # noqa: E402
from services.scheduler.policy_options import add_preemption_worth_argument, chamber_tuning  # noqa: E402
from services.tracesim.chamber_policy import CorePolicy  # noqa: E402
from services.tracesim.classes import DEFAULT_MIX, assign, parse_mix  # noqa: E402
from services.tracesim.engine import FleetSpec, Simulation  # noqa: E402
from services.tracesim.model import Action, Start  # noqa: E402
from services.tracesim.quotas import equal_shares  # noqa: E402
from services.tracesim.run import add_fair_share_argument, make_policy  # noqa: E402
from services.tracesim.trace import load  # noqa: E402

HOUR = 3600.0


def kind(why: str) -> str:
    """A waiting reason without its numbers and names: what kind of wait it is."""
    protected = why.startswith("protected by the starvation guard")
    why = re.sub(r"^protected by the starvation guard since .*?\); ", "", why)  # its times, not its reason
    why = re.sub(r"would delay \S+,", "would delay J,", why)
    why = re.sub(r"\bteam \S+", "team T", why)
    why = re.sub(r"\d+(\.\d+)?", "#", why)
    return ("protected: " if protected else "") + why.split(";")[0][:100]


class Recording(CorePolicy):
    """The core policy, recording each queued job's waiting reason as cycles change it."""

    def setup(self, fleet: FleetSpec, quotas: dict[str, Any]) -> None:
        super().setup(fleet, quotas)
        self.current: dict[str, tuple[str, float]] = {}
        self.waited: dict[str, Counter[str]] = defaultdict(Counter)
        self.behind: defaultdict[str, float] = defaultdict(float)  # job -> seconds more urgent work left it no room
        self.last: tuple[float, list[str]] = (0.0, [])
        # job needing a whole node -> hours, when first seen waiting, until some node that could hold
        # it would be free of non-preemptible work (by runtime estimates; inf: work without one)
        self.no_whole_node: dict[str, float] = {}

    def decide(self, now: float) -> list[Action]:
        # `schedule` is pure: looking at the cycle first changes nothing the real decide does
        self.publish_fair_share(now)  # the factors this cycle reads
        waiting = schedule(self.state, now, self.mark, policy=self.policy).waiting
        for jid, why in waiting.items():
            if jid not in self.no_whole_node and self._whole_node(jid):
                self.no_whole_node[jid] = self._until_a_node_is_whole(jid, now) / HOUR
            k = kind(why)
            old = self.current.get(jid)
            if old is None or old[0] != k:
                if old is not None:
                    self.waited[jid][old[0]] += now - old[1]
                self.current[jid] = (k, now)
        since, blocked = self.last
        for jid in blocked:
            self.behind[jid] += now - since
        self.last = (now, self._behind_more_urgent(waiting))
        actions = super().decide(now)
        for a in actions:
            if isinstance(a, Start) and a.job_id in self.current:
                k, since = self.current.pop(a.job_id)
                self.waited[a.job_id][k] += now - since
        return actions

    def _whole_node(self, jid: str) -> bool:
        """The job runs on one node and needs every GPU of the largest node."""
        spec = self.state.jobs[jid].spec
        return spec.replicas == 1 and spec.total_gpus >= max(len(n.gpus) for n in self.state.node_by_id)

    def _until_a_node_is_whole(self, jid: str, now: float) -> float:
        """Seconds until the first node big enough for the job holds no non-preemptible work (by the
        estimated ends of the work on it now; preemptible work could be preempted): however the
        queue is ordered, the job cannot start before that."""
        s = self.state
        gpus = s.jobs[jid].spec.total_gpus
        soonest = math.inf
        for node in s.node_by_id:
            if len(node.gpus) < gpus:
                continue
            end = now
            for holder in set(node.owners.values()):
                j = s.jobs[holder]
                if j.spec.preemptible:
                    continue
                est = estimate_s(j)
                end = max(end, math.inf if est is None or j.running_since is None else j.running_since + est)
            soonest = min(soonest, end - now)
        return soonest

    def _behind_more_urgent(self, waiting: dict[str, str]) -> list[str]:
        """The waiting jobs that more urgent work alone leaves no room for: with every job of their
        class or lower gone, the pool would not have their GPUs free, or (a job on one node) no node
        would. Their wait is priority doing its job, not lower classes standing in front of them."""
        s = self.state
        on_node: list[Counter[int]] = []  # per node: GPUs held by rank
        for node in s.node_by_id:
            held: Counter[int] = Counter()
            for jid in node.owners.values():
                held[s.jobs[jid].spec.priority.rank] += 1
            on_node.append(held)
        sizes = [len(node.gpus) for node in s.node_by_id]
        total = sum(sizes)
        out = []
        for jid in waiting:
            spec = s.jobs[jid].spec
            rank, gpus = spec.priority.rank, spec.total_gpus
            urgent = [sum(n for r, n in held.items() if r < rank) for held in on_node]
            if sum(urgent) + gpus > total or (
                spec.replicas == 1 and all(size - u < gpus for size, u in zip(sizes, urgent, strict=True))
            ):
                out.append(jid)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=ROOT / "data" / "traces" / "itp" / "jobs.csv")
    ap.add_argument("--gpus", type=int, default=1280)
    ap.add_argument("--classes", default=DEFAULT_MIX, help="class mix (default issue 19's)")
    ap.add_argument("--late-hours", type=float, default=27.7, help="a job is late past this wait (fifo's p99)")
    ap.add_argument("--bench-trace", help="one of bench/fairness.py's traces instead of --trace")
    ap.add_argument("--seed", type=int, default=0, help="with --bench-trace: its seed (classes, teams)")
    ap.add_argument("--openb", type=Path, help="with --bench-trace openb: the pod list CSV")
    ap.add_argument("--teams", type=int, help="with --bench-trace: teams of its random draw (default 4)")
    add_preemption_worth_argument(ap, default=None)
    add_fair_share_argument(ap)
    args = ap.parse_args()
    if args.bench_trace:
        from bench.fairness import OPENB, RANDOM_TEAMS, TRACES

        if args.bench_trace not in TRACES:
            ap.error(f"--bench-trace: use one of {', '.join(TRACES)}")
        if args.teams is not None and args.teams < 1:
            ap.error("--teams must be at least 1")
        built = TRACES[args.bench_trace].build(args.seed, args.openb or OPENB, args.teams or RANDOM_TEAMS)
        jobs = [j for j in built if j.gpus <= args.gpus]
    else:
        jobs = assign(load(args.trace).jobs, parse_mix(args.classes))
    by_id = {j.id: j for j in jobs}
    tuning = chamber_tuning(args)
    policy = Recording(make_policy("chamber", tuning).policy, fair_share=args.fair_share)
    quotas = equal_shares(sorted({j.team for j in jobs}), args.gpus)
    outcome = Simulation(jobs, FleetSpec(gpus=args.gpus), quotas, policy).run()
    late = [
        j
        for j in outcome.jobs.values()
        if j.first_start is not None and j.first_start - j.t.submit_s > args.late_hours * HOUR
    ]
    reasons: Counter[str] = Counter()
    for j in late:
        for k, seconds in policy.waited[j.t.id].items():
            reasons[k] += seconds / HOUR
    # every job's wait by class and reason: what each class waits for, in hours summed over its jobs
    by_class: dict[str, Counter[str]] = defaultdict(Counter)
    waited_by_class: Counter[str] = Counter()
    behind_by_class: defaultdict[str, float] = defaultdict(float)
    for j in outcome.jobs.values():
        if j.first_start is None:
            continue
        waited_by_class[j.t.priority.value] += (j.first_start - j.t.submit_s) / HOUR
        behind_by_class[j.t.priority.value] += policy.behind[j.t.id] / HOUR
        for k, seconds in policy.waited[j.t.id].items():
            by_class[j.t.priority.value][k] += seconds / HOUR
    lost: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for e in policy.folded:
        if isinstance(e, JobPreempted):
            by = by_id.get(e.preemptor_job_id or "")
            key = f"{e.reason.value} by {by.priority.value if by else '?'} of {by_id[e.job_id].priority.value}"
            lost[key] += e.lost_work_gpu_s / HOUR
            count[key] += 1
    out = {
        "gpus": args.gpus,
        "chamber_tuning": tuning,
        "fair_share_factor": args.fair_share,
        "late_hours": args.late_hours,
        "late_jobs": len(late),
        "late_by_class": dict(Counter(j.t.priority.value for j in late).most_common()),
        "late_by_gpus": dict(Counter(str(j.t.gpus) for j in late).most_common()),
        "late_waited_hours_by_reason": {k: round(h) for k, h in reasons.most_common(12)},
        "waited_hours_by_class": {
            c: {
                "total": round(waited_by_class[c]),
                # hours more urgent work alone left no room for the job (its GPUs in the pool, or a node)
                "behind_more_urgent_work": round(behind_by_class[c]),
                "by_reason": {k: round(h) for k, h in r.most_common(8)},
            }
            for c, r in sorted(by_class.items())
        },
        "preemptions": {k: {"count": count[k], "gpu_hours_lost": round(lost[k])} for k, _ in lost.most_common()},
        "whole_node_jobs": _whole_node_jobs(outcome, policy.no_whole_node, policy.waited),
        "longest_waits_by_class": _longest_by_class(outcome, policy.waited),
    }
    print(json.dumps(out, indent=1))


def _longest_by_class(outcome: Any, waited: dict[str, Counter[str]], top: int = 5) -> dict[str, Any]:
    """Per class, its mean wait to the first start, the mean with its 1..`top` longest waits left
    out (a class's mean can rest on a few jobs: a class of 61 jobs whose mean is one job's wait),
    and those jobs, each with the reason it waited under longest."""
    by_class: dict[str, list[Any]] = defaultdict(list)
    for j in outcome.jobs.values():
        if j.first_start is not None:
            by_class[j.t.priority.value].append(j)
    out: dict[str, Any] = {}
    for c, jobs in sorted(by_class.items()):
        jobs.sort(key=lambda j: j.t.submit_s - j.first_start)  # longest wait first
        waits = [(j.first_start - j.t.submit_s) / HOUR for j in jobs]
        total, n = sum(waits), len(waits)
        rows = []
        for j, w in zip(jobs[:top], waits[:top], strict=True):
            mostly = waited[j.t.id].most_common(1)
            rows.append(
                {
                    "job": j.t.id,
                    "team": j.t.team,
                    "gpus": j.t.gpus,
                    "preemptible": j.t.preemptible,
                    "submit_h": round(j.t.submit_s / HOUR, 1),
                    "wait_h": round(w, 1),
                    "runtime_h": round(j.t.duration_s / HOUR, 1),
                    "mostly": f"{mostly[0][0]} ({mostly[0][1] / HOUR:.0f} h)" if mostly else "",
                }
            )
        out[c] = {
            "jobs": n,
            "mean_h": round(total / n, 2),
            "mean_without_longest_h": [
                round((total - sum(waits[:k])) / (n - k), 2) for k in range(1, min(top, n - 1) + 1)
            ],
            "longest": rows,
        }
    return out


def _whole_node_jobs(outcome: Any, no_whole_node: dict[str, float], waited: dict[str, Counter[str]]) -> dict[str, Any]:
    """Per class, the jobs that needed a whole node and waited: their mean wait and runtime, and the
    mean hours that, when each was first seen waiting, no node could have been free of
    non-preemptible work; plus the ten that waited longest, each with the reason it waited under
    longest."""
    rows = []
    for jid, blocked_h in no_whole_node.items():
        j = outcome.jobs[jid]
        if j.first_start is None:
            continue
        mostly = waited[jid].most_common(1)
        rows.append(
            {
                "job": jid,
                "class": j.t.priority.value,
                "team": j.t.team,
                "gpus": j.t.gpus,
                "wait_h": round((j.first_start - j.t.submit_s) / HOUR, 1),
                "runtime_h": round(j.t.duration_s / HOUR, 1),
                "no_whole_node_h": round(blocked_h, 1) if blocked_h != math.inf else None,
                "mostly": f"{mostly[0][0]} ({mostly[0][1] / HOUR:.0f} h)" if mostly else "",
            }
        )
    by_class: dict[str, Any] = {}
    for c in sorted({r["class"] for r in rows}):
        mine = [r for r in rows if r["class"] == c]
        known = [r["no_whole_node_h"] for r in mine if r["no_whole_node_h"] is not None]
        by_class[c] = {
            "jobs": len(mine),
            "mean_wait_h": round(sum(r["wait_h"] for r in mine) / len(mine), 1),
            "mean_runtime_h": round(sum(r["runtime_h"] for r in mine) / len(mine), 1),
            "mean_no_whole_node_h": round(sum(known) / len(known), 1) if known else None,
        }
    return {"by_class": by_class, "longest_waits": sorted(rows, key=lambda r: -r["wait_h"])[:10]}


if __name__ == "__main__":
    main()
