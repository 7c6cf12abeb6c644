"""Budgets that act: once billing says a team spent past its budget this month (BudgetExceeded), the
action its quota names applies to the team's new work until the month ends or the budget is raised.

- demote: work submitted while over budget runs preemptible at low priority (decided when the job is
  folded in, from the event's own time, so a replay decides the same);
- hold: the team's waiting work is not started (running work goes on);
- notify: nothing changes but the BudgetExceeded event, the dashboard flag and `chamber explain`.

Pure: months are UTC calendar months of event times and of the cycle's `now`, both passed in. A
month's end lifts a hold at the next full cycle (the service runs one every `--full-every` seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec

from events import BudgetAction, BudgetExceeded, BudgetSet, JobSpec, PriorityClass
from services.timefmt import distinct

if TYPE_CHECKING:
    from services.scheduler.core.state import Job, SchedulerState


@dataclass
class BudgetRule:
    amount: float
    action: BudgetAction
    currency: str = "USD"
    exceeded_month: str | None = None  # the month billing reported it exceeded
    exceeded_at: float = 0.0  # when (work submitted before then is not the budget's business)
    spent: float = 0.0


def month_of(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m")


def fold_budget_set(s: SchedulerState, e: BudgetSet) -> None:
    previous = s.budgets.get(e.team)
    rule = BudgetRule(e.amount, e.on_budget, e.currency)
    if previous is not None and previous.exceeded_month is not None and previous.spent > e.amount:
        # still over the new amount: the action goes on (billing reports a month's excess only once)
        rule.exceeded_month, rule.exceeded_at, rule.spent = (
            previous.exceeded_month,
            previous.exceeded_at,
            previous.spent,
        )
    s.budgets[e.team] = rule
    s.capacity_epoch += 1  # a hold may lift: the next cycle looks at every waiting job


def fold_budget_exceeded(s: SchedulerState, e: BudgetExceeded) -> None:
    from services.scheduler.core.state import QUEUED  # state imports this module

    rule = s.budgets.setdefault(e.team, BudgetRule(e.budget, BudgetAction.NOTIFY, e.currency))
    if rule.amount > e.spent:
        # a budget raised past what was spent, folded first (QUOTA and BILLING are read side by side):
        # this excess was of the old amount, which no longer holds, as if the events came in time order
        return
    rule.exceeded_month, rule.exceeded_at, rule.spent = month_of(e.at), e.at, e.spent
    # Work submitted after the budget ran out but folded before this event (BILLING and JOBS are read
    # side by side) is demoted too, so the outcome depends on the events' times, not on fold order.
    for job in s.jobs.values():
        if job.spec.team == e.team and job.state in QUEUED and job.submitted_at >= e.at and not job.note:
            job.spec, job.note = demoted(s, job.spec, job.submitted_at)
            s.reorder()  # the queue order follows the priority
    s.capacity_epoch += 1


def over_budget(s: SchedulerState, team: str, at: float) -> BudgetRule | None:
    rule = s.budgets.get(team)
    if rule is None or rule.exceeded_month != month_of(at) or at < rule.exceeded_at:
        return None
    return rule


def _what(team: str, rule: BudgetRule) -> str:
    spent, amount = distinct(rule.spent, rule.amount, digits=2)  # never "100.00 of 100.00"
    return (
        f"team {team} is over its budget ({spent} of {amount} {rule.currency} spent in "
        f"{rule.exceeded_month}; --on-budget {rule.action.value})"
    )


def demoted(s: SchedulerState, spec: JobSpec, at: float) -> tuple[JobSpec, str]:
    """The spec a job submitted at `at` runs with, and a note when the budget changed it."""
    rule = over_budget(s, spec.team, at)
    if rule is None or rule.action != BudgetAction.DEMOTE:
        return spec, ""
    if spec.priority == PriorityClass.LOW and spec.preemptible:
        return spec, ""
    note = f"{_what(spec.team, rule)}: runs preemptible at low priority (asked {spec.priority.value})"
    return msgspec.structs.replace(spec, priority=PriorityClass.LOW, preemptible=True), note


def held(s: SchedulerState, job: Job, now: float) -> str | None:
    """Why this waiting job may not start now, if its team's budget holds it."""
    rule = over_budget(s, job.spec.team, now)
    if rule is None or rule.action != BudgetAction.HOLD:
        return None
    return f"{_what(job.spec.team, rule)}: new work waits until the budget is raised or the month ends"


def note(s: SchedulerState, team: str, now: float) -> str | None:
    """For `chamber explain`: the budget state of the job's team this month, if over."""
    rule = over_budget(s, team, now)
    return None if rule is None else _what(team, rule)
