"""`chamber service perf`: the job-performance core on the decider host (services/runtime/decider.py).

Folds JOBS, FLEET and FAULTS from the start (placements, labels, its own verdicts and straggler
reports: episode numbers survive a restart) and TELEMETRY samples, fabric samples and inventories
from now on (the host's "new" input mode: a rate is measured on fresh samples, so no telemetry is
replayed). Once caught up it decides every tick and publishes JobSlowdownDetected / Cleared (on
`chamber.jobs.<job>.perf`) and `straggler` faults (on FAULTS, for the health policy), each with a
deterministic id; like every decider it folds them only when they come back from the log.
Commands: `status` (what `chamber perf` shows), `fabric` (`chamber fabric`), `explain`, `ranks`.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from events.base import Event
from events.commands import JobOnly, NoArguments
from services.idle import service as idle
from services.perf import core
from services.perf.views import fabric_view
from services.runtime.commands import Command, CommandRefused
from services.runtime.decider import Decider, DeciderHost, Input
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import get_logger
from services.runtime.manifest import Manifest
from services.runtime.partitions import telemetry_inputs

NAME = "perf"
DESCRIPTION = "find slow multi-node jobs and the GPU, NIC or leaf switch to blame (JobSlowdownDetected)"
log = get_logger("chamber.perf")

ROLE = Manifest(
    reads=tuple(dict.fromkeys(("JOBS", "FLEET", "FAULTS", "TELEMETRY", *idle.READS))),
    publishes=("chamber.jobs.*.perf", "chamber.faults.{cluster}.*", *idle.PUBLISHES),
    why="flags slow multi-node jobs (chamber.jobs.<job>.perf), fabric faults it infers, and idle jobs (idle reclaim)",
)


Empty = NoArguments  # the request types are defined once, in events/commands.py
ExplainRequest = JobOnly


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between decisions (1)")


def decide(state: core.PerfState, now: float) -> list[tuple[Event, str]]:
    out = core.decide(state, now)
    for event, event_id in out:
        log.info("verdict", type=type(event).ce_type(), id=event_id)
    return out


def manifest(args: argparse.Namespace, telemetry: list[tuple[str, str]]) -> Decider[core.PerfState]:
    live = tuple(Input(stream, (subject,), deliver="new") for stream, subject in telemetry)
    return Decider(
        name=NAME,
        inputs=(Input("JOBS"), Input("FLEET"), Input("FAULTS"), *live),
        initial=core.PerfState,
        evolve=core.evolve,
        decide=decide,
        tick_s=args.tick,
        commands=COMMANDS,
    )


# -- commands: reads of the folded state, served by the host ------------------------------------


def answer_status(state: core.PerfState, _: Empty, now: float) -> dict[str, Any]:
    return {"jobs": core.verdicts(state)}


def answer_explain(state: core.PerfState, req: ExplainRequest, now: float) -> dict[str, Any]:
    return {"job": req.job, "lines": core.explain_lines(state, req.job)}


def answer_ranks(state: core.PerfState, req: ExplainRequest, now: float) -> dict[str, Any]:
    heat = core.rank_heat(state, req.job)
    if heat is None:
        raise CommandRefused(f"job {req.job!r} is not a running job the perf service tracks", field="job")
    return heat


def answer_fabric(state: core.PerfState, _: Empty, now: float) -> dict[str, Any]:
    return {"nodes": fabric_view(state)}


COMMANDS: tuple[Command[core.PerfState, Any], ...] = (
    Command("status", Empty, answer=answer_status),
    Command("fabric", Empty, answer=answer_fabric),
    Command("explain", ExplainRequest, answer=answer_explain),
    Command("ranks", ExplainRequest, answer=answer_ranks),
)


async def setup(ctx: ServiceContext, args: argparse.Namespace) -> DeciderHost[core.PerfState]:
    telemetry = await telemetry_inputs(ctx.js)
    host = DeciderHost(manifest(args, telemetry), ctx)
    host.install()
    idle.install(ctx, telemetry, args.tick)  # idle reclaim folds the same telemetry (services/idle/service.py)
    return host


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    async def _setup(ctx: ServiceContext) -> None:
        await setup(ctx, args)

    await serve(NAME, args.nats, _setup, stop)
