"""`chamber quota set|list|pool set`: team quotas and pools.

`quota set` is a patch: only the flags given change, the others keep their values (`--replace` sets
the whole quota, the flags not given taking their defaults); it prints every setting with what changed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from services.cli.common import add_nats_option, finite_float, send_command
from services.cli.errors import UsageError
from services.cli.model_check import warn_unknown_model
from services.cli.tables import table


def _send(args: argparse.Namespace, service: str, verb: str, payload: dict[str, Any]) -> Any:
    """send_command, with logs on stderr: stdout carries only the answer (scripts parse it)."""
    from services.runtime.logs import configure_logging

    configure_logging("error")
    return send_command(args, service, verb, payload)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("quota", help="team quotas (guarantee, borrow and lend limits, weight) and pools")
    qs = p.add_subparsers(dest="quota_command", metavar="COMMAND", required=True)

    s = qs.add_parser(
        "set",
        help="change a team's quota in a pool (only the flags given)",
        description="Change a team's quota in a pool: only the flags given change, the others keep their "
        "current values; --replace sets the whole quota instead. Prints every setting and what changed.",
    )
    add_nats_option(s)
    s.add_argument("team")
    s.add_argument("--pool", default="default")
    s.add_argument("--gpus", type=_count, help="guaranteed GPUs (needed for a team's first quota in the pool)")
    s.add_argument(
        "--borrow-limit",
        type=_limit,
        metavar="N|none",
        help="GPUs it may borrow beyond its guarantee (none: no limit, the default)",
    )
    s.add_argument(
        "--lend-limit",
        type=_limit,
        metavar="N|none",
        help="idle guaranteed GPUs it lends at most (none: all, the default)",
    )
    s.add_argument(
        "--np-lend-limit",
        type=_limit,
        metavar="N|none",
        help="of the idle guarantee it lends, GPUs other teams' non-preemptible work may use: returned by "
        "draining, not preemption (none: half of what it lends, the default; 0: none)",
    )
    s.add_argument("--weight", type=finite_float, help="fair-share weight (default 1)")
    s.add_argument(
        "--critical",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the team may submit critical work in this pool (it preempts other teams' work); off by default",
    )
    s.add_argument(
        "--replace",
        action="store_true",
        help="set the whole quota: flags not given take their defaults instead of keeping their values",
    )
    s.add_argument("--json", action="store_true", help="print the answer as JSON")
    s.add_argument("--budget", type=finite_float, metavar="AMOUNT", help="optional spending limit per month (USD)")
    s.add_argument(
        "--on-budget",
        choices=["demote", "hold", "notify"],
        help="once the budget is exceeded, new work runs preemptible at low priority (demote), waits (hold), "
        "or only an event and a dashboard flag (notify, the default)",
    )
    s.add_argument(
        "--expected-seq",
        type=_count,
        metavar="SEQ",
        help="change it only if the team's quota is still at this sequence (`seq` of the last change's --json "
        "answer); refused if anyone changed it since",
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
    s = ps.add_parser(
        "delete",
        help="remove a pool no team has a guarantee in, no job runs in and no node is selected into",
        description="Remove a pool (with its quotas of 0 GPUs). Refused, naming them, while a team has a "
        "guarantee in it, a job runs in it or a node is selected into it.",
    )
    add_nats_option(s)
    s.add_argument("name")
    s.set_defaults(func=delete_pool)
    s = ps.add_parser("list", help="pools: what selects their nodes, GPUs installed and in service, guaranteed")
    add_nats_option(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=list_pools)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of GPUs, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


_NONE = "none"


def _limit(text: str) -> int | str:
    """A GPU count, or `none` (no limit: the default), which a patch sends as null."""
    return _NONE if text.strip().lower() == _NONE else _count(text)


_FLAG = {"gpus": "gpus", "borrow_limit": "borrow-limit", "lend_limit": "lend-limit", "np_lend_limit": "np-lend-limit"}
_UNSET_MEANING = {"borrow_limit": "no limit", "lend_limit": "all", "np_lend_limit": "half of what it lends"}


def _shown(setting: str, value: Any) -> str:
    if value is None:
        return _UNSET_MEANING.get(setting, "none")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def set_quota(args: argparse.Namespace) -> int:
    if args.weight is not None and args.weight <= 0:
        raise UsageError(f"--weight must be above 0, got {args.weight:g}")
    if args.budget is not None and args.budget < 0:
        raise UsageError(f"--budget must be 0 or more, got {args.budget:g}")
    given: dict[str, Any] = {}
    for name in ("gpus", "borrow_limit", "lend_limit", "np_lend_limit"):
        value = getattr(args, name)
        if value is not None:
            given[name] = None if value == _NONE else value
    if args.weight is not None:
        given["weight"] = args.weight
    if args.critical is not None:
        given["critical"] = args.critical
    if args.budget is not None:
        given["budget"] = args.budget
    if args.on_budget:
        given["on_budget"] = args.on_budget
    if args.expected_seq is not None:
        given["expected_seq"] = args.expected_seq
    if args.pool != "default":
        _check_pool_name(args)
    if args.replace:
        if args.gpus is None:
            raise UsageError("--replace sets the whole quota: give --gpus N")
        if args.on_budget and args.budget is None:
            raise UsageError("--on-budget needs --budget AMOUNT")
        result = _send(args, "quota", "set", {"team": args.team, "pool": args.pool, **given})
    else:
        if not given.keys() - {"expected_seq"}:
            raise UsageError(
                "nothing to change: give at least one of --gpus, --borrow-limit, --lend-limit, --np-lend-limit, "
                "--weight, --critical/--no-critical, --budget, --on-budget"
            )
        _check_team_name(args)
        result = _send(args, "quota", "patch", {"team": args.team, "pool": args.pool, **given})
    if args.json:
        print(json.dumps(result))
    else:
        print(quota_text(result))
    for warning in result.get("warnings", []):
        print(f"chamber quota set: warning: {warning}", file=sys.stderr)
    return 0


def _check_team_name(args: argparse.Namespace) -> None:
    """A patch is a change to a quota; one that would create a team named like an existing team is a
    typo, refused with the name (a new team is created on purpose with --replace and its whole quota)."""
    refuse_team_typo(args, args.team, args.pool, "a new team is created on purpose with --replace: --gpus N --replace")


def refuse_team_typo(
    args: argparse.Namespace, team: str, pool: str | None, how_new: str, *, quota_needed: bool = True
) -> None:
    """Refuse `team` when it has no quota (in `pool`, or in any) and is named like a team that has one.
    Without `quota_needed` the check is skipped while the quota service does not answer."""
    import difflib

    team = team.strip().lower()  # the services' team rule (events/names.py): `Vision` is `vision`
    try:
        quotas = _send(args, "quota", "list", {}).get("teams", [])
    except UsageError:
        if quota_needed:
            raise
        return
    if any(q["team"] == team and pool in (None, q["pool"]) for q in quotas):
        return
    close = difflib.get_close_matches(team, sorted({q["team"] for q in quotas}), n=1, cutoff=0.75)
    if close:
        where = f" in pool {pool}" if pool else ""
        raise UsageError(f"team {team!r} has no quota{where}; did you mean {close[0]!r}? ({how_new})")


def _check_pool_name(args: argparse.Namespace) -> None:
    """A quota in a pool nobody defined, named like one that exists, is a typo: refused with the name."""
    import difflib

    known = sorted({p["pool"] for p in _send(args, "quota", "list", {}).get("pools", [])} | {"default"})
    if args.pool in known:
        return
    close = difflib.get_close_matches(args.pool, known, n=1, cutoff=0.6)
    if close:
        raise UsageError(
            f"no pool {args.pool!r}; did you mean {close[0]!r}? (pools: {', '.join(known)}; a new pool is "
            f"defined with `chamber quota pool set NAME --gpu-model MODEL`)"
        )


def quota_text(result: dict[str, Any]) -> str:
    """The quota a `set` left, every setting with its value before and after."""
    changed = [c for c in result["changes"] if c["changed"]]
    if result.get("new"):
        head = f"team {result['team']}: new quota in pool {result['pool']}"
    elif result.get("replaced"):
        head = f"team {result['team']}: quota in pool {result['pool']} replaced ({len(changed)} changed)"
    else:
        head = f"team {result['team']}: quota in pool {result['pool']} ({len(changed)} changed)"
    lines = [head]
    for c in result["changes"]:
        name = _FLAG.get(c["setting"], c["setting"])
        after = _shown(c["setting"], c["after"])
        if result.get("new"):
            lines.append(f"  {name:<14} {after}")
        else:
            before = _shown(c["setting"], c["before"])
            lines.append(f"  {name:<14} {before} \u2192 {after} ({'changed' if c['changed'] else 'kept'})")
    if "budget" in result:
        state = "changed" if result.get("budget_changed") else "kept"
        lines.append(
            f"  {'budget':<14} {result['budget']:g} {result.get('currency', 'USD')}/month, over it: "
            f"{result['on_budget']} ({state})"
        )
    else:
        lines.append(f"  {'budget':<14} none")
    return "\n".join(lines)


def list_quotas(args: argparse.Namespace) -> int:
    result = _send(args, "quota", "list", {})
    if args.json:
        print(json.dumps(result))
        return 0
    if not result["teams"]:
        print("no quotas; set one with `chamber quota set TEAM --gpus N`")
        return 0
    print(quota_table(result))
    return 0


def quota_table(result: dict[str, Any]) -> str:
    """Every setting of every quota, then usage, aligned; a line per over-committed pool."""
    header = (
        "TEAM",
        "POOL",
        "GUAR",
        "BORROW",
        "LEND",
        "NP-LEND",
        "WEIGHT",
        "CRIT",
        "BUDGET",
        "IN USE",
        "BORROWED",
        "SHARE",
    )
    rows = []
    for t in result["teams"]:
        budget = "-"
        if t.get("budget") is not None:
            budget = f"{t['budget']:g}/{t.get('on_budget') or 'notify'}"
        rows.append(
            (
                t["team"],
                t["pool"],
                str(t["guaranteed"]),
                "-" if t["borrow_limit"] is None else str(t["borrow_limit"]),
                "-" if t["lend_limit"] is None else str(t["lend_limit"]),
                "-" if t.get("np_lend_limit") is None else str(t["np_lend_limit"]),
                f"{t['weight']:g}",
                "yes" if t.get("critical") else "-",
                budget,
                str(t["in_use"]),
                str(t["borrowed"]),
                f"{t['fair_share']:.3f}",
            )
        )
    text = [table(header, rows, left=2)]
    for p in result.get("pools", []):
        if p["over_committed"]:
            text.append(
                f"pool {p['pool']}: over-committed, {p['guaranteed']} GPUs guaranteed of {p['installed']} "
                f"installed ({p['in_service']} in service)"
            )
    text.append("(- : no limit / lends all / half of what it lends; BUDGET: USD a month / what happens over it)")
    return "\n".join(text)


def set_pool(args: argparse.Namespace) -> int:
    payload = {"name": args.name, "gpu_model": args.gpu_model, "node_label": args.node_label}
    result = _send(args, "quota", "pool_set", payload)
    warn_unknown_model(args, args.gpu_model, f"pool {args.name}")
    what = f"GPU model {result['gpu_model']}" if result["gpu_model"] else f"nodes labeled {result['node_selector']}"
    print(f"pool {result['pool']}: {what}")
    return 0


def delete_pool(args: argparse.Namespace) -> int:
    result = _send(args, "quota", "pool_delete", {"name": args.name})
    print(f"pool {result['pool']}: deleted")
    return 0


def list_pools(args: argparse.Namespace) -> int:
    pools = _send(args, "quota", "list", {}).get("pools", [])
    if args.json:
        print(json.dumps({"pools": pools}))
        return 0
    if not pools:
        print("no pools yet; every node is in pool default (define one with `chamber quota pool set`)")
        return 0
    rows = []
    for p in pools:
        if p["gpu_model"]:
            selects = f"model {p['gpu_model']}"
        elif p["node_selector"]:
            selects = ",".join(f"{k}={v}" for k, v in sorted(p["node_selector"].items()))
        else:
            selects = "every node no other pool selects" if p["pool"] == "default" else "-"
        over = f"over by {p['over_committed']}" if p["over_committed"] else "-"
        rows.append((p["pool"], selects, str(p["installed"]), str(p["in_service"]), str(p["guaranteed"]), over))
    print(table(("POOL", "SELECTS", "INSTALLED", "IN SERVICE", "GUARANTEED", "OVER-COMMITTED"), rows, left=2))
    return 0
