"""Restart policy for supervised processes (pure: the supervisor passes in times)."""

from __future__ import annotations

from dataclasses import dataclass

from services.runtime.backoff import Backoff


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    healthy_after_s: float = 60.0  # a process that ran this long is healthy: its back-off resets


def next_delay(policy: RestartPolicy, previous_delay_s: float, ran_for_s: float) -> float:
    """How long to wait before restarting a process that just exited after running `ran_for_s`."""
    if ran_for_s >= policy.healthy_after_s or previous_delay_s <= 0:
        return policy.first_delay_s
    return Backoff(policy.first_delay_s, policy.max_delay_s).next(previous_delay_s)
