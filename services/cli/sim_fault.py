"""`chamber sim-fault NODE KIND`: inject a fault into a simulated node (`chamber.cmd.sim.inject`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from services.cli.common import add_nats_option, send_command
from services.cli.errors import UsageError

KINDS = (
    "xid", "ecc_dbe", "sbe_storm", "row_remap_failure", "row_remap_pending", "thermal", "power_brake",
    "nvlink", "pcie_replay", "gpu_lost", "agent_silent",
    "nic_down", "nic_flap", "nic_degraded", "nic_errors", "pfc_storm", "gpu_slow",
    "amd_umc_ue", "amd_gfx_ue", "amd_bad_pages", "amd_cper_fatal", "amd_reset_hang", "xgmi_down", "clear",
)  # fmt: skip


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sim-fault",
        help="inject a fault into a simulated node (or clear its faults)",
        description="Inject a fault into a node of a running `chamber agent --simulate`.",
    )
    p.add_argument("node", metavar="NODE", help="simulated node name, e.g. sim-003")
    p.add_argument("kind", metavar="KIND", help=f"one of: {', '.join(KINDS)}")
    p.add_argument("--gpu", type=int, metavar="I", help="GPU index (default 0; with clear: only this GPU)")
    p.add_argument(
        "--xid", type=int, metavar="N", help="XID code (required with KIND xid); with amd_cper_fatal: the AFID"
    )
    p.add_argument(
        "--nic", type=int, metavar="I", help="NIC index for the nic_* kinds (default 0; with clear: only this NIC)"
    )
    p.add_argument("--json", action="store_true", help="print the simulator's answer as JSON")
    add_nats_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.kind not in KINDS:
        raise UsageError(f"KIND {args.kind!r} is not one of: {', '.join(KINDS)}")
    if args.kind == "xid" and args.xid is None:
        raise UsageError("KIND xid needs the XID code: add --xid N (e.g. --xid 79)")
    if args.gpu is not None and args.gpu < 0:
        raise UsageError(f"--gpu must be 0 or more, not {args.gpu}")
    if args.nic is not None and args.nic < 0:
        raise UsageError(f"--nic must be 0 or more, not {args.nic}")
    from services.runtime.logs import configure_logging

    configure_logging("error")  # stdout carries the result only; the client's close is not news
    payload = {"node": args.node, "kind": args.kind, "gpu": args.gpu, "xid": args.xid, "nic": args.nic}
    result = send_command(args, "sim", "inject", payload)
    print(json.dumps(result) if args.json else fault_text(result))
    return 0


_PARTS = (("nic", "NIC"), ("leaf", "leaf switch"), ("gpu", "GPU"))


def fault_text(result: dict[str, Any]) -> str:
    """What was done to which part of the node, and where to watch the platform react."""
    node, kind = result["node"], result["kind"]
    part = next(
        (f"{name} {result[key]}" for key, name in _PARTS if result.get(key) is not None),
        "",
    )
    if kind == "clear":
        return f"cleared the simulated faults of {node}{' ' + part if part else ''}"
    what = f"XID {result['xid']}" if kind == "xid" and result.get("xid") is not None else kind.replace("_", " ")
    return (
        f"injected {what} on {node}{' ' + part if part else ''}; the agent reports it at its next sample: "
        f"`chamber fleet` shows what health did, `chamber explain JOB` what moved"
    )
