"""History from the warehouse: efficiency, idle share, queue depth and cost by team over time.

The gateway's own series is short (in memory, since it started); the warehouse holds everything.
The gateway asks the recorder (`chamber.cmd.recorder.sql`, read-only SQL), because with chDB only the
recorder may open the warehouse. Queries go over the efficiency views (schemas/clickhouse/0002_*.sql):
`gpu_minutes` for capacity, allocation and busy time per GPU-minute, `job_waits` for the queue, and
the `cost_ledger` table for what billing accrued. When the recorder does not answer, the caller falls
back to the live series (`source` says which one a caller got).

The SQL builders and row shapers are pure; `WarehouseHistory` only sends the queries and caches the
answers for a few seconds, so many open dashboards cost the recorder one query per window.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.gateway.views import PointView
from services.runtime.commands import CommandRefused, CommandUnavailable
from services.runtime.logs import get_logger
from services.warehouse.efficiency import sql_time, window_args

MAX_POINTS = 720  # a day at two-minute steps; longer windows get coarser steps
log = get_logger("chamber.gateway.history")

Forward = Callable[[str, str, dict[str, Any]], Awaitable[Any]]


class CostPoint(msgspec.Struct, kw_only=True):
    """Cost a team accrued from the window's start up to `at` (team "idle": unused capacity)."""

    at: float
    team: str
    cost: float


class TeamWindowCost(msgspec.Struct, kw_only=True):
    team: str
    cost: float
    gpu_hours: float


class HistoryView(msgspec.Struct, kw_only=True):
    source: str  # "warehouse", or "live" when the recorder did not answer
    since: float
    until: float
    step_s: int
    points: list[PointView]
    cost: list[CostPoint] = []  # cumulative per team, one point per billing period end
    cost_by_team: list[TeamWindowCost] = []  # totals over the window


def window(since: float, until: float) -> tuple[float, float, int]:
    """Whole steps from `since` to the last whole minute before `until` (a minute still filling would
    draw as a dip: its samples are not all in yet)."""
    until = math.floor(until / 60) * 60
    since = max(math.floor(since / 60) * 60, until - 366 * 86400)
    span = max(until - since, 60)
    step = max(60, math.ceil(span / MAX_POINTS / 60) * 60)
    return since, until, step


def efficiency_sql(since: float, until: float, step: int) -> str:
    return (
        f"SELECT intDiv(toUInt32(minute), {step}) * {step} AS at, count(DISTINCT minute) AS minutes, "
        "sum(capacity_s) AS capacity_s, sum(allocated_s) AS allocated_s, sum(busy_s) AS busy_s "
        f"FROM gpu_minutes({window_args(since, until)}) GROUP BY at ORDER BY at"
    )


def queue_sql(since: float, until: float, step: int) -> str:
    """Jobs waiting at the start of each step."""
    until_t = f"toDateTime64('{sql_time(until)}', 3, 'UTC')"
    s, u = f"toFloat64(toDateTime64('{sql_time(since)}', 3, 'UTC'))", f"toFloat64({until_t})"
    end = f"toFloat64(coalesce(waited_until, {until_t}))"
    return (
        "SELECT at, count() AS depth FROM ("
        f"SELECT arrayJoin(range(toUInt32(ceil(greatest(toFloat64(waited_from), {s}) / {step}) * {step}), "
        f"toUInt32(ceil(least({end}, {u}))), {step})) AS at "
        f"FROM job_waits WHERE toFloat64(waited_from) < {u} AND {end} > {s}"
        ") GROUP BY at ORDER BY at"
    )


def cost_sql(since: float, until: float, step: int) -> str:
    """Cost per team per step, by the end of the billing period it was accrued for."""
    return (
        f"SELECT intDiv(toUInt32(toDateTime(period_end)), {step}) * {step} AS at, "
        "if(idle = 1, 'idle', team) AS who, sum(cost) AS cost, sum(gpu_seconds) AS gpu_seconds "
        f"FROM cost_ledger FINAL WHERE period_end > toDateTime64('{sql_time(since)}', 3, 'UTC') "
        f"AND period_end <= toDateTime64('{sql_time(until)}', 3, 'UTC') GROUP BY at, who ORDER BY at, who"
    )


