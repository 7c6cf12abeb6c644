"""Metrics of a simulated run (pure). Times in seconds, GPU-time in GPU-hours where named so.

- utilization: allocated GPU-time / healthy capacity GPU-time, over first submit .. last completion;
  utilization_while_submitting: the same over first .. last submit (the tail of the last long jobs
  draining an empty fleet does not dilute it)
- jct: completion - submit; wait (queueing delay): first start - submit; queued: every stretch in
  the queue, the first wait plus each wait after a preemption or a fault until the job ran again
- by_team.share_received: useful GPU-time the team ran within the contended window (first to last
  submit) over its entitlement there, min(guarantee x window, GPU-time it submitted in the window);
  jain_fairness is Jain's index over min(share_received, 1) — 1.0 when every team got what it was
  entitled to, lower when some were starved (borrowing beyond the entitlement is not unfair)
- stranded_gpu_hours: healthy free GPUs while jobs that would have fit were waiting
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from services.tracesim.engine import Outcome
from services.tracesim.model import SimJob


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of unsorted values; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return float(ordered[rank - 1])


def mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n * sum x^2); 1.0 is perfectly even."""
    if not values:
        return 1.0
    square_sum = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * square_sum) if square_sum else 1.0


def _useful_in_window(job: SimJob, start: float, end: float) -> float:
    """Useful GPU-seconds of a completed job inside [start, end], taking its last run as useful.

    A simplification: only the final, uninterrupted run is counted as useful; earlier kept progress
    (checkpointed before a preemption) is attributed to that last run's window too."""
    if job.end is None or job.first_start is None:
        return 0.0
    run_from = job.end - job.t.duration_s
    overlap = max(0.0, min(job.end, end) - max(run_from, start))
    return overlap * job.t.gpus


def summarize(outcome: Outcome) -> dict[str, Any]:
    jobs = list(outcome.jobs.values())
    done = [j for j in jobs if j.end is not None]
    started = [j for j in jobs if j.first_start is not None]
    jct = [j.end - j.t.submit_s for j in done]  # type: ignore[operator]
    wait = [j.first_start - j.t.submit_s for j in started]  # type: ignore[operator]
    by_priority: dict[str, dict[str, float]] = {}
    for prio in sorted({j.t.priority.value for j in jobs}):
        w = [j.first_start - j.t.submit_s for j in started if j.t.priority.value == prio]  # type: ignore[operator]
        q = [j.queued_s for j in started if j.t.priority.value == prio]
        by_priority[prio] = {
            "jobs": sum(1 for j in jobs if j.t.priority.value == prio),
            "wait_mean_s": mean(w),
            "wait_p50_s": percentile(w, 50),
            "wait_p99_s": percentile(w, 99),
            "queued_mean_s": mean(q),
            "queued_p99_s": percentile(q, 99),
        }
    window_start, window_end = outcome.first_submit, outcome.last_submit
    window = max(window_end - window_start, 1.0)
    by_team: dict[str, dict[str, float]] = {}
    shares = []
    for team in sorted({j.t.team for j in jobs}):
        mine = [j for j in jobs if j.t.team == team]
        submitted = sum(j.t.duration_s * j.t.gpus for j in mine if j.t.submit_s <= window_end)
        guarantee = outcome.quotas[team].guaranteed if team in outcome.quotas else 0
        entitlement = min(guarantee * window, submitted)
        received = sum(_useful_in_window(j, window_start, window_end) for j in mine)
        share = received / entitlement if entitlement else 1.0
        shares.append(min(share, 1.0))
        w = [j.first_start - j.t.submit_s for j in mine if j.first_start is not None]
        by_team[team] = {
            "share_received": round(share, 4),
            "entitlement": round(entitlement / 3600, 2),  # GPU-hours
            "received_gpu_hours": round(received / 3600, 2),
            "wait_mean_s": mean(w),
        }
    return {
        "utilization": round(outcome.allocated_gpu_s / outcome.capacity_gpu_s, 4) if outcome.capacity_gpu_s else 0.0,
        "utilization_while_submitting": round(outcome.window_allocated_gpu_s / outcome.window_capacity_gpu_s, 4)
        if outcome.window_capacity_gpu_s
        else 0.0,
        "makespan_s": outcome.end - outcome.first_submit,
        "jct_mean_s": mean(jct),
        "jct_p50_s": percentile(jct, 50),
        "jct_p95_s": percentile(jct, 95),
        "jct_p99_s": percentile(jct, 99),
        "wait_mean_s": mean(wait),
        "wait_p50_s": percentile(wait, 50),
        "wait_p95_s": percentile(wait, 95),
        "wait_p99_s": percentile(wait, 99),
        "by_priority": by_priority,
        "by_team": by_team,
        "jain_fairness": round(jain(shares), 4),
        "preemptions": sum(j.preemptions for j in jobs),
        "requeues": sum(j.requeues for j in jobs),
        "lost_gpu_hours": round(sum(j.lost_gpu_s for j in jobs) / 3600, 2),
        "lost_to_faults_gpu_hours": round(sum(j.lost_to_faults_gpu_s for j in jobs) / 3600, 2),
        "hang_gpu_hours": round(sum(j.hang_gpu_s for j in jobs) / 3600, 2),
        "fault_moves": sum(j.fault_moves for j in jobs),
        "lost_to_faults_if_waiting_gpu_hours": round(sum(j.waiting_cost_gpu_s for j in jobs) / 3600, 2),
        "stranded_gpu_hours": round(outcome.stranded_gpu_s / 3600, 2),
        "jobs_completed": len(done),
        "jobs_unfinished": outcome.unfinished,
    }


def ratios_to(baseline: dict[str, Any], other: dict[str, Any]) -> None:
    """Add to each class of `other` its wait ratio to the same class under `baseline` (None when
    the baseline's wait is 0: no ratio; a policy's class missing from the baseline gets none)."""
    for prio, row in other["by_priority"].items():
        base = baseline["by_priority"].get(prio)
        if base is None:
            continue
        row["ratio_to_fifo"] = {
            key: (round(row[f"wait_{key}_s"] / base[f"wait_{key}_s"], 3) if base[f"wait_{key}_s"] else None)
            for key in ("mean", "p50", "p99")
        }
