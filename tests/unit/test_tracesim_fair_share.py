"""The simulator plays the quota service's fair-share factor by default (`--no-fair-share` holds it at 1),
so the simulated queue orders a class's work by the teams' decayed usage as the live scheduler does."""

from __future__ import annotations

from services.scheduler.core import CHAMBER, POLICIES
from services.tracesim.chamber_policy import CorePolicy
from services.tracesim.engine import FleetSpec, Simulation
from services.tracesim.quotas import TeamQuota
from services.tracesim.trace import TraceJob

# One GPU, no guarantees (nothing to take back). Team a holds it for 10 h; then a's job and b's job
# queue for it, a's submitted first.
JOBS = [
    TraceJob(id="a0", submit_s=0, duration_s=36_000, gpus=1, team="a"),
    TraceJob(id="a1", submit_s=10, duration_s=100, gpus=1, team="a"),
    TraceJob(id="b1", submit_s=20, duration_s=100, gpus=1, team="b"),
]
QUOTAS = {"a": TeamQuota("a", "default", 0), "b": TeamQuota("b", "default", 0)}


def starts(policy: CorePolicy) -> dict[str, float | None]:
    out = Simulation(JOBS, FleetSpec(gpus=1, gpus_per_node=1), QUOTAS, policy).run()  # type: ignore[arg-type]
    return {j: out.jobs[j].first_start for j in ("a1", "b1")}


def test_without_it_every_factor_stays_1_and_the_earlier_job_goes_first() -> None:
    policy = CorePolicy(CHAMBER, fair_share=False)
    assert starts(policy) == {"a1": 36_000.0, "b1": 36_100.0}
    assert policy.state.fair_share == {}
    assert not any(type(e).__name__ == "FairShareUpdated" for e in policy.folded)


def test_by_default_the_team_that_used_less_goes_first() -> None:
    policy = CorePolicy(CHAMBER)
    assert starts(policy) == {"a1": 36_100.0, "b1": 36_000.0}
    factors = policy.state.fair_share
    assert factors[("default", "a")] < factors[("default", "b")] == 1.0
    # published into the log the core folds, so a replay of the log decides the same
    assert any(type(e).__name__ == "FairShareUpdated" for e in policy.folded)


def test_a_policy_whose_order_ignores_the_factor_gets_none() -> None:
    policy = CorePolicy(POLICIES["fifo"], fair_share=True)
    assert policy.quota is None
    starts(policy)
    assert policy.state.fair_share == {}
