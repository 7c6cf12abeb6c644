"""Budgets act: a team over its budget gets the action its quota names (demote, hold, notify) until
the month ends or the budget is raised, and `chamber explain` says so."""

from __future__ import annotations

from datetime import UTC, datetime

from events import BudgetAction, BudgetExceeded, BudgetSet, PriorityClass
from services.scheduler.core import explain
from tests.scheduler_builders import Driver, a_job, a_node

NOV = datetime(2026, 11, 10, tzinfo=UTC).timestamp()
DEC = datetime(2026, 12, 1, 0, 0, 1, tzinfo=UTC).timestamp()


def over_budget(action: BudgetAction) -> Driver:
    return Driver().given(
        a_node("n1"),
        BudgetSet(team="vision", at=NOV - 100, amount=1000.0, on_budget=action),
        BudgetExceeded(team="vision", at=NOV, budget=1000.0, spent=1250.5),
    )


def test_hold_keeps_new_work_waiting_until_the_month_ends() -> None:
    d = over_budget(BudgetAction.HOLD).given(
        a_job("j1", gpus=4, at=NOV + 1), a_job("other", team="nlp", gpus=2, at=NOV + 1)
    )
    d.cycle(now=NOV + 2)
    assert d.state_of("j1") == "pending" and d.state_of("other") == "running"
    assert d.waiting["j1"].startswith("team vision is over its budget (1250.50 of 1000.00 USD spent in 2026-11")
    assert "new work waits until the budget is raised or the month ends" in d.waiting["j1"]
    text = explain(d.state, "j1", d.waiting, now=NOV + 3)["text"]  # type: ignore[index]
    assert "--on-budget hold" in text
    d.mark = None  # the service runs a full cycle at least every --full-every seconds (30)
    d.cycle(now=DEC)  # a new month: the budget starts again
    assert d.state_of("j1") == "running"


def test_raising_the_budget_above_what_was_spent_lifts_the_hold() -> None:
    d = over_budget(BudgetAction.HOLD).given(a_job("j1", gpus=4, at=NOV + 1))
    d.cycle(now=NOV + 2)
    d.given(BudgetSet(team="vision", at=NOV + 3, amount=1200.0, on_budget=BudgetAction.HOLD))  # still below 1250.5
    d.cycle(now=NOV + 4)
    assert d.state_of("j1") == "pending"
    d.given(BudgetSet(team="vision", at=NOV + 5, amount=2000.0, on_budget=BudgetAction.HOLD))
    d.cycle(now=NOV + 6)
    assert d.state_of("j1") == "running"


def test_a_raised_budget_and_an_older_excess_hold_alike_in_either_fold_order() -> None:
    excess = BudgetExceeded(team="vision", at=NOV, budget=1000.0, spent=1250.5)
    raised = BudgetSet(team="vision", at=NOV + 3, amount=2000.0, on_budget=BudgetAction.HOLD)
    first = BudgetSet(team="vision", at=NOV - 100, amount=1000.0, on_budget=BudgetAction.HOLD)
    for order in ((first, excess, raised), (first, raised, excess)):  # QUOTA and BILLING read side by side
        d = Driver().given(a_node("n1"), *order, a_job("j1", gpus=4, at=NOV + 4))
        d.cycle(now=NOV + 5)
        assert d.state_of("j1") == "running", order


def test_demote_runs_new_work_preemptible_at_low_priority_and_leaves_earlier_work_alone() -> None:
    d = Driver().given(
        a_node("n1"),
        BudgetSet(team="vision", at=NOV - 100, amount=1000.0, on_budget=BudgetAction.DEMOTE),
        a_job("before", gpus=2, priority="high", preemptible=False, at=NOV - 50),
        BudgetExceeded(team="vision", at=NOV, budget=1000.0, spent=1250.5),
        a_job("after", gpus=2, priority="high", preemptible=False, at=NOV + 1),
    )
    before, after = d.state.jobs["before"].spec, d.state.jobs["after"].spec
    assert (before.priority, before.preemptible) == (PriorityClass.HIGH, False)
    assert (after.priority, after.preemptible) == (PriorityClass.LOW, True)
    d.cycle(now=NOV + 2)
    assert d.state_of("after") == "running"  # demoted, not held
    text = explain(d.state, "after", d.waiting, now=NOV + 3)["text"]  # type: ignore[index]
    assert "runs preemptible at low priority (asked high)" in text and "--on-budget demote" in text
    # the next month's work is not demoted
    d.given(a_job("december", gpus=2, priority="high", at=DEC))
    assert d.state.jobs["december"].spec.priority == PriorityClass.HIGH


def test_notify_changes_nothing_but_explain_says_so() -> None:
    d = over_budget(BudgetAction.NOTIFY).given(a_job("j1", gpus=4, priority="high", at=NOV + 1))
    d.cycle(now=NOV + 2)
    assert d.state_of("j1") == "running" and d.state.jobs["j1"].spec.priority == PriorityClass.HIGH
    text = explain(d.state, "j1", d.waiting, now=NOV + 3)["text"]  # type: ignore[index]
    assert "Note: team vision is over its budget" in text and "--on-budget notify" in text


def test_demotion_depends_on_the_times_not_on_which_stream_was_folded_first() -> None:
    # BILLING and JOBS are read side by side: the job may be folded before the BudgetExceeded that preceded it
    events = [
        a_node("n1"),
        BudgetSet(team="vision", at=NOV - 100, amount=1000.0, on_budget=BudgetAction.DEMOTE),
        BudgetExceeded(team="vision", at=NOV, budget=1000.0, spent=1250.5),
        a_job("after", gpus=2, priority="high", at=NOV + 1),
        a_job("before", gpus=2, priority="high", at=NOV - 1),
    ]
    for order in (events, [events[0], events[1], events[3], events[4], events[2]]):
        d = Driver().given(*order)
        assert d.state.jobs["after"].spec.priority == PriorityClass.LOW
        assert d.state.jobs["before"].spec.priority == PriorityClass.HIGH
        assert [k[3] for k in d.state.queue()] == ["before", "after"]