Rows = list[dict[str, Any]]


def points(efficiency_rows: Rows, queue_rows: Rows, cost: list[CostPoint]) -> list[PointView]:
    """One point per step: GPUs as averages over the step (GPU-seconds / seconds), ratios of sums."""
    depth = {int(r["at"]): int(r["depth"]) for r in queue_rows}
    out: list[PointView] = []
    for row in efficiency_rows:
        at = int(row["at"])
        seconds = 60.0 * max(int(row["minutes"]), 1)
        capacity_s, allocated_s, busy_s = (float(row[k] or 0.0) for k in ("capacity_s", "allocated_s", "busy_s"))
        idle_s = max(capacity_s - allocated_s, 0.0)
        cost_total = sum(_last_before(cost, team, at + 60) for team in {c.team for c in cost})
        out.append(
            PointView(
                at=float(at),
                capacity=round(capacity_s / seconds),
                allocated=round(allocated_s / seconds),
                busy=round(busy_s / seconds, 4),
                idle=round(idle_s / seconds),
                queue_depth=depth.get(at, 0),
                efficiency_score=round(busy_s / capacity_s, 4) if capacity_s else 0.0,
                idle_ratio=round(idle_s / capacity_s, 4) if capacity_s else 0.0,
                cost_total=round(cost_total, 4),
            )
        )
    return out


def _last_before(cost: list[CostPoint], team: str, at: float) -> float:
    value = 0.0
    for point in cost:
        if point.team == team and point.at <= at:
            value = point.cost
    return value


def cost_series(rows: list[dict[str, Any]]) -> tuple[list[CostPoint], list[TeamWindowCost]]:
    """Cumulative cost per team from the window's start, and each team's total over the window."""
    running: dict[str, float] = {}
    hours: dict[str, float] = {}
    series: list[CostPoint] = []
    for row in rows:
        who = str(row["who"])
        running[who] = running.get(who, 0.0) + float(row["cost"] or 0.0)
        hours[who] = hours.get(who, 0.0) + float(row["gpu_seconds"] or 0.0) / 3600.0
        series.append(CostPoint(at=float(row["at"]), team=who, cost=round(running[who], 4)))
    totals = [TeamWindowCost(team=t, cost=round(c, 4), gpu_hours=round(hours[t], 4)) for t, c in running.items()]
    totals.sort(key=lambda t: (-t.cost, t.team))
    return series, totals


@dataclass
class WarehouseHistory:
    """Asks the recorder; None from `get` means it did not answer (the caller shows the live series)."""

    forward: Forward
    cache_s: float = 15.0
    clock: Callable[[], float] = time.time
    _cache: dict[tuple[float, float], tuple[float, HistoryView]] = field(default_factory=dict)

    async def _rows(self, sql: str) -> list[dict[str, Any]]:
        answer = await self.forward("recorder", "sql", {"sql": sql, "max_rows": MAX_POINTS * 64})
        columns = answer["columns"]
        return [r if isinstance(r, dict) else dict(zip(columns, r, strict=True)) for r in answer["rows"]]

    async def get(self, since: float, until: float) -> HistoryView | None:
        since, until, step = window(since, until)
        now = self.clock()
        cached = self._cache.get((since, until))
        if cached is not None and now - cached[0] < self.cache_s:
            return cached[1]
        try:
            efficiency_rows = await self._rows(efficiency_sql(since, until, step))
            queue_rows = await self._rows(queue_sql(since, until, step))
            cost, totals = cost_series(await self._rows(cost_sql(since, until, step)))
        except (CommandUnavailable, CommandRefused) as exc:
            # refused: a warehouse without the efficiency views yet; either way the live series serves
            log.info("warehouse history unavailable, serving the live series", error=str(exc))
            return None
        view = HistoryView(
            source="warehouse",
            since=since,
            until=until,
            step_s=step,
            points=points(efficiency_rows, queue_rows, cost),
            cost=cost,
            cost_by_team=totals,
        )
        self._cache = {k: v for k, v in self._cache.items() if now - v[0] < self.cache_s}
        self._cache[(since, until)] = (now, view)
        return view
