"""Run one or more policies on the same trace and collect their metrics."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from services.tracesim.engine import FleetSpec, Outcome, Policy, Simulation
from services.tracesim.faults import FaultModel
from services.tracesim.metrics import ratios_to, summarize
from services.tracesim.quotas import TeamQuota
from services.tracesim.trace import TraceJob

POLICIES = ("fifo", "static-quota", "chamber")


def add_fair_share_argument(parser: argparse.ArgumentParser) -> None:
    """`--fair-share` / `--no-fair-share` (on by default, as deployed), for `chamber sim` and the benches."""
    parser.add_argument(
        "--fair-share",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="play the quota service's fair-share factor, as the live scheduler gets it: within a class, "
        "teams that used least of their share (usage decayed with a 7-day half-life) go first "
        "(default on); with --no-fair-share every team's factor stays 1",
    )


def make_policy(name: str, tuning: Mapping[str, Any] | None = None, *, fair_share: bool = True) -> Policy:
    """Every policy runs through the scheduler's own core (`services.scheduler.core.POLICIES`);
    `tuning` sets fields of the chamber policy (e.g. `preemption_worth`), never of the baselines;
    `fair_share` plays the quota service's fair-share factor for a policy whose order uses it."""
    from services.scheduler.core import POLICIES as CORE_POLICIES
    from services.tracesim.chamber_policy import CorePolicy

    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; use one of {', '.join(POLICIES)}")
    core = CORE_POLICIES[name]
    return CorePolicy(replace(core, **tuning) if tuning and name == "chamber" else core, fair_share=fair_share)


def simulate(
    jobs: list[TraceJob],
    fleet: FleetSpec,
    quotas: dict[str, TeamQuota],
    policy: str,
    tuning: Mapping[str, Any] | None = None,
    *,
    fair_share: bool = True,
    **options: Any,
) -> Outcome:
    return Simulation(jobs, fleet, quotas, make_policy(policy, tuning, fair_share=fair_share), **options).run()


def compare(
    jobs: list[TraceJob],
    fleet: FleetSpec,
    quotas: dict[str, TeamQuota],
    policies: list[str],
    tuning: Mapping[str, Any] | None = None,
    *,
    fair_share: bool = True,
    **options: Any,
) -> tuple[dict[str, Any], dict[str, Outcome]]:
    outcomes = {
        name: simulate(jobs, fleet, quotas, name, tuning, fair_share=fair_share, **options) for name in policies
    }
    summaries = {name: summarize(o) for name, o in outcomes.items()}
    if "fifo" in summaries:  # per class, how each policy's waits compare with a plain FIFO cluster's
        for name, summary in summaries.items():
            if name != "fifo":
                ratios_to(summaries["fifo"], summary)
    return {"policies": summaries}, outcomes


def fault_savings(
    jobs: list[TraceJob],
    fleet: FleetSpec,
    quotas: dict[str, TeamQuota],
    policy: str,
    proactive: Outcome,
    model: FaultModel,
    options: dict[str, Any],
    tuning: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """GPU-hours lost to node faults moving jobs on a precursor versus waiting for each failure
    (tracesim/faults.py has the model).

    The saving is paired: in the simulated (proactive) run, every fault that hit a job is also costed
    as if the scheduler had waited, on the same job at the same moment. A second, separate run that
    waits is reported too; its schedule diverges after the first fault (other jobs sit on the nodes
    that fail), so its difference to the first run mixes the saving with which jobs the faults hit."""
    waiting = simulate(jobs, fleet, quotas, policy, tuning, fault_model=replace(model, proactive=False), **options)
    keys = ("lost_to_faults_gpu_hours", "hang_gpu_hours", "fault_moves", "requeues")
    ours, theirs = summarize(proactive), summarize(waiting)
    paired = ours["lost_to_faults_if_waiting_gpu_hours"]
    return {
        "policy": policy,
        "model": model.describe(),
        "faults": proactive.faults,
        "precursors": proactive.precursors,
        "proactive": {k: ours[k] for k in keys},
        "waiting_same_faults_gpu_hours": paired,
        "saved_gpu_hours": round(paired - ours["lost_to_faults_gpu_hours"], 2),
        "waiting_run": {k: theirs[k] for k in keys},
    }
