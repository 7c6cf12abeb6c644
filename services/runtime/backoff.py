"""One back-off rule for every retry loop: start small, double, cap (pure: callers sleep)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.2
    max_s: float = 5.0

    def next(self, previous_s: float) -> float:
        """The wait after one more failure, given the last wait (0: none yet)."""
        return self.first_s if previous_s <= 0 else min(previous_s * 2, self.max_s)

    def for_attempt(self, attempt: int) -> float:
        """The wait before retry number `attempt` (1-based)."""
        return min(self.first_s * 2 ** max(0, attempt - 1), self.max_s)
