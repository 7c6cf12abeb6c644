"""Scheduling policies as configuration: which queue order runs, and which rules are on.

`chamber` is the real thing. The baselines run through the same cycle code so the simulator compares
like with like: `fifo` is what a plain cluster gives (one queue in submit order, head-of-line
blocking, no quotas, no preemption), `static-quota` is hard partitioning (each team confined to its
guarantee, first come first served within the team, no borrowing, no preemption).

Queue order (`priority-fair-share`, after Slurm's multifactor priority): every factor is
normalised to 0..1 and weighted,

    priority = class_weight x class + fair_share_weight x fair share + age_weight x min(age / age_cap_s, 1)

class is 1 (critical), 2/3 (high), 1/3 (normal), 0 (low); age counts from when the job last
joined the queue. With the defaults one class step (1,000) outweighs fair share (at most 500) and
age (at most 400) together: classes are strict, and age orders work within its class. The
starvation guard, not age, bounds a class's tail. (Before, age could lift a job two class steps,
so after `age_cap_s` high and normal work ranked alike and normal's few jobs waited less than
high's on every trace of bench/fairness.py: docs/fairness.md.) No job is ever lifted above
critical work (its priority stops just below the lowest a critical job can have). Ties go to the
earlier submit, then the job id.

Starvation guard: a job queued longer than `starvation_bound_s` is protected. A protected job goes
ahead of every job of its class (the longest waiting first), and of one class more above it for
every `guard_lift_every_s` (24 h) it stays protected (never of critical work), so the first of them
blocked for capacity in its pool holds the pool's EASY reservation: backfill and later arrivals
start only if they do not delay it. Classes stay strict for a day of protection: a low job protected
for less than that does not pass waiting high work (lifting protected jobs past every class at once
let low work wait less than high on a trace under heavy load: docs/fairness.md); lifting one class
a day keeps every class's wait bounded behind a steady stream of more urgent work. A lifted low job
goes ahead of the unprotected work of the class it reaches, behind that class's protected work
(`protected_tier`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Literal

from events import PriorityClass
from services.scheduler.core.links import DEFAULT_FAULT_MEMORY_S, KEEP_S

QueueKey = tuple[int, float, float, str]  # priority rank, -fair share, submit time, job id
OrderKey = tuple[float, float, float, str]  # smaller first
QueuedSince = Callable[[str], float]  # job id -> when it last joined the queue

RANKS = tuple(sorted({p.rank for p in PriorityClass}))  # most urgent (critical) first; serving ranks with high
LOWEST_RANK = RANKS[-1]
CRITICAL_RANK = PriorityClass.CRITICAL.rank
_BELOW_CRITICAL = 1e-3  # aged work stops just below the least critical job


@dataclass(frozen=True)
class Policy:
    name: str = "chamber"
    order: str = "priority-fair-share"  # a key of ORDERINGS
    quotas: bool = True  # enforce guarantees and limits at all
    borrowing: bool = True  # run beyond the guarantee on idle capacity of the pool
    preemption: bool = True  # priority, reclaim and critical preemption
    backfill: bool = True  # EASY reservations; off: anything that fits starts, in order
    # Stop at the first job that does not start: "all" (one queue) or per "team"; "" never stops.
    head_of_line: Literal["", "all", "team"] = ""
    preemption_searches: int = 4  # victim searches per cycle at most (the costly part)
    class_weight: float = 3000.0
    fair_share_weight: float = 500.0
    age_weight: float = 400.0
    age_cap_s: float = 1.5 * 3600.0  # Slurm's PriorityMaxAge: age stops counting here
    starvation_bound_s: float | None = 24 * 3600.0  # None: no guard
    # How many classes the starvation guard lifts a protected job: it goes ahead of every job of its
    # own class and of up to this many classes above it (never ahead of critical work), the longest
    # waiting first. 0: protected jobs go first within their class only (classes stay strict).
    guard_lifts_classes: int = 0
    # ... and one class more for every `guard_lift_every_s` it stays protected, so no class waits
    # for good behind a steady stream of more urgent work. None: never.
    guard_lift_every_s: float | None = 24 * 3600.0
    # Multi-node gangs keep off nodes with a degraded NIC and leaves with congestion when anything
    # else fits (core/links.py); a NIC fault counts for `link_fault_memory_s` after it was seen.
    avoid_degraded_links: bool = True
    link_fault_memory_s: float = DEFAULT_FAULT_MEMORY_S
    # While a protected job waits for capacity in its pool, jobs not yet protected take none of that
    # pool's free GPUs (they may still preempt). Off by default: on the ITP trace it cut low's p99 but
    # cost the headline utilization (README, issue 19).
    guard_holds_free_gpus: bool = False
    # A job preempts only when its victims lose at most `preemption_worth` x the GPU-time it would
    # spend waiting otherwise (its GPUs x the time until they free by runtime estimates, the EASY
    # reservation's): throwing away more work than the wait it saves only slows everyone down. On the
    # ITP trace with classes (no checkpoints) preemption lost 122,864 GPU-hours, and low's p99 wait
    # was 42.6 h against fifo's 27.7; with this rule 1,350 and 24.2 (README, issue 19). Critical work,
    # and jobs whose wait has no estimate, preempt as before. None: always preempt when allowed.
    preemption_worth: float | None = 2.0
    # ... and a victim of a less urgent class that waited at least `starvation_bound_s` before it
    # started costs, besides its lost work, its GPUs x that wait: thrown back, it queues again,
    # likely as long. Without it, low gangs on itp-cluster03 that had starved were preempted two and
    # three times and queued 300 to 450 h in all, past fifo's p99 (228 to 382 h); their wait to the
    # first start alone hid it (docs/fairness.md). Off: the lost work alone.
    worth_counts_wait_again: bool = True
    # Non-preemptible work may hold up to its team's fair share of the pool (the capacity water-filled
    # over the teams' demand, by quota weight), beyond what the lending rule allows, taking idle GPUs
    # or preempting lower-class preemptible borrowers of any team (preemption.eligible: `urgent`).
    # What it then holds of another team's guarantee returns by draining (the lender's jobs wait
    # for it holding the reservation). Off: the lending rule alone (quota.py).
    np_fair_share: bool = True
    # A team's protected non-preemptible job keeps room in the team's share against the team's less
    # urgent non-preemptible work too, not only against its own class: else a team's normal jobs
    # started into the room its protected high job waited for (7 such starts on itp-cluster02 at
    # 64 GPUs, and high's mean above normal's). Off: the room is kept against the job's class only.
    room_against_less_urgent: bool = True
    # A job whose GPU or node health took out of service for a degrading fault (a straggler verdict,
    # a flapping or slow NIC: it still runs, slower) moves only where it can land now, else stays
    # (core/degraded.py). Off: every out-of-service holder is requeued, whatever it can get.
    move_only_where_it_lands: bool = True

    def __post_init__(self) -> None:
        for name in ("class_weight", "fair_share_weight", "age_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more")
        if self.age_cap_s <= 0:
            raise ValueError("age_cap_s must be more than 0 seconds")
        if not 0 < self.link_fault_memory_s <= KEEP_S:
            raise ValueError(f"link_fault_memory_s must be more than 0 and at most {KEEP_S:g} seconds")
        if self.preemption_worth is not None and not 0 < self.preemption_worth < math.inf:
            raise ValueError("preemption_worth must be a finite number more than 0 (or None: always preempt)")
        if self.guard_lifts_classes < 0:
            raise ValueError("guard_lifts_classes must be 0 or more")
        if self.guard_lift_every_s is not None and self.guard_lift_every_s <= 0:
            raise ValueError("guard_lift_every_s must be more than 0 seconds (or None: never)")
        if self.starvation_bound_s is not None and self.starvation_bound_s <= 0:
            raise ValueError("starvation_bound_s must be more than 0 seconds (or None: no guard)")

    def protected_since(self, queued_since: float) -> float | None:
        """When a job queued since `queued_since` is (or will be) protected by the starvation guard."""
        return None if self.starvation_bound_s is None else queued_since + self.starvation_bound_s

    def lift(self, queued_since: float, now: float) -> int:
        """Classes the starvation guard lifts a job queued since `queued_since` by now (0 if it is
        not protected): `guard_lifts_classes`, plus one per `guard_lift_every_s` protected."""
        at = self.protected_since(queued_since)
        if at is None or at > now:
            return 0
        every = self.guard_lift_every_s
        return self.guard_lifts_classes + (0 if every is None else int((now - at) // every))

    def priority(self, key: QueueKey, age_s: float) -> float:
        """The multifactor priority of a queued job (higher first)."""
        rank, neg_share = key[0], key[1]
        klass = (LOWEST_RANK - rank) / LOWEST_RANK
        age = min(max(age_s, 0.0) / self.age_cap_s, 1.0)
        value = self.class_weight * klass + self.fair_share_weight * -neg_share + self.age_weight * age
        return value if rank == CRITICAL_RANK else min(value, self.class_weight - _BELOW_CRITICAL)


Order = Callable[[QueueKey], OrderKey]


def guard_band(rank: int, lift: int) -> int:
    """The class a protected job of `rank` queues with: `lift` classes up, never to critical's."""
    return rank if rank == CRITICAL_RANK else max(rank - lift, CRITICAL_RANK + 1)


