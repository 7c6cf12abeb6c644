"""The demo workload `chamber up` runs on a simulated fleet: three teams with quotas submitting a
mix of jobs (pure: a seeded generator; the shell sends what it yields)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# team, share of the fleet guaranteed, its typical work
TEAMS: tuple[tuple[str, float], ...] = (("vision", 0.40), ("nlp", 0.35), ("research", 0.25))
_SIZES = (1, 1, 2, 2, 4, 4, 8, 8, 16)  # GPUs; 16 is a two-node gang on 8-GPU nodes
_PRIORITIES = ("normal",) * 6 + ("low",) * 3 + ("high",)
_MEAN_GPUS = sum(_SIZES) / len(_SIZES)
_MEAN_DURATION_S = 240.0


@dataclass(frozen=True)
class Arrival:
    at: float
    request: dict[str, Any]  # a scheduler `submit` request


def quota_requests(total_gpus: int) -> list[dict[str, Any]]:
    """Guarantees that add up to the fleet; each team may borrow up to the whole fleet."""
    out = []
    left = total_gpus
    for i, (team, share) in enumerate(TEAMS):
        gpus = left if i == len(TEAMS) - 1 else int(total_gpus * share)
        left -= gpus
        out.append({"team": team, "gpus": gpus, "borrow_limit": total_gpus})
    return out


WARM_FILL = 0.7  # the share of the fleet a new demo's first jobs ask for, one a second


def arrivals(
    seed: int, start: float, total_gpus: int, load: float = 1.1, warm_fill: float = WARM_FILL
) -> Iterator[Arrival]:
    """Poisson arrivals offering `load` x the fleet's GPU-seconds, so a queue forms and borrowing,
    reclaim and preemption all happen. The first jobs come one a second until they ask for
    `warm_fill` of the fleet, so a new dashboard shows a busy fleet within a minute."""
    rng = random.Random(seed)
    rate = load * total_gpus / (_MEAN_GPUS * _MEAN_DURATION_S)  # jobs per second
    at = start
    n = 0
    warm_gpus = 0
    while True:
        warming = warm_gpus < warm_fill * total_gpus
        at += 1.0 if warming else rng.expovariate(rate)
        n += 1
        team = rng.choices([t for t, _ in TEAMS], weights=[s for _, s in TEAMS])[0]
        gpus = rng.choice(_SIZES)
        priority = rng.choice(_PRIORITIES)
        duration = round(rng.uniform(0.25, 1.75) * _MEAN_DURATION_S)
        request: dict[str, Any] = {
            "team": team,
            "name": f"{team}-{'sweep' if priority == 'low' else 'train'}-{n}",
            "priority": priority,
            "preemptible": priority != "high",
            "checkpoint_interval_s": 60.0,
            "sim_duration_s": float(duration),
        }
        if gpus > 8:
            request.update(gpus_per_replica=8, replicas=gpus // 8)
        else:
            request["gpus"] = gpus
        if warming:
            warm_gpus += gpus
        yield Arrival(at, request)
