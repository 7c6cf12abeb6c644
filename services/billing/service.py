"""`chamber service billing`: replay JOBS, FLEET, QUOTA and BILLING into the core, accrue each closed
period, publish CostAccrued / BudgetExceeded, and answer `chamber billing price set MODEL RATE`."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import msgspec

from events import Event, PriceSet
from services.billing.core import BillingState, decide, evolve
from services.runtime import Consumer, ConsumerOptions, Delivery
from services.runtime.commands import CommandRefused
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import get_logger

NAME = "billing"
DESCRIPTION = "accrue GPU-hour cost per team and job, idle cost per pool, and budgets exceeded"
STREAMS = ("JOBS", "FLEET", "QUOTA", "BILLING")
log = get_logger("chamber.billing")


class SetPrice(msgspec.Struct):
    """One of gpu_model, instance_type or cluster names what is priced (per GPU-hour)."""

    price_per_gpu_hour: float
    gpu_model: str = ""
    currency: str = "USD"
    instance_type: str | None = None
    cluster: str | None = None


def parse_prices(values: list[str]) -> dict[str, float]:
    prices = {}
    for value in values:
        model, sep, rate = value.partition("=")
        try:
            prices[model.strip()] = float(rate)
        except ValueError:
            sep = ""
        if not sep or not model.strip() or prices.get(model.strip(), -1) < 0:
            raise SystemExit(f"--price {value!r}: expected MODEL=RATE with RATE >= 0, e.g. --price H100-80GB=3.50")
    return prices


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--period",
        type=float,
        default=float(os.environ.get("CHAMBER_BILLING_PERIOD", 300.0)),
        help="accrual period in seconds (default: $CHAMBER_BILLING_PERIOD or 300)",
    )
    parser.add_argument("--settle", type=float, default=30.0, help="wait this long after a period ends (30)")
    parser.add_argument("--tick", type=float, default=5.0, help="seconds between accrual checks (5)")
    parser.add_argument(
        "--price", action="append", default=[], metavar="MODEL=RATE", help="price per GPU-hour (repeatable)"
    )


class Billing:
    def __init__(self, state: BillingState, configured_prices: dict[str, float]) -> None:
        self.state = state
        self.configured_prices = configured_prices
        self.caught_up = False
        self.consumers: list[Consumer] = []

    async def on_event(self, delivery: Delivery) -> None:
        evolve(self.state, delivery.envelope.event, delivery.envelope.id)  # type: ignore[arg-type]

    async def replayed(self, ctx: ServiceContext) -> bool:
        """True once every input stream was read to its end (decisions need the whole history)."""
        if self.caught_up:
            return True
        for consumer in self.consumers:
            if not consumer.name:  # not created on the server yet (the first tick can come first)
                return False
            info = await ctx.js.consumer_info(consumer.options.stream, consumer.name)
            if info.num_pending or info.num_ack_pending:
                return False
        self.caught_up = True
        for model, rate in sorted(self.configured_prices.items()):
            if self.state.prices.get(model) != rate:
                await self.publish(ctx, PriceSet(gpu_model=model, at=time.time(), price_per_gpu_hour=rate), None)
        return True

    async def publish(self, ctx: ServiceContext, event: Event, event_id: str | None) -> None:
        ack = await ctx.publisher.publish(event, id=event_id)
        evolve(self.state, event, event_id or "")
        log.info("published", type=type(event).ce_type(), seq=ack.seq)

    async def tick(self, ctx: ServiceContext, now: float) -> None:
        if not await self.replayed(ctx):
            return
        for event, event_id in decide(self.state, now):
            await self.publish(ctx, event, event_id)


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    billing = Billing(BillingState(period_s=args.period, settle_s=args.settle), parse_prices(args.price))

    async def set_price(request: SetPrice) -> dict[str, Any]:
        if request.price_per_gpu_hour < 0 or request.price_per_gpu_hour != request.price_per_gpu_hour:
            raise CommandRefused("the price must be 0 or more per GPU-hour", field="price_per_gpu_hour")
        named = [(k, v.strip()) for k, v in (("gpu_model", request.gpu_model), ("instance_type", request.instance_type),
                                              ("cluster", request.cluster)) if v and v.strip()]  # fmt: skip
        if len(named) != 1:
            raise CommandRefused(
                "name exactly one of gpu_model (e.g. H100-80GB), instance_type (e.g. p5.48xlarge) or cluster",
                field="gpu_model",
            )
        [(scope, name)] = named
        event = PriceSet(
            gpu_model=name if scope == "gpu_model" else "",
            at=time.time(),
            price_per_gpu_hour=request.price_per_gpu_hour,
            currency=request.currency,
            instance_type=name if scope == "instance_type" else None,
            cluster=name if scope == "cluster" else None,
        )
        await billing.publish(ctx_ref[0], event, None)
        return {scope: name, "price_per_gpu_hour": event.price_per_gpu_hour, "at": event.at}

    ctx_ref: list[ServiceContext] = []

    async def setup(ctx: ServiceContext) -> None:
        ctx_ref.append(ctx)
        for stream in STREAMS:
            # Ephemeral consumers from the start: the state is derived from the whole history.
            consumer = ctx.consume(ConsumerOptions(stream=stream, durable=None), handler=billing.on_event)
            billing.consumers.append(consumer)
        ctx.every(args.tick, lambda now: billing.tick(ctx, now))
        ctx.command("price", SetPrice, set_price)

    await serve(NAME, args.nats, setup, stop)
