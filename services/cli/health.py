"""`chamber health`: restore or confirm isolations, list held ones, print the effective policy."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import Any

from services.cli.common import add_cluster_option, add_nats_option, send_command
from services.cli.errors import UsageError
from services.cli.tables import table


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("health", help="GPU and node health: restore, confirm held isolations, policy")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, text in (
        ("restore", "put an isolated node (or one GPU with --gpu) back in service"),
        ("confirm", "confirm an isolation the isolation budget held back"),
        ("dismiss", "decline an isolation the isolation budget held back"),
    ):
        v = verbs.add_parser(verb, help=text)
        v.add_argument("node", metavar="NODE")
        v.add_argument("--gpu", type=int, metavar="I", help="GPU index on the node (default: the whole node)")
        add_cluster_option(v)
        add_nats_option(v)
        v.set_defaults(func=run_target)
    held = verbs.add_parser("held", help="isolations waiting for an operator's confirmation")
    held.add_argument("--json", action="store_true")
    add_nats_option(held)
    held.set_defaults(func=run_held)
    pol = verbs.add_parser("policy", help="the effective policy: per XID and fault kind, severity and action")
    pol.add_argument("--json", action="store_true", help="print JSON")
    pol.add_argument("--policy", type=Path, help="without a running service: this file merged over the default")
    pol.add_argument("--local", action="store_true", help="do not ask the running service")
    add_nats_option(pol)
    pol.set_defaults(func=run_policy)


def run_target(args: argparse.Namespace) -> int:
    if args.gpu is not None and args.gpu < 0:
        raise UsageError("--gpu must be a GPU index (0 or more)")
    payload = {"node": args.node, "cluster": args.cluster, "gpu": args.gpu, "by": getpass.getuser()}
    result = send_command(args, "health", args.verb, payload)
    print(f"{result['action']}: {args.node}" + (f" gpu {args.gpu}" if args.gpu is not None else ""))
    print(f"  {result['reason']}")
    return 0


def run_held(args: argparse.Namespace) -> int:
    held = send_command(args, "health", "held", {})
    if args.json:
        print(json.dumps({"held": held}, indent=2))
    elif not held:
        print("nothing held")
    for h in [] if args.json else held:
        gpu = f" --gpu {h['gpu']}" if h["gpu"] is not None else ""
        print(f"{h['cluster']}/{h['node']}{gpu}  {h['action']}  {h['reason']}")
    return 0


def _reachable(url: str) -> bool:
    """A quick TCP probe: nats-py retries a refused server for a long time, so look first."""
    import socket
    from urllib.parse import urlparse

    for one in url.split(","):  # a comma-separated list: any server that answers will do
        parsed = urlparse(one.strip() if "://" in one else f"nats://{one.strip()}")
        try:
            with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 4222), timeout=0.5):
                return True
        except OSError:
            continue
    return False


def run_policy(args: argparse.Namespace) -> int:
    from services.health.policy import PolicyError, load_policy

    effective: dict[str, Any] | None = None
    if not args.local and args.policy is None:
        if _reachable(args.nats):
            try:
                effective = send_command(args, "health", "policy", {}, timeout=2.0)
            except UsageError as exc:
                print(f"chamber health policy: warning: {exc}; showing the default policy", file=sys.stderr)
        else:
            print(
                f"chamber health policy: warning: NATS at {args.nats} not reachable; showing the default policy",
                file=sys.stderr,
            )
    if effective is None:
        try:
            effective = load_policy(args.policy).to_json()
        except PolicyError as exc:
            raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(effective, indent=2))
        return 0
    columns = ("SEVERITY", "ACTION", "DESCRIPTION")

    def rows(rules: dict[str, Any]) -> list[tuple[str, ...]]:
        return [(str(k), r["severity"], r["action"], r["description"]) for k, r in rules.items()]

    print(table(("XID", *columns), rows(effective["xid"]), align="rlll"))
    print()
    print(table(("KIND", *columns), rows(effective["kinds"]), align="llll"))
    b = effective["budget"]
    print(f"\nbudget: {b['max_share']:.0%} of nodes (at least {b['min_nodes']}) per {b['window_s']:g}s")
    return 0
