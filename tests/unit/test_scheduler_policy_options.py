"""The scheduler's policy flags: defaults, off switches and bad values refused at the door."""

from __future__ import annotations

import argparse

import pytest

from services.scheduler.core.policy import CHAMBER
from services.scheduler.policy_options import add_policy_arguments, policy_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_policy_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_are_the_chamber_policy() -> None:
    policy = policy_from_args(parse())
    assert (policy.age_weight, policy.starvation_bound_s, policy.preemption_worth) == (
        CHAMBER.age_weight,
        CHAMBER.starvation_bound_s,
        CHAMBER.preemption_worth,
    )
    assert policy_from_args(argparse.Namespace()).preemption_worth == CHAMBER.preemption_worth


def test_zero_turns_the_guard_and_the_preemption_check_off() -> None:
    policy = policy_from_args(parse("--starvation-bound", "0", "--preemption-worth", "0"))
    assert policy.starvation_bound_s is None and policy.preemption_worth is None
    assert policy_from_args(parse("--preemption-worth", "0.5")).preemption_worth == 0.5


@pytest.mark.parametrize("bad", ["-1", "inf", "nan", "lots"])
def test_bad_values_are_refused(bad: str) -> None:
    with pytest.raises(argparse.ArgumentError, match="preemption-worth"):
        parse("--preemption-worth", bad)
