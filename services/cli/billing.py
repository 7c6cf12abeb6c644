"""`chamber billing price set MODEL RATE|list|import`, `chamber billing report --since 7d [--json]`, and for
serving workloads `chamber billing tokens KIND/NAME COUNT -n NS` and `chamber billing serving [--month]`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from services.cli.common import add_nats_option, send_command
from services.cli.errors import UsageError
from services.cli.tables import table


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from services.warehouse.options import add_warehouse_options

    p = sub.add_parser("billing", help="GPU-hour prices and cost reports")
    billing = p.add_subparsers(dest="billing", metavar="ACTION", required=True)
    price = billing.add_parser("price", help="GPU-hour prices")
    price_sub = price.add_subparsers(dest="price", metavar="ACTION", required=True)
    setp = price_sub.add_parser("set", help="set the price per GPU-hour of a GPU model")
    setp.add_argument("model", help="GPU model, e.g. H100-80GB")
    setp.add_argument("rate", help="price per GPU-hour, e.g. 3.50")
    setp.add_argument("--currency", default="USD")
    add_nats_option(setp)
    setp.set_defaults(func=run_price_set)
    lst = price_sub.add_parser("list", help="the prices in force, and the fleet's GPU models without one")
    lst.add_argument("--json", action="store_true", help="print JSON")
    add_nats_option(lst)
    lst.set_defaults(func=run_price_list)
    imp = price_sub.add_parser(
        "import", help="set prices from a table: per GPU model, per instance type, per cluster (on-prem amortised)"
    )
    imp.add_argument("file", metavar="FILE", help="YAML price table (see services/billing/price_table.py)")
    imp.add_argument("--dry-run", action="store_true", help="print the per-GPU-hour prices without setting them")
    add_nats_option(imp)
    imp.set_defaults(func=run_price_import)

    tokens = billing.add_parser("tokens", help="report tokens a serving workload served (for its cost per million)")
    tokens.add_argument("workload", help="<kind>/<name> of a serving workload: deployment/llm, statefulset/kv")
    tokens.add_argument("tokens", type=int, help="tokens served since the last report (a count, not a total)")
    tokens.add_argument("--namespace", "-n", required=True, help="the workload's namespace")
    tokens.add_argument("--cluster", default=None, help="its cluster, if its name is in more than one")
    tokens.add_argument("--report-id", default=None, help="your id for this count: a retry with it counts once")
    add_nats_option(tokens)
    tokens.set_defaults(func=run_tokens)
    serving = billing.add_parser("serving", help="cost per serving workload, and per million tokens")
    serving.add_argument("--month", default=None, help="YYYY-MM (UTC); default: ever")
    serving.add_argument("--json", action="store_true", help="print JSON")
    add_nats_option(serving)
    serving.set_defaults(func=run_serving)

    report = billing.add_parser("report", help="cost per team, idle cost per pool, budgets")
    report.add_argument("--since", default="7d", help="window start: 7d, 24h or an ISO time (7d)")
    report.add_argument("--until", default=None, help="window end: an ISO time (default: now)")
    report.add_argument(
        "--by",
        choices=["team", "cluster", "provider", "region"],
        default="team",
        help="team (and idle cost per pool, budgets; the default) or where the GPUs were",
    )
    report.add_argument("--json", action="store_true", help="print JSON")
    add_nats_option(report)
    add_warehouse_options(report)
    report.set_defaults(func=run_report)


def run_price_set(args: argparse.Namespace) -> int:
    try:
        rate = float(args.rate)
    except ValueError:
        raise UsageError(
            f"RATE {args.rate!r} is not a number; e.g. `chamber billing price set H100-80GB 3.50`"
        ) from None
    if rate < 0:
        raise UsageError("RATE must be 0 or more")
    result = send_command(
        args, "billing", "price", {"gpu_model": args.model, "price_per_gpu_hour": rate, "currency": args.currency}
    )
    print(f"{result['gpu_model']}: {result['price_per_gpu_hour']:.4f} {args.currency} per GPU-hour")
    return 0


def run_price_list(args: argparse.Namespace) -> int:
    result = send_command(args, "billing", "prices", {})
    if args.json:
        print(json.dumps(result))
        return 0
    print(price_text(result))
    return 0


_SCOPES = (("gpu_model", "GPU model"), ("instance_type", "instance type"), ("cluster", "cluster"))


def price_text(result: dict[str, Any]) -> str:
    """One row per price; a GPU's price is its instance type's, else its cluster's, else its model's."""
    currency = result.get("currency", "USD")
    rows = [
        (what, name, f"{rate:.4f}") for scope, what in _SCOPES for name, rate in sorted(result.get(scope, {}).items())
    ]
    lines = [table(("PRICES", "NAME", f"{currency}/GPU-HOUR"), rows, left=2)] if rows else ["no prices set"]
    if result.get("unpriced_models"):
        lines.append(
            f"GPU models in the fleet without a price (they cost 0 unless an instance type or cluster price "
            f"covers them): {', '.join(result['unpriced_models'])}; set one with `chamber billing price set MODEL RATE`"
        )
    lines.append("(a GPU's price is its instance type's, else its cluster's, else its model's)")
    return "\n".join(lines)


def run_price_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from services.billing.price_table import PriceTableError, read

    try:
        table = yaml.safe_load(Path(args.file).read_text(encoding="utf-8-sig"))
        currency, prices = read(table)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read {args.file}: {exc}") from None
    except PriceTableError as exc:
        raise UsageError(f"{args.file}: {exc}") from None
    for price in prices:
        if not args.dry_run:
            send_command(
                args,
                "billing",
                "price",
                {price.scope: price.name, "price_per_gpu_hour": price.per_gpu_hour, "currency": currency},
            )
        print(f"{price.scope} {price.name}: {price.per_gpu_hour:.4f} {currency} per GPU-hour ({price.how})")
    return 0


def run_tokens(args: argparse.Namespace) -> int:
    if args.tokens < 0:
        raise UsageError("TOKENS must be 0 or more")
    request = {"namespace": args.namespace, "workload": args.workload, "tokens": args.tokens}
    request.update({k: v for k, v in (("cluster", args.cluster), ("report_id", args.report_id)) if v})
    result = send_command(args, "billing", "tokens", request)
    print(f"{result['cluster']}/{result['namespace']}/{result['workload']}: {result['tokens']} tokens recorded")
    return 0


def run_serving(args: argparse.Namespace) -> int:
    result = send_command(args, "billing", "serving", {"month": args.month} if args.month else {})
    if args.json:
        print(json.dumps(result))
        return 0
    print(serving_text(result))
    return 0


def serving_text(result: dict[str, Any]) -> str:
    """One row per serving workload: cost, GPU-hours, tokens and cost per million tokens."""
    currency = result.get("currency", "USD")
    rows = [
        (
            f"{w['cluster']}/{w['namespace']}/{w['workload']}",
            w["team"],
            f"{w['gpu_hours']:.2f}",
            f"{w['cost']:.2f}",
            str(w["tokens"]) if w["tokens"] else "-",
            "-" if w["cost_per_million_tokens"] is None else f"{w['cost_per_million_tokens']:.4f}",
        )
        for w in result.get("workloads", [])
    ]
    if not rows:
        return "no serving workload has cost anything yet"
    when = f" in {result['month']}" if result.get("month") else ""
    head = ("WORKLOAD", "TEAM", "GPU-HOURS", f"COST ({currency})", "TOKENS", f"{currency}/1M TOKENS")
    return f"serving workloads{when}\n" + table(head, rows, left=2)


def report_sql(since: float, until: float) -> str:
    from services.warehouse.efficiency import sql_time

    window = (
        f"period_start >= toDateTime64('{sql_time(since)}', 3, 'UTC') "
        f"AND period_start < toDateTime64('{sql_time(until)}', 3, 'UTC')"
    )
    return (
        "SELECT kind, name, gpu_hours, cost, currency, jobs, if(kind = 'team', b.budget, NULL) AS budget FROM ("
        "SELECT if(idle = 1, 'idle', 'team') AS kind, if(idle = 1, pool, team) AS name, "
        "sum(gpu_seconds) / 3600 AS gpu_hours, sum(cost) AS cost, any(currency) AS currency, "
        "uniqExactIf(job_id, job_id != '') AS jobs "
        f"FROM cost_ledger FINAL WHERE {window} GROUP BY kind, name) AS c "
        "LEFT JOIN (SELECT team, toNullable(argMax(amount, at)) AS budget FROM budgets FINAL GROUP BY team) AS b "
        "ON b.team = c.name ORDER BY kind DESC, cost DESC, name"
    )


def places_sql(since: float, until: float, by: str) -> str:
    """Cost, and the idle part of it, per cluster, provider or region of the GPUs."""
    from services.warehouse.efficiency import sql_time

    assert by in ("cluster", "provider", "region")
    return (
        f"SELECT if({by} = '', 'unknown', {by}) AS name, sum(gpu_seconds) / 3600 AS gpu_hours, sum(cost) AS spent, "
        "sumIf(cost, idle = 1) AS idle_cost, any(currency) AS currency, uniqExactIf(job_id, job_id != '') AS jobs "
        f"FROM cost_ledger FINAL WHERE period_start >= toDateTime64('{sql_time(since)}', 3, 'UTC') "
        f"AND period_start < toDateTime64('{sql_time(until)}', 3, 'UTC') GROUP BY name ORDER BY spent DESC, name"
    )


def run_places_report(args: argparse.Namespace, since: float, until: float) -> int:
    from services.warehouse.access import read_query
    from services.warehouse.efficiency import sql_time

    result = read_query(args, places_sql(since, until, args.by))
    rows = [dict(zip(result["columns"], r, strict=True)) for r in result["rows"]]
    groups = [
        {
            args.by: r["name"],
            "gpu_hours": r["gpu_hours"],
            "cost": r["spent"],
            "idle_cost": r["idle_cost"],
            "jobs": r["jobs"],
        }
        for r in rows
    ]
    report = {
        "since": sql_time(since),
        "until": sql_time(until),
        "by": args.by,
        "currency": rows[0]["currency"] if rows else "USD",
        "groups": groups,
        "total_cost": round(sum(r["spent"] for r in rows), 6),
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"cost by {args.by} {report['since']} .. {report['until']} UTC ({report['currency']})")
    cells: list[tuple[str, ...]] = [
        (str(g[args.by]), f"{g['gpu_hours']:.2f}", f"{g['cost']:.2f}", f"{g['idle_cost']:.2f}", str(g["jobs"]))
        for g in groups
    ]
    cells.append(("total", "", f"{report['total_cost']:.2f}", "", ""))
    print(table((args.by.upper(), "GPU-HOURS", "COST", "IDLE COST", "JOBS"), cells))
    return 0


def run_report(args: argparse.Namespace) -> int:
    from services.cli.report import window
    from services.warehouse.access import read_query
    from services.warehouse.efficiency import sql_time

    since, until = window(args)
    if args.by != "team":
        return run_places_report(args, since, until)
    result = read_query(args, report_sql(since, until))
    rows = [dict(zip(result["columns"], r, strict=True)) for r in result["rows"]]
    teams = [
        {"team": r["name"], "gpu_hours": r["gpu_hours"], "cost": r["cost"], "jobs": r["jobs"], "budget": r["budget"]}
        for r in rows
        if r["kind"] == "team"
    ]
    idle = [{"pool": r["name"], "gpu_hours": r["gpu_hours"], "cost": r["cost"]} for r in rows if r["kind"] == "idle"]
    report = {
        "since": sql_time(since),
        "until": sql_time(until),
        "currency": rows[0]["currency"] if rows else "USD",
        "teams": teams,
        "idle": idle,
        "total_cost": round(sum(r["cost"] for r in rows), 6),
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"cost {report['since']} .. {report['until']} UTC ({report['currency']})")
    cells: list[tuple[str, ...]] = [
        (
            t["team"],
            f"{t['gpu_hours']:.2f}",
            f"{t['cost']:.2f}",
            str(t["jobs"]),
            "-" if t["budget"] is None else f"{t['budget']:.2f}",
        )
        for t in teams
    ]
    cells += [("idle: " + i["pool"], f"{i['gpu_hours']:.2f}", f"{i['cost']:.2f}", "", "") for i in idle]
    cells.append(("total", "", f"{report['total_cost']:.2f}", "", ""))
    print(table(("TEAM", "GPU-HOURS", "COST", "JOBS", "BUDGET"), cells))
    return 0
