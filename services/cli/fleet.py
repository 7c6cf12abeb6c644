"""`chamber fleet`: nodes and GPUs with model, utilization, health and isolation reason (from the
discovery service's KV view); `chamber fleet forget NODE`: forget a lost node that left for good."""

from __future__ import annotations

import argparse
import json
from typing import Any

from services.cli.common import (
    add_nats_option,
    add_node_verb,
    node_payload,
    not_running,
    request_patiently,
    send_command,
    with_nats,
)
from services.cli.errors import UsageError
from services.cli.tables import table
from services.runtime.buckets import bucket_keys

BUCKET = "chamber_fleet"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("fleet", help="show nodes and GPUs: model, utilization, health, isolation reason")
    add_nats_option(p)
    p.add_argument("--cluster", help="only this cluster")
    p.add_argument("--json", action="store_true", help='print {"nodes": [...]} for scripts')
    p.set_defaults(func=run)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    add_node_verb(
        verbs,
        "forget",
        run_forget,
        help="forget a lost node that left the fleet for good",
        description="Forget NODE, a lost node that left the fleet for good: every service drops it and "
        "`chamber fleet` no longer lists it (its history stays in the log). Only a lost node can be forgotten; "
        "a node Kubernetes deleted is forgotten by itself once it has been lost for the discovery's "
        "--lost-after again. If its agent reports later, it is discovered anew, as a new node.",
    )

    lost = verbs.add_parser(
        "forget-lost",
        help="forget every lost node (of --cluster) that left the fleet for good",
        description="Forget every node `chamber fleet` lists as lost (of --cluster if given), one forget "
        "each: after a smaller `chamber up --nodes N`, or nodes decommissioned for good. A node the "
        "discovery will not forget (Kubernetes still lists it) is named with the reason; the exit status "
        "is then 1.",
    )
    lost.add_argument("--cluster", help="only this cluster")
    lost.add_argument("--reason", default="", help="recorded with each event")
    add_nats_option(lost)
    lost.set_defaults(func=run_forget_lost)


# A node `chamber fleet` shows LOST may still be being announced so: the discovery refuses to forget
# it until it has folded its own NodeLost (catching_up); ask again for up to this long.
FORGET_PATIENCE_S = 5.0


def run_forget_lost(args: argparse.Namespace) -> int:
    from services.runtime.commands import CommandRefused, CommandUnavailable

    async def body(nc: Any) -> list[tuple[str, str | None]]:
        done: list[tuple[str, str | None]] = []
        for n in await read_fleet(nc, args.cluster):
            if n["status"] != "lost":
                continue
            payload = node_payload(args, node=n["node"], cluster=n["cluster"])
            try:
                await request_patiently(nc, "discovery", "forget", payload, patience_s=FORGET_PATIENCE_S)
                done.append((f"{n['cluster']}/{n['node']}", None))
            except CommandRefused as exc:
                done.append((f"{n['cluster']}/{n['node']}", str(exc)))
            except CommandUnavailable as exc:
                raise not_running(exc, "discovery") from None
        return done

    done = with_nats(args, body)
    if not done:
        print("no lost nodes")
        return 0
    for name, refused in done:
        print(f"forgot {name}" if refused is None else f"kept {name}: {refused}")
    kept = sum(1 for _, refused in done if refused is not None)
    print(f"{len(done) - kept} forgotten, {kept} kept")
    return 1 if kept else 0


def run_forget(args: argparse.Namespace) -> int:
    send_command(args, "discovery", "forget", node_payload(args), patience_s=FORGET_PATIENCE_S)
    print(f"forgot {args.cluster}/{args.node}: no service keeps it any more")
    return 0


async def read_fleet(nc: Any, cluster: str | None = None) -> list[dict[str, Any]]:
    from nats.js.errors import BucketNotFoundError, KeyNotFoundError

    js = nc.jetstream()
    try:
        kv = await js.key_value(BUCKET)
    except BucketNotFoundError:
        raise UsageError(
            "no fleet view yet: start the discovery service (`chamber service discovery` or `chamber up`)"
        ) from None
    keys = await bucket_keys(js, BUCKET)  # a deleted key is listed too; reading it below skips it
    nodes = []
    for key in keys:
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:  # deleted since it was listed: a node forgotten meanwhile
            continue
        if entry.value:
            node = json.loads(entry.value)
            if cluster is None or node.get("cluster") == cluster:
                nodes.append(node)
    return sorted(nodes, key=lambda n: (n["cluster"], n["node"]))


def contract(node: dict[str, Any]) -> dict[str, Any]:
    """The documented shape (other tools rely on it), plus extra fields after it."""
    documented = ("index", "uuid", "model", "util", "isolated", "reason")
    gpus = [
        {**{k: g.get(k) for k in documented}, **{k: v for k, v in g.items() if k not in documented}}
        for g in node.get("gpus", [])
    ]
    base = {k: node.get(k) for k in ("cluster", "node", "status", "reason")}
    extra = {k: v for k, v in node.items() if k not in base and k != "gpus"}
    return {**base, "gpus": gpus, **extra}


def run(args: argparse.Namespace) -> int:
    nodes = with_nats(args, lambda nc: read_fleet(nc, args.cluster))
    if args.json:
        print(json.dumps({"nodes": [contract(n) for n in nodes]}, indent=2))
        return 0
    if not nodes:
        print("no nodes yet")
        return 0
    print(fleet_text(nodes))
    return 0


_OUT = ("lost", "isolated")  # a lost or isolated node serves nothing, whatever its GPUs said last


def fleet_text(nodes: list[dict[str, Any]]) -> str:
    lines = []
    for n in nodes:
        out = n["status"] in _OUT
        healthy = 0 if out else sum(1 for g in n["gpus"] if not g["isolated"])
        lines.append(
            f"{n['cluster']}/{n['node']}  {n['status'].upper()}  {healthy}/{len(n['gpus'])} GPUs in service"
            + (f"  {n['reason']}" if n.get("reason") else "")
        )
        rows = []
        for g in n["gpus"]:
            util = "-" if g.get("util") is None or n["status"] == "lost" else f"{g['util']:.0f}%"
            health = f"node {n['status']}" if out else "isolated" if g["isolated"] else "ok"
            reason = g["reason"] if g["isolated"] and g.get("reason") else ""
            model = f"AMD {g['model']}" if g.get("vendor") == "amd" else g["model"]  # NVIDIA lines as before
            rows.append((f"   gpu {g['index']}", model, f"util {util}", health, reason))
        if rows:
            lines.extend(table(("", "", "", "", ""), rows, align="llrll").splitlines()[1:])
    gpus = sum(len(n["gpus"]) for n in nodes)
    in_service = sum(sum(1 for g in n["gpus"] if not g["isolated"]) for n in nodes if n["status"] not in _OUT)
    lost = [n for n in nodes if n["status"] == "lost"]
    lines.append(
        f"{len(nodes)} nodes ({len(lost)} lost), {gpus} GPUs, {in_service} in service"
        if lost
        else f"{len(nodes)} nodes, {gpus} GPUs, {in_service} in service"
    )
    if lost:
        lines.append("(a lost node that left for good: `chamber fleet forget NODE`, or `chamber fleet forget-lost`)")
    return "\n".join(lines)
