"""The perf core under noise its thresholds were not tuned on (services/perf/scenario.py, noise="hard"):
step and rank jitter, permanent imbalance, counter noise, and two faults at once."""

from __future__ import annotations

import pytest

from services.perf.scenario import INPUT_STALL, TWO_FAULTS, Scenario, plan, run


def hard(kind: str) -> Scenario:
    return Scenario(kind, kind, gang_nodes=4, seed=3, fault_at=40.0, after_s=80.0, noise="hard")


def test_two_faults_at_once_are_detected_and_one_of_them_is_named() -> None:
    out = run(hard(TWO_FAULTS))
    assert out.detected is not None and out.attributed, (out.detected, out.target)
    assert len(out.target["parts"]) == 2  # type: ignore[arg-type]
    assert out.detection_s is not None and out.detection_s <= 30 and out.early == []


@pytest.mark.parametrize("kind", ["healthy_noise", "healthy_phase", "healthy_imbalance"])
def test_healthy_controls_under_hard_noise_flag_nothing(kind: str) -> None:
    out = run(hard(kind))
    assert out.detected is None and out.early == [] and out.isolations == []


def test_the_hard_plan_adds_two_faults_and_marks_every_scenario() -> None:
    scenarios = plan(1, (8,), noise="hard")
    assert {s.noise for s in scenarios} == {"hard"} and sum(s.kind == TWO_FAULTS for s in scenarios) == 1
    assert all(s.kind != TWO_FAULTS for s in plan(1, (8,)))


def test_an_input_stall_is_slow_with_no_culprit_and_isolates_nothing() -> None:
    """A known limit, kept visible: every rank waiting on its input looks like a slowdown with nothing
    diverging, so perf says `unknown` (counted against precision by the bench); health moves nothing."""
    out = run(hard(INPUT_STALL))
    assert out.speed_during < 0.85 and out.isolations == []
    assert [e.culprit.value for e in out.early] == ["unknown"]
