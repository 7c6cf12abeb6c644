"""Billing and quota in shares of a GPU: fractions and MIG instances are charged their share, and for
every physical GPU the shares held plus idle equal its seconds (a simulated day of whole, fractional
and MIG tenants, seeded)."""

from __future__ import annotations

import random

import pytest

from events import CostAccrued, Event, JobScheduled, NodeDiscovered, Placement, PoolDefined, PriceSet
from services.billing.core import BillingState, decide, evolve, gpu_ledger
from services.quota.core import QuotaState
from services.quota.core import evolve as quota_evolve
from services.scheduler.core.mig import MIG_MODELS, free_starts
from tests.warehouse_builders import an_inventory, completed, submitted

T = 1_767_225_600.0  # 2026-01-01 00:00 UTC
DAY = 86_400.0
PRICE = 3.0
H100 = MIG_MODELS["H100-80GB"]


def shared(
    job: str, team: str, node: str, gpu: int, at: float, share: int, mig: tuple[str, int] | None = None
) -> JobScheduled:
    place = Placement(
        cluster="c1",
        node=node,
        gpu_indices=[gpu],
        share_milli=share,
        mig_profile=mig[0] if mig else None,
        mig_start=mig[1] if mig else None,
    )
    return JobScheduled(job_id=job, at=at, team=team, placements=[place], pool="default")


def setup(nodes: dict[str, int]) -> list[Event]:
    out: list[Event] = [
        PriceSet(gpu_model="H100-80GB", at=T - 10, price_per_gpu_hour=PRICE),
        PoolDefined(pool="default", at=T - 10, gpu_model="H100-80GB"),
    ]
    for node, gpus in nodes.items():
        inv = an_inventory(node, gpus=gpus, model="H100-80GB", at=T)
        out.append(NodeDiscovered(cluster="c1", node=node, at=T, gpus=inv.gpus))
    return out


def fold(events: list[Event], period_s: float = 3600) -> BillingState:
    state = BillingState(period_s=period_s, settle_s=30)
    for i, e in enumerate(sorted(events, key=lambda e: getattr(e, "at", T))):
        evolve(state, e, f"in-{i}")
    return state


def test_four_pods_at_a_quarter_for_an_hour_are_one_gpu_hour() -> None:
    events = setup({"n1": 1})
    for k in range(4):
        events += [
            submitted(f"q{k}", "nlp", 1, T),
            shared(f"q{k}", "nlp", "n1", 0, T, 250),
            completed(f"q{k}", T + 3600),
        ]
    costs = [e for e, _ in decide(fold(events), now=T + 3600 + 30) if isinstance(e, CostAccrued)]
    held = [e for e in costs if not e.idle]
    assert sum(e.gpu_seconds for e in held) == 3600.0
    assert sum(e.cost for e in held) == pytest.approx(PRICE)
    assert not [e for e in costs if e.idle and e.gpu_seconds > 0]


def test_a_fully_sliced_mig_gpu_still_shows_its_idle_remainder() -> None:
    events = setup({"m1": 1})
    for k, start in enumerate(range(7)):
        events += [
            submitted(f"s{k}", "web", 1, T),
            shared(f"s{k}", "web", "m1", 0, T, H100.share_milli("1g.10gb"), ("1g.10gb", start)),
        ]
    ledger = gpu_ledger(fold(events), T, T + 3600)[("c1", "m1", 0)]
    assert ledger.idle == pytest.approx(3600 * (1000 - 7 * 134) / 1000)
    assert ledger.idle_cost == pytest.approx(ledger.idle / 3600 * PRICE)


def simulated_day(seed: int = 7) -> list[Event]:
    """Two 8-GPU H100 nodes: p1's GPUs 0-3 for whole-GPU jobs, 4-7 for fractions (time-sliced shares
    of 250 or 500 milli-GPU); m1 in MIG mode with mixed profiles at legal free placements. A job
    arrives every 5 minutes and runs 20 minutes to 3 hours; some still run at the day's end."""
    rng = random.Random(seed)
    events = setup({"p1": 8, "m1": 8})
    busy_until: dict[tuple[str, int], list[tuple[float, int, tuple[str, int] | None]]] = {}
    t, k = T, 0
    while t < T + DAY:
        k += 1
        job, kind = f"j{k}", rng.choice(["whole", "fraction", "mig"])
        end = t + rng.uniform(1200, 3 * 3600)
        team = {"whole": "train", "fraction": "nlp", "mig": "web"}[kind]
        held = busy_until.setdefault
        if kind == "whole":
            free = [g for g in range(4) if all(e <= t for e, _, _ in held(("p1", g), []))]
            spot = (("p1", free[0]), 1000, None) if free else None
        elif kind == "fraction":
            share = rng.choice([250, 500])
            free = [g for g in range(4, 8) if sum(s for e, s, _ in held(("p1", g), []) if e > t) + share <= 1000]
            spot = (("p1", free[0]), share, None) if free else None
        else:
            profile = rng.choice(["1g.10gb", "2g.20gb", "3g.40gb", "1g.20gb"])
            spot = None
            for g in range(8):
                layout = [m for e, _, m in held(("m1", g), []) if e > t and m]
                starts = free_starts(H100, layout, profile)
                if starts:
                    spot = (("m1", g), H100.share_milli(profile), (profile, starts[0]))
                    break
        if spot is not None:
            (node, gpu), share, mig = spot
            busy_until[(node, gpu)].append((end, share, mig))
            events += [submitted(job, team, 1, t), shared(job, team, node, gpu, t, share, mig)]
            if end < T + DAY:
                events.append(completed(job, end))
        t += 300
    return events


def test_a_simulated_day_conserves_every_gpu_second() -> None:
    state = fold(simulated_day())
    for gpu, row in gpu_ledger(state, T, T + DAY).items():
        assert row.in_service == DAY
        assert sum(row.held.values()) + row.idle == pytest.approx(DAY, rel=1e-3), gpu
    costs = [e for e, _ in decide(state, now=T + DAY + 30) if isinstance(e, CostAccrued)]
    assert {e.team for e in costs if not e.idle} == {"train", "nlp", "web"}
    gpu_seconds = sum(e.gpu_seconds for e in costs)
    assert gpu_seconds == pytest.approx(16 * DAY, rel=1e-3)
    assert sum(e.cost for e in costs) == pytest.approx(16 * 24 * PRICE, rel=1e-3)
    mig_idle = sum(row.idle for gpu, row in gpu_ledger(state, T, T + DAY).items() if gpu[1] == "m1")
    assert mig_idle > 0, "MIG GPUs' unallocated slices stay visible as idle"


def test_quotas_count_shares_not_whole_gpus() -> None:
    state = QuotaState()
    for e in [
        submitted("a", "web", 1, T),
        shared("a", "web", "m1", 0, T, H100.share_milli("1g.10gb"), ("1g.10gb", 0)),
        submitted("b", "nlp", 1, T),
        shared("b", "nlp", "p1", 4, T, 250),
        submitted("c", "train", 2, T),
        JobScheduled(
            job_id="c",
            at=T,
            team="train",
            placements=[Placement(cluster="c1", node="p1", gpu_indices=[0, 1])],
            pool="default",
        ),
    ]:
        quota_evolve(state, e)
    assert state.in_use() == {("default", "web"): 0.134, ("default", "nlp"): 0.25, ("default", "train"): 2}
