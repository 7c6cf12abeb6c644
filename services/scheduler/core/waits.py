"""Why a queued job still waits, as a value: the cycle decides on the kind (may it reserve? is the
answer the same for every job of its shape?) and shows the text (`Cycle.waiting`, `chamber explain`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class WaitKind(StrEnum):
    POOL = "pool"  # the job's pool is not defined
    BUDGET = "budget"  # its team's budget holds new work
    IDLE = "idle"  # suspended as idle: waits for its owner's `chamber resume`
    CRITICAL = "critical"  # its team may not run critical work in the pool
    BACKFILL = "backfill"  # starting now would delay the pool's EASY reservation
    QUOTA = "quota"  # the team's own limits (guarantee, borrow limit, non-preemptible rule)
    ROOM = "room"  # other teams hold or keep back the pool's GPUs (frees as their work ends)
    DRAIN = "drain"  # GPUs lent to other teams' non-preemptible work come back as it ends
    HELD_BACK = "held-back"  # a protected job waits for capacity in the pool (starvation guard)
    CAPACITY = "capacity"  # not enough free GPUs where it may run


@dataclass(frozen=True)
class Wait:
    kind: WaitKind
    text: str

    def prefixed(self, prefix: str) -> Wait:
        return Wait(self.kind, prefix + self.text) if prefix else self
