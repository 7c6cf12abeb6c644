"""`chamber streams`: every JetStream stream and KV bucket with its replicas, leader and followers
(are they current?), messages and bytes: what an operator checks on a NATS cluster. Then the
telemetry partitions: how many the server's mapping has (learnt from probes no stream stores), how
many are configured here and how many partition streams exist, and what to do when they disagree."""

from __future__ import annotations

import argparse
import json
from typing import Any

from services.cli.common import add_nats_option, with_nats
from services.cli.tables import table
from services.runtime.partitions import configured_partitions, existing_partitions, explain_mapping, server_partitions


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("streams", help="streams and KV buckets: replicas, leader, followers, messages")
    add_nats_option(p)
    p.add_argument("--json", action="store_true", help='print {"streams": [...]} for scripts')
    p.set_defaults(func=run)


def describe(info: Any) -> dict[str, Any]:
    cluster = info.cluster
    followers = [
        {"name": p.name, "current": bool(p.current), "offline": bool(p.offline), "lag": p.lag or 0}
        for p in (cluster.replicas or [] if cluster else [])
    ]
    return {
        "name": info.config.name,
        "replicas": info.config.num_replicas or 1,
        "leader": cluster.leader if cluster else None,
        "followers": followers,
        "messages": info.state.messages,
        "bytes": info.state.bytes,
    }


async def read_streams(nc: Any) -> list[dict[str, Any]]:
    infos = await nc.jetstream().streams_info()
    return sorted((describe(i) for i in infos), key=lambda s: s["name"])


async def read_partitions(nc: Any) -> dict[str, Any]:
    server = await server_partitions(nc)
    configured, existing = configured_partitions(), await existing_partitions(nc.jetstream())
    problem = explain_mapping(server, configured, existing) if server is not None else None
    return {"server_mapping": server, "configured": configured, "streams": len(existing), "problem": problem}


async def read_all(nc: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return await read_streams(nc), await read_partitions(nc)


def run(args: argparse.Namespace) -> int:
    streams, partitions = with_nats(args, read_all)
    if args.json:
        print(json.dumps({"streams": streams, "telemetry_partitions": partitions}, indent=2))
        return 0
    rows = [
        (
            s["name"],
            str(s["replicas"]),
            s["leader"] or "-",
            ", ".join(f"{f['name']}{'' if f['current'] else ' (behind)'}" for f in s["followers"]) or "-",
            str(s["messages"]),
        )
        for s in streams
    ]
    print(table(("STREAM", "R", "LEADER", "FOLLOWERS (BEHIND?)", "MESSAGES"), rows, align="lrllr"))
    server = partitions["server_mapping"]
    print(
        f"telemetry partitions: server mapping {server if server is not None else 'unknown (probes not answered)'}, "
        f"configured {partitions['configured']}, partition streams {partitions['streams']}"
    )
    if partitions["problem"]:
        print(partitions["problem"])
    return 0
