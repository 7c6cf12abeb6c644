"""Billing's core on a scripted job timeline, against costs computed by hand.

Hourly periods from T (an hour boundary), H100 at $3.00 per GPU-hour, one node of 4 H100 in pool train.
  j1 vision: 2 GPUs from T+600 to T+4200  -> hour 1: 2 x 3000 s = $5.00; hour 2: 2 x 600 s = $1.00
  j2 nlp:    1 GPU  T+1800..T+2400, preempted, resumed on GPU 3 T+3000..T+3600 -> hour 1: 1200 s = $1.00
  idle (pool train): hour 1: 14400 - 7200 s = $6.00; hour 2: 14400 - 1200 s = $11.00
  vision's budget is $5.50: exceeded in hour 2 (spent $6.00), reported once.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import BudgetExceeded, BudgetSet, CostAccrued, Event, NodeDiscovered, PoolDefined, PriceSet
from services.billing.core import BillingState, decide, evolve
from tests.warehouse_builders import an_inventory, completed, preempted, resumed, scheduled, submitted

T = 1_767_225_600.0  # 2026-01-01 00:00 UTC


def timeline() -> list[Event]:
    inv = an_inventory("n1", gpus=4, model="H100-80GB", at=T)
    return [
        PriceSet(gpu_model="H100-80GB", at=T - 10, price_per_gpu_hour=3.0),
        PoolDefined(pool="train", at=T - 10, gpu_model="H100-80GB"),
        BudgetSet(team="vision", at=T - 10, amount=5.5),
        NodeDiscovered(cluster="c1", node="n1", at=T, gpus=inv.gpus),
        submitted("j1", "vision", 2, T + 600),
        scheduled("j1", "vision", "n1", [0, 1], T + 600),
        submitted("j2", "nlp", 1, T + 1800),
        scheduled("j2", "nlp", "n1", [2], T + 1800),
        preempted("j2", "nlp", T + 2400),
        resumed("j2", "n1", [3], T + 3000),
        completed("j2", T + 3600),
        completed("j1", T + 4200),
    ]


def fold(events: list[Event]) -> BillingState:
    state = BillingState(period_s=3600, settle_s=30)
    for i, e in enumerate(events):
        evolve(state, e, f"in-{i}")
    return state


def costs(decisions: list[tuple[Event, str]]) -> dict[tuple[float, str], float]:
    return {
        (e.period_start - T, e.job_id or f"idle:{e.pool}"): e.cost for e, _ in decisions if isinstance(e, CostAccrued)
    }


def test_costs_per_job_and_idle_per_pool_equal_the_hand_computed_values() -> None:
    decisions = decide(fold(timeline()), now=T + 7200 + 30)
    assert costs(decisions) == pytest.approx(
        {(0, "j1"): 5.0, (0, "j2"): 1.0, (0, "idle:train"): 6.0, (3600, "j1"): 1.0, (3600, "idle:train"): 11.0}
    )
    j1 = next(e for e, _ in decisions if isinstance(e, CostAccrued) and e.job_id == "j1")
    assert (j1.team, j1.gpu_seconds, j1.gpu_model) == ("vision", 6000, "H100-80GB")
    exceeded = [e for e, _ in decisions if isinstance(e, BudgetExceeded)]
    assert [(e.team, e.budget, e.spent) for e in exceeded] == [("vision", 5.5, 6.0)]


def test_a_period_is_accrued_only_after_it_settled() -> None:
    state = fold(timeline())
    assert decide(state, now=T + 3600 + 29) == []
    assert {k for k in costs(decide(state, now=T + 3600 + 30))} == {(0, "j1"), (0, "j2"), (0, "idle:train")}


def test_decisions_folded_back_are_not_decided_again_and_a_replay_gives_the_same_ids() -> None:
    state = fold(timeline())
    first = decide(state, now=T + 7200 + 30)
    for event, event_id in first:
        evolve(state, event, event_id)
    assert decide(state, now=T + 7200 + 30) == []
    # The same decision read back from the BILLING stream changes nothing.
    evolve(state, first[0][0], first[0][1])
    assert state.spent[("vision", "2026-01")] == pytest.approx(6.0)

    replayed = fold(timeline())
    assert [i for _, i in decide(replayed, now=T + 7200 + 30)] == [i for _, i in first]


def test_a_restarted_billing_that_replays_its_own_costs_emits_nothing_new() -> None:
    state = fold(timeline())
    first = decide(state, now=T + 7200 + 30)
    restarted = fold(timeline() + [e for e, _ in first])
    assert decide(restarted, now=T + 7200 + 30) == []


@st.composite
def gpu_timelines(draw: st.DrawFn) -> list[Event]:
    """One node of 4 H100 in service from T; each GPU runs back-to-back jobs (start/stop on whole seconds)."""
    inv = an_inventory("n1", gpus=4, model="H100-80GB", at=T)
    events: list[tuple[float, int, Event]] = [(T, 0, NodeDiscovered(cluster="c1", node="n1", at=T, gpus=inv.gpus))]
    for gpu in range(4):
        cuts = sorted(draw(st.sets(st.integers(1, 3 * 3600 - 1), max_size=8)))
        for k, (start, stop) in enumerate(zip(cuts[::2], cuts[1::2], strict=False)):
            job = f"g{gpu}-{k}"
            team = draw(st.sampled_from(["vision", "nlp"]))
            events.append((T + start, 1, scheduled(job, team, "n1", [gpu], T + start)))
            events.append((T + stop, 2, completed(job, T + stop)))
    events.sort(key=lambda e: (e[0], e[1]))
    return [PriceSet(gpu_model="H100-80GB", at=T - 1, price_per_gpu_hour=3.0)] + [e for _, _, e in events]


@given(gpu_timelines())
@settings(max_examples=60, deadline=None)
def test_every_gpu_second_is_billed_once_to_a_job_or_as_idle(events: list[Event]) -> None:
    decisions = decide(fold(events), now=T + 3 * 3600 + 30)
    accrued = [e for e, _ in decisions if isinstance(e, CostAccrued)]
    for hour in range(3):
        in_period = [e for e in accrued if e.period_start == T + hour * 3600]
        assert sum(e.gpu_seconds for e in in_period) == pytest.approx(4 * 3600)
        assert sum(e.cost for e in in_period) == pytest.approx(4 * 3.0, abs=1e-4)
    assert len({i for _, i in decisions}) == len(decisions)  # ids are unique


def test_billing_uses_the_schedulers_case_insensitive_pool_rule() -> None:
    from events import PoolDefined
    from services.billing.core import BillingState, evolve, pool_of
    from tests.scheduler_builders import a_node

    state = BillingState()
    evolve(state, PoolDefined(pool="h100", at=0.0, gpu_model="h100-80gb"))
    evolve(state, a_node("n1", gpus=1, model="H100-80GB"))
    assert pool_of(state, ("c1", "n1", 0)) == "h100"


def run_for(hours: int, jobs_per_hour: int = 60) -> BillingState:
    """A node busy with short jobs for `hours`, accrued as the service does (decide, then fold back)."""
    state = BillingState(period_s=3600, settle_s=30)
    inv = an_inventory("n1", gpus=4, model="H100-80GB", at=T)
    for i, e in enumerate(timeline()[:4]):
        evolve(state, e, f"setup-{i}")
    evolve(state, NodeDiscovered(cluster="c1", node="n1", at=T, gpus=inv.gpus), "node")
    for n in range(hours * jobs_per_hour):
        at = T + n * 3600 / jobs_per_hour
        for event, event_id in decide(state, at):
            evolve(state, event, event_id)
        job = f"j{n}"
        for i, e in enumerate(
            (submitted(job, "vision", 1, at), scheduled(job, "vision", "n1", [0], at), completed(job, at + 30))
        ):
            evolve(state, e, f"{job}-{i}")
    return state


def test_the_state_holds_what_is_not_accrued_yet_not_the_history() -> None:
    """Bounded memory: ten times the history, the same state size."""
    short, long = run_for(5), run_for(50)
    for field in ("held", "job_team", "seen", "finished"):
        assert len(getattr(long, field)) <= len(getattr(short, field)) + 1, field
    assert len(long.job_team) < 200 and not long.open_held  # one hour and a bit, not 3,000 jobs


def test_a_cost_line_of_a_period_already_accrued_is_not_counted_twice() -> None:
    state = run_for(3)
    spent = dict(state.spent)
    old = CostAccrued(
        period_start=T,
        period_end=T + 3600,
        gpu_model="H100-80GB",
        gpu_seconds=30.0,
        cost=0.025,
        team="vision",
        job_id="j0",
    )
    evolve(state, old, "replayed-under-another-id")
    assert dict(state.spent) == spent
