"""`chamber agent`: the per-node agent (NVML), or a whole simulated fleet in one process (--simulate)."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from services.cli.common import (
    add_cluster_option,
    add_nats_option,
    add_replicas_option,
    apply_replicas_option,
    finite_float,
)
from services.cli.errors import UsageError

if TYPE_CHECKING:  # imported lazily at run time: `chamber --help` stays fast
    from node_agent.agent import AgentOptions


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("agent", help="run the node agent (NVML sampling, or --simulate a fleet)")
    add_nats_option(p)
    add_replicas_option(p)
    add_cluster_option(p)
    p.add_argument("--node", help="this node's name (default: the hostname; with --simulate, the name prefix 'sim')")
    p.add_argument(
        "--interval", type=finite_float, default=1.0, metavar="SECONDS", help="seconds between samples (default 1)"
    )
    p.add_argument(
        "--spool",
        type=Path,
        default=Path(os.environ.get("CHAMBER_AGENT_SPOOL", ".chamber/agent-spool")),
        metavar="DIR",
        help="where samples wait while NATS is unreachable (default: $CHAMBER_AGENT_SPOOL or .chamber/agent-spool)",
    )
    p.add_argument("--spool-max-mb", type=finite_float, default=256.0, help="spool size limit in MiB (default 256)")
    p.add_argument("--simulate", action="store_true", help="simulate a fleet of GPU nodes instead of reading NVML")
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per simulated node (default 8)")
    p.add_argument("--gpu-model", default="H100-80GB", help="simulated GPU model (default H100-80GB)")
    p.add_argument("--seed", type=int, default=1, help="simulation seed (default 1)")
    p.add_argument(
        "--health-port",
        type=int,
        metavar="PORT",
        help="serve /livez and /readyz on this port (default: $CHAMBER_HEALTH_PORT; unset: none; 0: any free port)",
    )
    p.add_argument(
        "--sysfs-root",
        default="/",
        metavar="DIR",
        help="read NICs under DIR/sys/class/{infiniband,net} and the firmware identity under DIR/sys/class/dmi/id "
        "(default /; 'none': neither, and no simulated fabric samples)",
    )
    p.add_argument("--nccl-ras", action="store_true", help="also read NCCL's RAS service on localhost:28028")
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="topology label, e.g. leaf=leaf-3 (repeatable)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run)


def options(args: argparse.Namespace) -> AgentOptions:
    from node_agent.agent import AgentOptions
    from node_agent.sim.models import gpu_model

    if args.interval <= 0:
        raise UsageError(f"--interval must be more than 0 seconds, not {args.interval:g}")
    if args.spool_max_mb <= 0:
        raise UsageError("--spool-max-mb must be more than 0")
    health_port = getattr(args, "health_port", None)
    if health_port is None:
        from services.runtime.health import port_from_env

        try:
            health_port = port_from_env()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    elif not 0 <= health_port <= 65535:
        raise UsageError(f"--health-port must be a port number (0-65535), not {health_port}")
    if args.simulate:
        if args.nodes < 1:
            raise UsageError(f"--nodes must be 1 or more, not {args.nodes}")
        if args.gpus_per_node < 1:
            raise UsageError(f"--gpus-per-node must be 1 or more, not {args.gpus_per_node}")
        try:
            model = gpu_model(args.gpu_model).model
        except KeyError as exc:
            raise UsageError(f"--gpu-model: {exc.args[0]}") from None
    else:
        model = args.gpu_model
    labels = {}
    for item in getattr(args, "label", []):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--label {item!r}: expected KEY=VALUE, e.g. --label leaf=leaf-3")
        labels[key.strip()] = value.strip()
    root = getattr(args, "sysfs_root", "/")
    return AgentOptions(
        nats=args.nats,
        cluster=args.cluster,
        node=args.node or ("sim" if args.simulate else socket.gethostname()),
        interval_s=args.interval,
        spool_dir=args.spool,
        spool_max_bytes=int(args.spool_max_mb * 1024 * 1024),
        simulate=args.simulate,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_model=model,
        seed=args.seed,
        health_port=health_port,
        sysfs_root=None if root == "none" else Path(root),
        nccl_ras=getattr(args, "nccl_ras", False),
        labels=labels,
    )


def run(args: argparse.Namespace) -> int:
    from node_agent.agent import Agent
    from node_agent.nvml_adapter import NvmlUnavailable
    from services.runtime import run_until_stopped
    from services.runtime.logs import configure_logging

    configure_logging(args.log_level)
    apply_replicas_option(args)
    opts = options(args)
    try:
        agent = Agent(opts)
    except NvmlUnavailable as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--spool {opts.spool_dir}: {exc.strerror or exc}; pick a writable directory") from None
    asyncio.run(run_until_stopped(agent.run))
    return 0
