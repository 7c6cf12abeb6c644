"""`/metrics` passes the rules of `promtool check metrics` (issue 16, finding 14: a gauge was named
`chamber_gpus_total`, like a counter)."""

from __future__ import annotations

from prometheus_client import generate_latest

from services.gateway.core import GatewayState, evolve
from services.gateway.metrics import registry_for
from tests.gateway_builders import a_scripted_fleet
from tests.promlint import lint


def exposition_of_a_busy_fleet() -> str:
    state = GatewayState()
    for event in a_scripted_fleet():  # nodes, jobs, quotas, prices, costs, a fault and an isolation
        evolve(state, event)
    return generate_latest(registry_for(lambda: state)).decode()


def test_the_exposition_of_a_busy_fleet_follows_the_promtool_naming_rules() -> None:
    text = exposition_of_a_busy_fleet()
    assert "chamber_team_cost_total{" in text and "chamber_gpus " in text  # every kind of series is there
    assert lint(text) == []


def test_the_linter_finds_what_promtool_finds() -> None:
    bad = (
        "# HELP chamber_gpus_total GPUs\n# TYPE chamber_gpus_total gauge\nchamber_gpus_total 8\n"
        "# HELP chamber_wait_hours wait\n# TYPE chamber_wait_hours gauge\nchamber_wait_hours 1\n"
        "# HELP chamber_lag_ms lag\n# TYPE chamber_lag_ms gauge\nchamber_lag_ms 1\n"
        "# HELP chamber_jobs_gauge jobs\n# TYPE chamber_jobs_gauge gauge\nchamber_jobs_gauge 1\n"
    )
    found = lint(bad)
    assert any("chamber_gpus_total: non-counter" in p for p in found)
    assert any("chamber_wait_hours: use base unit 'seconds'" in p for p in found)
    assert any("chamber_lag_ms: metric names should not contain abbreviated units" in p for p in found)
    assert any("chamber_jobs_gauge: metric name should not include type" in p for p in found)
