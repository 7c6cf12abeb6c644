"""`chamber mig abandon NODE`: give up a planned MIG change the GPU Operator's MIG manager failed to apply."""

from __future__ import annotations

import argparse

from services.cli.common import add_node_verb, node_payload, send_command


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("mig", help="MIG layouts the scheduler plans: abandon a change that failed")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    add_node_verb(
        verbs,
        "abandon",
        run_abandon,
        help="give up the MIG change planned for NODE (its GPUs keep the layout last applied)",
        description="Give up the MIG change planned for NODE, typically one the MIG manager failed to apply "
        "(the node carries nvidia.com/mig.config.state=failed and stays cordoned). The scheduler places into "
        "the layout last applied again, does not plan another change for those GPUs within the hour, and "
        "lifts the cordon it set. Set the node's nvidia.com/mig.config label back to a configuration that "
        "matches its GPUs yourself: Chamber does not touch it.",
    )


def run_abandon(args: argparse.Namespace) -> int:
    result = send_command(args, "scheduler", "mig_abandon", node_payload(args))
    gpus = ", ".join(str(g) for g in result["gpus"])
    print(f"abandoned the MIG change planned for {args.cluster}/{args.node} (GPUs {gpus})")
    return 0
