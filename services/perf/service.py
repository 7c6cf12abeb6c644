"""`chamber service perf`: the job-performance core's shell.

Reads JOBS and FLEET from the start (placements, labels, its own verdicts: episode numbers survive a
restart) and TELEMETRY samples, fabric samples and inventories from now on; once caught up, decides
every tick and publishes JobSlowdownDetected / Cleared (on `chamber.jobs.<job>.perf`) and `straggler`
faults (on FAULTS, for the health policy), each with a deterministic id. Commands: `status` (what
`chamber perf` shows) and `fabric` (what `chamber fabric` shows).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from nats.js.api import DeliverPolicy

from events.base import Event
from events.commands import JobOnly, NoArguments
from services.health.replay import CatchUp, DeliverFrom
from services.perf import core
from services.perf.views import fabric_view
from services.runtime.commands import CommandRefused
from services.runtime.consumer import ConsumerOptions, Delivery
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import get_logger

NAME = "perf"
DESCRIPTION = "find slow multi-node jobs and the GPU, NIC or leaf switch to blame (JobSlowdownDetected)"
log = get_logger("chamber.perf")
TELEMETRY_SUBJECTS = (
    "chamber.telemetry.sample.>",
    "chamber.telemetry.fabric.>",
    "chamber.telemetry.inventory.>",
    "chamber.telemetry.steps.>",  # per-rank step timings (events/steps.py)
)


Empty = NoArguments  # the request types are defined once, in events/commands.py
ExplainRequest = JobOnly


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between decisions (1)")


class PerfShell:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.state = core.PerfState()
        self.catch_up = CatchUp(ctx.js)
        self.published = 0

    async def on_batch(self, batch: list[Delivery]) -> None:
        for d in batch:
            event = d.envelope.event
            if isinstance(event, Event):
                core.evolve(self.state, event)

    async def tick(self, now: float) -> None:
        if not await self.catch_up.check():
            return
        for event, event_id in core.decide(self.state, now):
            await self.ctx.publisher.publish(event, id=event_id)
            core.evolve(self.state, event)  # folded now: its echo on JOBS changes nothing
            self.published += 1
            log.info("published", type=type(event).ce_type(), id=event_id)

    async def status(self, _: Empty) -> dict[str, Any]:
        return {"jobs": core.verdicts(self.state)}

    async def explain(self, req: ExplainRequest) -> dict[str, Any]:
        return {"job": req.job, "lines": core.explain_lines(self.state, req.job)}

    async def ranks(self, req: ExplainRequest) -> dict[str, Any]:
        heat = core.rank_heat(self.state, req.job)
        if heat is None:
            raise CommandRefused(f"job {req.job!r} is not a running job the perf service tracks", field="job")
        return heat

    async def fabric(self, _: Empty) -> dict[str, Any]:
        return {"nodes": fabric_view(self.state)}


async def setup(ctx: ServiceContext, args: argparse.Namespace) -> PerfShell:
    shell = PerfShell(ctx)
    for stream in ("JOBS", "FLEET"):
        consumer = DeliverFrom(
            ctx.js, ConsumerOptions(stream=stream, durable=None), policy=DeliverPolicy.ALL, batch_handler=shell.on_batch
        )
        shell.catch_up.watch(consumer)
        _add(ctx, consumer)
    telemetry = DeliverFrom(
        ctx.js,
        ConsumerOptions(stream="TELEMETRY", durable=None, filter_subjects=TELEMETRY_SUBJECTS),
        policy=DeliverPolicy.NEW,
        batch_handler=shell.on_batch,
    )
    _add(ctx, telemetry)
    ctx.every(args.tick, shell.tick)
    ctx.command("status", Empty, shell.status)
    ctx.command("fabric", Empty, shell.fabric)
    ctx.command("explain", ExplainRequest, shell.explain)
    ctx.command("ranks", ExplainRequest, shell.ranks)
    return shell


def _add(ctx: ServiceContext, consumer: DeliverFrom) -> None:
    ctx.consumers.append(consumer)
    ctx.task(lambda: consumer.run(ctx.stop))


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    async def _setup(ctx: ServiceContext) -> None:
        await setup(ctx, args)

    await serve(NAME, args.nats, _setup, stop)
