"""`sorted_queue` (numpy, for long queues) orders exactly as the policy's key does, ties included:
protected, aged-out, young, clamped and critical jobs, equal factors and submit times."""

from __future__ import annotations

import dataclasses
import random

import pytest

from services.scheduler.core.policy import CHAMBER, ORDERINGS, POLICIES, Policy, QueueKey, sorted_queue

POLICY_CASES = [
    CHAMBER,
    dataclasses.replace(CHAMBER, starvation_bound_s=None),
    dataclasses.replace(CHAMBER, age_weight=0.0),
    dataclasses.replace(CHAMBER, starvation_bound_s=100.0, age_cap_s=50.0),
    dataclasses.replace(CHAMBER, starvation_bound_s=100.0, guard_lift_every_s=30.0),  # protected jobs lifted
    dataclasses.replace(CHAMBER, guard_lifts_classes=3, guard_lift_every_s=None),
    POLICIES["fifo"],
]


@pytest.mark.parametrize("policy", POLICY_CASES, ids=lambda p: f"{p.name}-{p.starvation_bound_s}-{p.age_weight}")
def test_sorted_queue_is_the_policy_order(policy: Policy) -> None:
    rng = random.Random(7)
    for _ in range(60):
        now = rng.choice([0.0, 100.0, 1e5, 12345.678])
        keys: list[QueueKey] = []
        since: dict[str, float] = {}
        for i in range(rng.randrange(1, 300)):
            jid = f"j{rng.randrange(50)}-{i}"
            share = -rng.choice([1.0, 0.5, 0.25, 0.3333, 1e-3])
            keys.append((rng.randrange(4), share, rng.choice([0.0, 1.0, 50.0, rng.random() * 1e5]), jid))
            since[jid] = rng.choice([0.0, now, now - 5400.0, now - 86400.0, now - 100.0, rng.random() * now, now + 10])
        expected = sorted(keys, key=ORDERINGS[policy.order](policy, since.__getitem__, now))
        assert sorted_queue(policy, keys, [since[k[3]] for k in keys], now) == expected
