"""`chamber report efficiency --since 24h [--by team|pool|model|node|cluster|provider|region|...] [--json]`."""

from __future__ import annotations

import argparse
import json
import time

from services.cli.common import add_nats_option
from services.cli.errors import UsageError
from services.cli.tables import table


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from services.warehouse.efficiency import BY
    from services.warehouse.options import add_warehouse_options

    p = sub.add_parser("report", help="reports from the warehouse")
    reports = p.add_subparsers(dest="report", metavar="REPORT", required=True)
    eff = reports.add_parser("efficiency", help="fleet efficiency: capacity, allocation, usage, stranded, idle cost")
    eff.add_argument("--since", default="24h", help="window start: 24h, 7d, 90m or an ISO time (24h)")
    eff.add_argument("--until", default=None, help="window end: an ISO time (default: now)")
    eff.add_argument(
        "--by",
        choices=list(BY),
        help="one row per group (provider, region, zone, instance_type: from discovery's node labels; "
        "idle cost is priced as billing prices: instance type, then cluster, then GPU model)",
    )
    eff.add_argument("--json", action="store_true", help="print JSON")
    add_nats_option(eff)
    add_warehouse_options(eff)
    eff.set_defaults(func=run_efficiency)


def window(args: argparse.Namespace) -> tuple[float, float]:
    from services.warehouse.efficiency import parse_since

    now = time.time()
    try:
        until = parse_since(args.until, now) if args.until else now
        since = parse_since(args.since, until)
    except ValueError as exc:
        raise UsageError(f"--since/--until: {exc}") from None
    if since >= until:
        raise UsageError("--since must be before --until")
    return since, until


def run_efficiency(args: argparse.Namespace) -> int:
    from services.warehouse.access import read_query
    from services.warehouse.efficiency import METRICS, efficiency_sql, shape

    since, until = window(args)
    result = read_query(args, efficiency_sql(since, until, args.by))
    rows = [dict(zip(result["columns"], r, strict=True)) for r in result["rows"]]
    report = shape(rows, since, until, args.by)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"fleet efficiency {report['since']} .. {report['until']} UTC")
    groups = report.get("groups") or [{"fleet": "fleet", **{m: report[m] for m in METRICS}}]
    key = args.by or "fleet"
    header = [key.upper(), "CAPACITY-H", "ALLOCATED-H", "BUSY-H", "ALLOC", "USAGE", "SCORE", "STRANDED-H"]
    header += ["IDLE COST", "IDLE GPUS NOW"]
    lines = [header]
    for g in groups:
        # a team owns no GPUs: its capacity, and the ratios over it, would read as a bare 0 and "-"
        shown = METRICS[1:3] if key == "team" else METRICS[:3]
        lines.append(
            [str(g[key])]
            + ["-" if m not in shown else _fmt(g[m]) for m in METRICS[:3]]
            + [_pct(g[m]) for m in ("allocation_ratio", "usage_ratio", "efficiency_score")]
            + [_fmt(g["stranded_gpu_hours"]), _fmt(g["idle_cost"]), _fmt(g["idle_gpus_now"])]
        )
    print(table(lines[0], lines[1:]))
    return 0


def _fmt(v: object) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def _pct(v: object) -> str:
    return "-" if v is None else f"{float(v) * 100:.1f}%"  # type: ignore[arg-type]
