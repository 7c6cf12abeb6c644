"""Run one or more policies on the same trace and collect their metrics."""

from __future__ import annotations

from typing import Any

from services.tracesim.baselines import Fifo, StaticQuota
from services.tracesim.engine import FleetSpec, Outcome, Policy, Simulation
from services.tracesim.metrics import summarize
from services.tracesim.quotas import TeamQuota
from services.tracesim.trace import TraceJob

POLICIES = ("fifo", "static-quota", "chamber")


def make_policy(name: str) -> Policy:
    if name == "fifo":
        return Fifo()
    if name == "static-quota":
        return StaticQuota()
    if name == "chamber":
        from services.tracesim.chamber_policy import ChamberPolicy

        return ChamberPolicy()
    raise ValueError(f"unknown policy {name!r}; use one of {', '.join(POLICIES)}")


def simulate(
    jobs: list[TraceJob],
    fleet: FleetSpec,
    quotas: dict[str, TeamQuota],
    policy: str,
    **options: Any,
) -> Outcome:
    return Simulation(jobs, fleet, quotas, make_policy(policy), **options).run()


def compare(
    jobs: list[TraceJob], fleet: FleetSpec, quotas: dict[str, TeamQuota], policies: list[str], **options: Any
) -> tuple[dict[str, Any], dict[str, Outcome]]:
    outcomes = {name: simulate(jobs, fleet, quotas, name, **options) for name in policies}
    return {"policies": {name: summarize(o) for name, o in outcomes.items()}}, outcomes
