"""Scheduler flags for the queue-order, starvation and preemption settings (the core's `Policy`), kept apart
from the service so the shell only calls `add_policy_arguments` and `policy_from_args`."""

from __future__ import annotations

import argparse

from services.scheduler.core.policy import CHAMBER, Policy

HOUR = 3600.0


def _at_least_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number, 0 or more")
    return value


def _above_zero(text: str) -> float:
    value = _at_least_zero(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    d = CHAMBER
    parser.add_argument(
        "--age-weight",
        type=_at_least_zero,
        default=d.age_weight,
        help=f"weight of queue age in the priority; one priority class is worth 1000 (default {d.age_weight:g})",
    )
    parser.add_argument(
        "--age-cap",
        type=_above_zero,
        default=d.age_cap_s / HOUR,
        metavar="HOURS",
        help=f"age stops adding priority after this long in the queue (default {d.age_cap_s / HOUR:g})",
    )
    bound = d.starvation_bound_s
    parser.add_argument(
        "--starvation-bound",
        type=_at_least_zero,
        default=None if bound is None else bound / HOUR,
        metavar="HOURS",
        help="a job queued this long gets a reservation no later job may delay; 0 turns the guard off "
        f"(default {0 if bound is None else bound / HOUR:g})",
    )

    worth = d.preemption_worth
    add_preemption_worth_argument(parser, default=0 if worth is None else worth)


def add_preemption_worth_argument(parser: argparse.ArgumentParser, default: float | None) -> None:
    """`--preemption-worth RATIO` (the scheduler service's, and `chamber sim`'s for its chamber policy)."""
    worth = CHAMBER.preemption_worth
    parser.add_argument(
        "--preemption-worth",
        type=_at_least_zero,
        default=default,
        metavar="RATIO",
        help="a job preempts only if its victims lose at most this many times the GPU-time its wait would "
        "cost (by runtime estimates; critical work and waits without estimates preempt anyway); 0 always "
        f"preempts when allowed (default {0 if worth is None else worth:g})",
    )


def chamber_tuning(args: argparse.Namespace) -> dict[str, float | None]:
    """The chamber-policy fields `--preemption-worth` sets in a simulation ({} when not given)."""
    worth = getattr(args, "preemption_worth", None)
    return {} if worth is None else {"preemption_worth": worth or None}


def policy_from_args(args: argparse.Namespace, **overrides: object) -> Policy:
    """The chamber policy with the flags' settings (checked by argparse: no bad value gets here);
    a namespace built without these flags (embedding, tests) gets the defaults."""
    d = CHAMBER
    bound = getattr(args, "starvation_bound", None if d.starvation_bound_s is None else d.starvation_bound_s / HOUR)
    worth = getattr(args, "preemption_worth", d.preemption_worth)
    return Policy(
        age_weight=getattr(args, "age_weight", d.age_weight),
        age_cap_s=getattr(args, "age_cap", d.age_cap_s / HOUR) * HOUR,
        starvation_bound_s=None if not bound else bound * HOUR,
        preemption_worth=worth or None,
        **overrides,  # type: ignore[arg-type]
    )
