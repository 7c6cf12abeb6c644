"""`chamber service NAME`: run one service. Services are found, not listed: any `services/<name>/`
package with a `service` module (NAME, DESCRIPTION, add_arguments(parser), async run(args, stop))."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import pkgutil
from types import ModuleType

import services
from services.cli.common import (
    add_nats_option,
    add_partitions_option,
    add_replicas_option,
    apply_partitions_option,
    apply_replicas_option,
)

_FOCUS: dict[str, list[str]] = {}  # "names": the services to register; absent: every one (see `focus`)


def focus(names: list[str]) -> None:
    """Register just these services ([] for none): a process runs at most one, and importing every
    service's module (the recorder's Arrow and pandas among them) would cost each process its memory."""
    _FOCUS["names"] = list(names)


def discover(wanted: list[str] | None = None) -> dict[str, ModuleType]:
    """Every service's module by name (or only those `wanted`, when they all exist)."""
    found: dict[str, ModuleType] = {}
    names = [i.name for i in pkgutil.iter_modules(services.__path__) if i.ispkg and i.name not in ("cli", "runtime")]
    if wanted is not None and set(wanted) <= set(names):
        names = wanted  # an unknown name falls through to all, so argparse lists the choices
    for name in names:
        try:
            module = importlib.import_module(f"services.{name}.service")
        except ModuleNotFoundError as exc:
            if exc.name != f"services.{name}.service":
                raise
            continue
        if not hasattr(module, "run"):
            continue  # a decider hosted in another service's process (idle runs inside perf's)
        found[getattr(module, "NAME", name)] = module
    return dict(sorted(found.items()))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("service", help="run one Chamber service in the foreground")
    services_sub = p.add_subparsers(dest="service", metavar="NAME", required=True)
    for name, module in discover(_FOCUS.get("names")).items():
        sp = services_sub.add_parser(name, help=getattr(module, "DESCRIPTION", ""))
        add_nats_option(sp)
        add_replicas_option(sp)
        add_partitions_option(sp)
        sp.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
        sp.add_argument(
            "--health-port",
            type=int,
            metavar="PORT",
            help="serve /livez and /readyz on this port (default: $CHAMBER_HEALTH_PORT, else none)",
        )
        if hasattr(module, "add_arguments"):
            module.add_arguments(sp)
        sp.set_defaults(func=run, module=module)


def run(args: argparse.Namespace) -> int:
    from services.runtime import run_until_stopped
    from services.runtime.lifecycle import exit_stopped
    from services.runtime.logs import configure_logging

    configure_logging(args.log_level)
    apply_replicas_option(args)
    apply_partitions_option(args)
    if args.health_port is not None:  # the host reads it from the environment (services never see it)
        os.environ["CHAMBER_HEALTH_PORT"] = str(args.health_port)
    asyncio.run(run_until_stopped(lambda stop: args.module.run(args, stop)))
    exit_stopped(0)  # past this point nothing is left to do (see exit_stopped)
