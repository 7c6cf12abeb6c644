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
        help="read NICs under DIR/sys/class/{infiniband,net}, AMD GPUs under DIR/sys/class/{drm,kfd} and the "
        "firmware identity under DIR/sys/class/dmi/id (default /; 'none': none of them, and no simulated fabric "
        "samples)",
    )
    p.add_argument(
        "--vendor",
        choices=["auto", "nvidia", "amd"],
        default="auto",
        help="GPU vendor: auto (AMD when DIR/sys/class/drm shows a GPU with vendor 0x1002, else NVIDIA through "
        "NVML), or force one (default auto)",
    )
    p.add_argument(
        "--amd-nodes",
        type=int,
        default=0,
        metavar="N",
        help="with --simulate: make N of the nodes AMD Instinct nodes (default 0)",
    )
    p.add_argument(
        "--amd-gpu-model", default="MI300X-192GB", help="GPU model of the simulated AMD nodes (default MI300X-192GB)"
    )
    p.add_argument(
        "--nccl-ras",
        action="store_true",
        help="also query NCCL's RAS service on localhost:28028 (STATUS every 5 s, MONITOR for PEER_DEAD)",
    )
    p.add_argument(
        "--step-log",
        action="append",
        default=[],
        metavar="JOB=PATH",
        help="tail a job's JSONL step log (chamber_hooks.StepLog) and publish its per-rank step timings (repeatable)",
    )
    p.add_argument(
        "--step-log-root",
        default="/",
        metavar="DIR|none",
        help="where the host's files are seen, for the step logs jobs name in their `chamber.io/step-log` "
        "annotation (default /; none: do not read them)",
    )
    p.add_argument(
        "--nccl-inspector-dir",
        type=Path,
        metavar="DIR",
        help="read NCCL Inspector's Prometheus textfiles (NCCL_INSPECTOR_DUMP_DIR) into the fabric samples",
    )
    p.add_argument(
        "--nccl-inspector-otlp-port",
        type=int,
        metavar="PORT",
        help="receive NCCL Inspector's OTLP/HTTP JSON metrics on 127.0.0.1:PORT/v1/metrics (Inspector's default 4318)",
    )
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
    amd_model_name = "MI300X-192GB"
    if args.simulate:
        if args.nodes < 1:
            raise UsageError(f"--nodes must be 1 or more, not {args.nodes}")
        if args.gpus_per_node < 1:
            raise UsageError(f"--gpus-per-node must be 1 or more, not {args.gpus_per_node}")
        try:
            model = gpu_model(args.gpu_model).model
        except KeyError as exc:
            raise UsageError(f"--gpu-model: {exc.args[0]}") from None
        amd_nodes = getattr(args, "amd_nodes", 0)
        if not 0 <= amd_nodes <= args.nodes:
            raise UsageError(f"--amd-nodes must be between 0 and --nodes ({args.nodes}), not {amd_nodes}")
        try:
            amd_model = gpu_model(getattr(args, "amd_gpu_model", "MI300X-192GB"))
        except KeyError as exc:
            raise UsageError(f"--amd-gpu-model: {exc.args[0]}") from None
        if amd_model.vendor != "amd":
            raise UsageError(f"--amd-gpu-model {amd_model.model} is not an AMD model (e.g. MI300X-192GB)")
        amd_model_name = amd_model.model
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
        step_logs=_step_logs(getattr(args, "step_log", [])),
        step_log_root=_optional_dir(getattr(args, "step_log_root", "/")),
        inspector_dir=getattr(args, "nccl_inspector_dir", None),
        inspector_otlp_port=getattr(args, "nccl_inspector_otlp_port", None),
        labels=labels,
        vendor=getattr(args, "vendor", "auto"),
        amd_nodes=getattr(args, "amd_nodes", 0) if args.simulate else 0,
        amd_gpu_model=amd_model_name,
    )


def _optional_dir(value: str) -> Path | None:
    return None if value == "none" else Path(value)


def _step_logs(values: list[str]) -> dict[str, Path]:
    from services.cli.errors import UsageError

    out = {}
    for v in values:
        job, sep, path = v.partition("=")
        if not sep or not job or not path:
            raise UsageError(f"--step-log takes JOB=PATH, not {v!r}")
        out[job] = Path(path)
    return out


def run(args: argparse.Namespace) -> int:
    from node_agent.agent import Agent
    from node_agent.amd_adapter import AmdUnavailable
    from node_agent.nvml_adapter import NvmlUnavailable
    from services.runtime import run_until_stopped
    from services.runtime.lifecycle import exit_stopped
    from services.runtime.logs import configure_logging

    configure_logging(args.log_level)
    apply_replicas_option(args)
    opts = options(args)
    try:
        agent = Agent(opts)
    except (NvmlUnavailable, AmdUnavailable) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--spool {opts.spool_dir}: {exc.strerror or exc}; pick a writable directory") from None
    asyncio.run(run_until_stopped(agent.run))
    exit_stopped(0)  # past this point nothing is left to do (see exit_stopped)