def protected_tier(rank: int) -> float:
    """Where a protected job of class `rank` sorts among the jobs its band ranks alike: a low job
    after the protected jobs of the classes the guard lifted it to, every other protected job
    before them, the longest waiting first, and every protected job before the unprotected ones
    (1.0). So the guard lifts low work past the unprotected work of the classes above it, never
    past their protected work: else a low job protected for three days went ahead of high work
    waiting as long, and on openb under heavy load low's many short jobs waited less than high's
    (docs/fairness.md)."""
    return 0.5 if rank == LOWEST_RANK else 0.0


def by_multifactor_priority(policy: Policy, queued_since: QueuedSince, now: float) -> Order:
    """Multifactor priority (higher first), then submit time, then job id; a protected (starving)
    job ranks as a job of its band (`guard_band`) with every factor at its most, ahead of the
    unprotected ones there, the longest waiting first."""
    # `priority` inlined: this runs once per queued job in every full cycle.
    protected_before = -math.inf if policy.starvation_bound_s is None else now - policy.starvation_bound_s
    per_rank = policy.class_weight / LOWEST_RANK
    top, share_w = policy.class_weight, policy.fair_share_weight
    age_w, cap = policy.age_weight, policy.age_cap_s
    floor = -top + _BELOW_CRITICAL  # never ahead of critical work, however old

    boosted = -top - share_w - age_w  # a protected job ranks as its band's job with every boost at its most
    lifts, every = policy.guard_lifts_classes, policy.guard_lift_every_s

    def key(k: QueueKey) -> OrderKey:
        since = queued_since(k[3])
        if since <= protected_before:
            # policy.lift, with sorted_queue's float operations
            lift = lifts if every is None else lifts + int((protected_before - since) // every)
            value = guard_band(k[0], lift) * per_rank + boosted
            return (value if k[0] == CRITICAL_RANK else max(value, floor), protected_tier(k[0]), since, k[3])
        age = now - since
        aged = age_w if age >= cap else age_w * max(age, 0.0) / cap
        value = k[0] * per_rank - top + share_w * k[1] - aged
        return (value if k[0] == CRITICAL_RANK else max(value, floor), 1.0, k[2], k[3])

    return key


def sorted_queue(policy: Policy, keys: list[QueueKey], since: list[float], now: float) -> list[QueueKey]:
    """The queue keys in the policy's order, `since` holding when each job last joined the queue:
    `sorted(keys, key=ORDERINGS[policy.order](policy, queued_since, now))`, the same list, faster for
    a long queue. A full cycle sorts every queued job, and with age in the order that is a Python key
    per job plus a sort of unsorted input (before age counted, it was a pass over the sorted queue).
    For the multifactor order the keys are computed column-wise with numpy, with the same float
    operations in the same order as `by_multifactor_priority`, and sorted by lexsort."""
    if policy.order != "priority-fair-share" or len(keys) < _VECTOR_FROM:
        by_id = dict(zip([k[3] for k in keys], since, strict=True))
        return sorted(keys, key=ORDERINGS[policy.order](policy, by_id.__getitem__, now))
    import numpy as np  # here, not at the top: processes that only read the policy's flags stay light

    n = len(keys)
    rank, share, submitted = (np.fromiter(map(itemgetter(i), keys), np.float64, n) for i in range(3))
    order = ordered_rows(policy, (rank, share, submitted, np.array(since, dtype=np.float64)), now, lambda i: keys[i][3])
    return [keys[i] for i in order.tolist()]


def ordered_rows(policy: Policy, columns: tuple[Any, Any, Any, Any], now: float, id_of: Callable[[int], str]) -> Any:
    """`sorted_queue`'s order as row numbers, from numpy columns (rank, -fair share, submit time,
    queued since) of the multifactor order's inputs; `id_of(row)` breaks the ties that remain."""
    import numpy as np

    rank, share, submitted, queued = columns
    protected_before = -math.inf if policy.starvation_bound_s is None else now - policy.starvation_bound_s
    per_rank = policy.class_weight / LOWEST_RANK
    top, floor = policy.class_weight, -policy.class_weight + _BELOW_CRITICAL
    age_w, cap = policy.age_weight, policy.age_cap_s
    age = now - queued
    aged = np.where(age >= cap, age_w, age_w * np.maximum(age, 0.0) / cap)
    protected = queued <= protected_before
    tier = np.where(protected, np.where(rank == LOWEST_RANK, 0.5, 0.0), 1.0)  # protected_tier, column-wise
    lift = np.full(len(rank), float(policy.guard_lifts_classes))
    if policy.guard_lift_every_s is not None:  # one class more per guard_lift_every_s protected
        lift = lift + np.floor_divide(np.maximum(protected_before - queued, 0.0), policy.guard_lift_every_s)
    band = np.where(rank == CRITICAL_RANK, rank, np.maximum(rank - lift, CRITICAL_RANK + 1))
    value = rank * per_rank - top + policy.fair_share_weight * share - aged
    boosted = band * per_rank + (-top - policy.fair_share_weight - age_w)
    value = np.where(protected, boosted, value)
    value = np.where(rank == CRITICAL_RANK, value, np.maximum(value, floor))
    second = np.where(protected, queued, submitted)
    # The job id breaks what ties remain (a numpy string column costs more than the rare ties do).
    order = np.lexsort((second, tier, value))
    value, second, tier = value[order], second[order], tier[order]
    tied = (value[1:] == value[:-1]) & (second[1:] == second[:-1]) & (tier[1:] == tier[:-1])
    for start, end in _runs(np.flatnonzero(tied).tolist()):
        order[start : end + 1] = sorted(order[start : end + 1].tolist(), key=id_of)
    return order


def _runs(tied: list[int]) -> Iterator[tuple[int, int]]:
    """(first, last) positions of each run of equal neighbours, from the positions i tied with i + 1."""
    start = prev = -2
    for i in tied:
        if i != prev + 1:
            if start >= 0:
                yield start, prev + 1
            start = i
        prev = i
    if start >= 0:
        yield start, prev + 1


_VECTOR_FROM = 64  # below this many keys the plain sort is as fast


def by_submit_time(policy: Policy, queued_since: QueuedSince, now: float) -> Order:
    """Submit time, then job id."""

    def key(k: QueueKey) -> OrderKey:
        return (0.0, 0.0, k[2], k[3])

    return key


ORDERINGS: dict[str, Callable[[Policy, QueuedSince, float], Order]] = {
    "priority-fair-share": by_multifactor_priority,
    "fifo": by_submit_time,
}


CHAMBER = Policy()
STRICT_CLASSES = Policy(name="strict-classes", age_weight=0.0, starvation_bound_s=None)  # before issue 19
POLICIES: dict[str, Policy] = {
    "chamber": CHAMBER,
    "fifo": Policy(name="fifo", order="fifo", quotas=False, preemption=False, backfill=False, head_of_line="all"),
    "static-quota": Policy(
        name="static-quota", order="fifo", borrowing=False, preemption=False, backfill=False, head_of_line="team"
    ),
}
