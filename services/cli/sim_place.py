"""`chamber sim place`: a packing replay anyone can run, with the scheduler's own shared-GPU packer."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from services.cli.errors import UsageError


def register_place(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "place",
        help="place a sequence of pods on an inventory, once each, in order (a packing replay)",
        description="Place each pod of ARRIVALS on the inventory of NODES with the scheduler's own packer, "
        "in order, irrevocably (no departures, retries or preemption), and print the placements: "
        '{"scheduler": NAME, "placements": [...]}, one entry per arrival: [node, [gpu indices]] for a '
        "placed pod (an empty list for a pod without GPUs), null for a rejected one. Formats follow "
        "Alibaba's openb v2023 trace: nodes sn,cpu_milli,memory_mib,gpu,model; arrivals "
        "arrival_idx,name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec. Optional MIG columns: nodes `mig` "
        "(GPUs in MIG mode), arrivals `mig_profile` (one instance; its entry adds the start slice).",
    )
    p.add_argument("--nodes", type=Path, required=True, metavar="NODES.csv", help="the inventory")
    p.add_argument("--arrivals", type=Path, required=True, metavar="ARRIVALS.csv", help="the pods, in order")
    # the packer's module (and numpy) is imported when the command runs, not when the CLI starts
    p.add_argument(
        "--policy", default="chamber", help="chamber, bestfit or fgd (default chamber; fgd: a re-implementation)"
    )
    p.add_argument("--json", action="store_true", help="print the JSON document (the default output too)")
    p.set_defaults(func=run_place)


def run_place(args: argparse.Namespace) -> int:
    from services.scheduler.core.sharing import PackError
    from services.tracesim.place import PlaceInputError, read_arrivals, read_nodes, replay

    try:
        nodes = read_nodes(args.nodes)
        pods = read_arrivals(args.arrivals)
        result = replay(nodes, pods, args.policy)
    except (PlaceInputError, PackError) as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps({"scheduler": result.scheduler, "placements": result.placements}))
    return 0
