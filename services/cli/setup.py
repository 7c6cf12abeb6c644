"""`chamber setup`: create and update the streams and every service's KV buckets, lease buckets and
snapshot stores (services/runtime/setup.py), as the operator (`admin`) or the `setup` user.

Run once at install and after an upgrade (the chart's set-up Job, `chamber up` at each start);
services never do it themselves: their NATS roles may not create, change or delete a stream."""

from __future__ import annotations

import argparse
import json
from typing import Any

from services.cli.common import add_nats_option, add_replicas_option, apply_replicas_option, with_nats


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("setup", help="create or update the streams and the services' buckets (operator, once)")
    add_nats_option(p)
    add_replicas_option(p)
    p.add_argument("--json", action="store_true", help='print {"changed": [...]}')
    p.set_defaults(func=run)


async def _set_up(nc: Any) -> list[str]:
    from services.runtime.setup import set_up

    return await set_up(nc.jetstream())


def run(args: argparse.Namespace) -> int:
    apply_replicas_option(args)
    changed = with_nats(args, _set_up, name="chamber-setup")
    if args.json:
        print(json.dumps({"changed": changed}))
    else:
        print("set up: " + (", ".join(changed) if changed else "streams and buckets already as designed"))
    return 0
