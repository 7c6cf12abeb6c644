"""Scheduling policies as configuration: which queue order runs, and which rules are on.

`chamber` is the real thing. The baselines let the simulator compare like with like through the
same cycle code: `fifo` is what a plain cluster gives (submit order, no quotas, no preemption,
anything that fits starts), `static-quota` is hard partitioning (each team confined to its
guarantee, no borrowing, no preemption)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

QueueKey = tuple[int, float, float, str]  # priority rank, -fair share, submit time, job id


def by_priority_then_fair_share(key: QueueKey) -> QueueKey:
    """Priority class, then fair-share factor (higher first), then submit time, then job id."""
    return key


def by_submit_time(key: QueueKey) -> QueueKey:
    """Submit time, then job id."""
    return (0, 0.0, key[2], key[3])


ORDERINGS: dict[str, Callable[[QueueKey], QueueKey]] = {
    "priority-fair-share": by_priority_then_fair_share,
    "fifo": by_submit_time,
}


@dataclass(frozen=True)
class Policy:
    name: str = "chamber"
    order: str = "priority-fair-share"  # a key of ORDERINGS
    quotas: bool = True  # enforce guarantees and limits at all
    borrowing: bool = True  # run beyond the guarantee on idle capacity of the pool
    preemption: bool = True  # priority, reclaim and critical preemption
    backfill: bool = True  # EASY reservations; off: anything that fits starts, in order
    preemption_searches: int = 4  # victim searches per cycle at most (the costly part)


CHAMBER = Policy()
POLICIES: dict[str, Policy] = {
    "chamber": CHAMBER,
    "fifo": Policy(name="fifo", order="fifo", quotas=False, preemption=False, backfill=False),
    "static-quota": Policy(name="static-quota", borrowing=False, preemption=False),
}
