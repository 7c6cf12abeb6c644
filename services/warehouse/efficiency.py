"""Fleet efficiency over a window, from the warehouse views `gpu_minutes` and `team_minutes`.

capacity  = healthy GPU-seconds (reported by the GPU, not isolated)
allocated = GPU-seconds held by jobs;  busy = utilization x time on allocated GPUs
allocation_ratio = allocated / capacity;  usage_ratio = busy / allocated;  efficiency = busy / capacity
stranded  = healthy, unallocated GPU-hours while a job that would fit (no more GPUs of that model than
            were free) was waiting
idle_cost = (capacity - busy) x the GPU's price per GPU-hour, priced as billing prices: its node's
            instance type, else its cluster, else its model (view `gpu_prices`, current prices);
            per team: (allocated - busy) x that price, the money of GPUs the team held and left idle
idle_gpus_now = GPUs that reported in the window's last minute, healthy, held by no job
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

GROUPS = {"pool": "m.pool", "model": "m.model", "node": "m.node", "team": "team", "cluster": "m.cluster"}
# Where a node runs: discovery's chamber.io/ labels in its latest NodeDiscovered/NodeUpdated (view `node_places`).
PLACES = {"provider": "provider", "region": "region", "zone": "zone", "instance_type": "instance_type"}
BY = ("team", "pool", "model", "node", "cluster", *PLACES)
_PRICE = " LEFT JOIN gpu_prices AS pr ON pr.cluster = m.cluster AND pr.node = m.node AND pr.gpu_index = m.gpu_index"
METRICS = (
    "capacity_gpu_hours",
    "allocated_gpu_hours",
    "busy_gpu_hours",
    "allocation_ratio",
    "usage_ratio",
    "efficiency_score",
    "stranded_gpu_hours",
    "idle_cost",
    "idle_gpus_now",
)
_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float) -> float:
    """`24h`, `7d`, `90m`, `30s`, `2w` before `now`, or an ISO 8601 time (UTC when no zone)."""
    match = _DURATION.match(text.strip())
    if match:
        ts = now - float(match["n"]) * _UNITS[match["unit"]]
        if ts < 0:
            raise ValueError(f"{text!r} reaches back before 1970; give a shorter window or an ISO time")
        return ts
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither a duration like 24h / 7d / 90m nor an ISO time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    if when.year < 1970:
        raise ValueError(f"{text!r} is before 1970")
    return when.timestamp()


def sql_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def window_args(since: float, until: float) -> str:
    return f"since = '{sql_time(since)}', until = '{sql_time(until)}'"


def efficiency_sql(since: float, until: float, by: str | None = None) -> str:
    """One query; with `by`, one row per group, else one row for the fleet."""
    args = window_args(since, until)
    if by == "team":
        return (
            "SELECT m.team AS key, NULL AS capacity_gpu_hours, sum(m.allocated_s) / 3600 AS allocated_gpu_hours, "
            "sum(m.busy_s) / 3600 AS busy_gpu_hours, NULL AS allocation_ratio, "
            "if(allocated_gpu_hours > 0, busy_gpu_hours / allocated_gpu_hours, NULL) AS usage_ratio, "
            "NULL AS efficiency_score, NULL AS stranded_gpu_hours, "
            "sum(greatest(m.allocated_s - m.busy_s, 0) / 3600 * pr.price_per_gpu_hour) AS idle_cost, "
            f"NULL AS idle_gpus_now FROM team_minutes({args}) AS m{_PRICE} GROUP BY key ORDER BY key"
        )
    source = f"gpu_minutes({args}) AS m{_PRICE}"
    if by in PLACES:
        key = "if(d.place = '', 'unknown', d.place)"
        source += (
            f" LEFT JOIN (SELECT cluster, node, {PLACES[by]} AS place FROM node_places) AS d"
            " ON d.cluster = m.cluster AND d.node = m.node"
        )
    else:
        key = GROUPS[by] if by else "'fleet'"
    last_minute = f"toStartOfMinute(toDateTime64('{sql_time(until)}', 3, 'UTC')) - INTERVAL 1 MINUTE"
    return (
        f"SELECT {key} AS key, sum(m.capacity_s) / 3600 AS capacity_gpu_hours, "
        "sum(m.allocated_s) / 3600 AS allocated_gpu_hours, sum(m.busy_s) / 3600 AS busy_gpu_hours, "
        "if(capacity_gpu_hours > 0, allocated_gpu_hours / capacity_gpu_hours, NULL) AS allocation_ratio, "
        "if(allocated_gpu_hours > 0, busy_gpu_hours / allocated_gpu_hours, NULL) AS usage_ratio, "
        "if(capacity_gpu_hours > 0, busy_gpu_hours / capacity_gpu_hours, NULL) AS efficiency_score, "
        "sum(m.stranded_s) / 3600 AS stranded_gpu_hours, "
        "sum(greatest(m.capacity_s - m.busy_s, 0) / 3600 * pr.price_per_gpu_hour) AS idle_cost, "
        f"uniqExactIf((m.cluster, m.node, m.gpu_index), m.minute = {last_minute} AND m.capacity_s > 0 "
        "AND m.allocated_s = 0) AS idle_gpus_now "
        f"FROM {source} GROUP BY key ORDER BY key"
    )


def shape(rows: list[dict[str, Any]], since: float, until: float, by: str | None) -> dict[str, Any]:
    """The report as JSON: fleet totals at the top, and per-group rows under `groups` with --by."""
    report: dict[str, Any] = {"since": sql_time(since), "until": sql_time(until)}
    if by is None:
        fleet = rows[0] if rows else {}
        report.update({m: _num(fleet.get(m), m) for m in METRICS})
        return report
    report["by"] = by
    report["groups"] = [{by: r["key"], **{m: _num(r.get(m), m) for m in METRICS}} for r in rows]
    return report


def _num(value: Any, metric: str) -> Any:
    if value is None:
        return None if metric.endswith("ratio") or metric == "efficiency_score" else 0
    return round(float(value), 9) if metric != "idle_gpus_now" else int(value)
