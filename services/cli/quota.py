"""`chamber quota set|list|pool set`: team quotas and pools."""

from __future__ import annotations

import argparse
import json
from typing import Any

from services.cli.common import add_nats_option, finite_float, send_command
from services.cli.errors import UsageError
from services.cli.model_check import warn_unknown_model


def _send(args: argparse.Namespace, service: str, verb: str, payload: dict[str, Any]) -> Any:
    """send_command, with logs on stderr: stdout carries only the answer (scripts parse it)."""
    from services.runtime.logs import configure_logging

    configure_logging("error")
    return send_command(args, service, verb, payload)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("quota", help="team quotas (guarantee, borrow and lend limits, weight) and pools")
    qs = p.add_subparsers(dest="quota_command", metavar="COMMAND", required=True)

    s = qs.add_parser("set", help="set a team's quota in a pool")
    add_nats_option(s)
    s.add_argument("team")
    s.add_argument("--pool", default="default")
    s.add_argument("--gpus", type=int, required=True, help="guaranteed GPUs")
    s.add_argument("--borrow-limit", type=int, help="GPUs it may borrow beyond its guarantee (default: no limit)")
    s.add_argument("--lend-limit", type=int, help="idle guaranteed GPUs it lends at most (default: all)")
    s.add_argument(
        "--np-lend-limit",
        type=int,
        help="of the idle guarantee it lends, GPUs other teams' non-preemptible work may use: returned by "
        "draining, not preemption (default: half of what it lends; 0: none)",
    )
    s.add_argument("--weight", type=finite_float, default=1.0, help="fair-share weight (default 1)")
    s.add_argument(
        "--critical",
        action="store_true",
        help="the team may submit critical work in this pool (it preempts other teams' work); off by default",
    )
    s.add_argument("--budget", type=finite_float, metavar="AMOUNT", help="optional spending limit per month (USD)")
    s.add_argument(
        "--on-budget",
        choices=["demote", "hold", "notify"],
        help="once the budget is exceeded, new work runs preemptible at low priority (demote), waits (hold), "
        "or only an event and a dashboard flag (notify, the default)",
    )
    s.set_defaults(func=set_quota)

    s = qs.add_parser("list", help="quotas, usage, borrowing and fair share per team")
    add_nats_option(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=list_quotas)

    from services.cli import kueue

    kueue.register(qs)

    pool = qs.add_parser("pool", help="pools of capacity")
    ps = pool.add_subparsers(dest="pool_command", metavar="COMMAND", required=True)
    s = ps.add_parser("set", help="define a pool by GPU model or node label")
    add_nats_option(s)
    s.add_argument("name")
    which = s.add_mutually_exclusive_group(required=True)
    which.add_argument("--gpu-model", help="nodes with this GPU model")
    which.add_argument("--node-label", metavar="K=V", help="nodes with this label")
    s.set_defaults(func=set_pool)


def set_quota(args: argparse.Namespace) -> int:
    for flag, value in (
        ("--gpus", args.gpus),
        ("--borrow-limit", args.borrow_limit),
        ("--lend-limit", args.lend_limit),
        ("--np-lend-limit", args.np_lend_limit),
    ):
        if value is not None and value < 0:
            raise UsageError(f"{flag} must be 0 or more, got {value}")
    if args.weight <= 0:
        raise UsageError(f"--weight must be above 0, got {args.weight:g}")
    payload = {"team": args.team, "pool": args.pool, "gpus": args.gpus, "weight": args.weight}
    if args.critical:
        payload["critical"] = True
    if args.borrow_limit is not None:
        payload["borrow_limit"] = args.borrow_limit
    if args.lend_limit is not None:
        payload["lend_limit"] = args.lend_limit
    if args.np_lend_limit is not None:
        payload["np_lend_limit"] = args.np_lend_limit
    if args.budget is not None:
        if args.budget < 0:
            raise UsageError(f"--budget must be 0 or more, got {args.budget:g}")
        payload["budget"] = args.budget
        if args.on_budget:
            payload["on_budget"] = args.on_budget
    elif args.on_budget:
        raise UsageError("--on-budget needs --budget AMOUNT")
    result = _send(args, "quota", "set", payload)
    budget = f", budget {result['budget']:g} USD/month" if "budget" in result else ""
    if "on_budget" in result:
        budget += f" (over it: {result['on_budget']})"
    critical = ", may run critical work" if result.get("critical") else ""
    print(f"team {result['team']}: {result['guaranteed']} GPUs guaranteed in pool {result['pool']}{critical}{budget}")
    return 0


def list_quotas(args: argparse.Namespace) -> int:
    result = _send(args, "quota", "list", {})
    if args.json:
        print(json.dumps(result))
        return 0
    if not result["teams"]:
        print("no quotas; set one with `chamber quota set TEAM --gpus N`")
        return 0
    print(
        f"{'TEAM':<14} {'POOL':<10} {'GUAR':>5} {'BORROW':>7} {'LEND':>5} {'WEIGHT':>6} {'IN USE':>7} "
        f"{'BORROWED':>9} {'SHARE':>6}"
    )
    for t in result["teams"]:
        borrow = "-" if t["borrow_limit"] is None else t["borrow_limit"]
        lend = "-" if t["lend_limit"] is None else t["lend_limit"]
        print(
            f"{t['team']:<14} {t['pool']:<10} {t['guaranteed']:>5} {borrow:>7} {lend:>5} {t['weight']:>6g} "
            f"{t['in_use']:>7} {t['borrowed']:>9} {t['fair_share']:>6.3f}"
        )
    return 0


def set_pool(args: argparse.Namespace) -> int:
    payload = {"name": args.name, "gpu_model": args.gpu_model, "node_label": args.node_label}
    result = _send(args, "quota", "pool_set", payload)
    warn_unknown_model(args, args.gpu_model, f"pool {args.name}")
    what = f"GPU model {result['gpu_model']}" if result["gpu_model"] else f"nodes labeled {result['node_selector']}"
    print(f"pool {result['pool']}: {what}")
    return 0
