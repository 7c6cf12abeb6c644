"""`chamber service quota`: pools, team quotas and fair-share factors.

Replays QUOTA, JOBS and FLEET from the start on every start; answers `set`, `pool_set` and `list`
commands (a valid command is recorded as an event on QUOTA); every `--interval` seconds publishes
FairShareUpdated for teams whose factor moved, and writes each team's row to the KV bucket
`chamber_quota` (key `<pool>.<team>`) for dashboards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from typing import Any

import msgspec
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from events import BudgetSet
from events.codec import stable_id
from events.commands import SetTeamQuota
from events.names import check_event
from events.subjects import token
from services.quota.core import (
    DEFAULT_HALF_LIFE_S,
    QuotaRefused,
    QuotaState,
    decide,
    define_pool,
    evolve,
    rows,
    set_quota,
)
from services.runtime import ConsumerOptions, Delivery
from services.runtime.commands import CommandRefused
from services.runtime.host import ServiceContext, serve
from services.runtime.replicas import replicas_for
from services.scheduler.replay import caught_up

NAME = "quota"
DESCRIPTION = "pools, team quotas (guarantee, borrow and lend limits) and decayed fair share"
KV_BUCKET = "chamber_quota"


SetQuotaRequest = SetTeamQuota  # shared with the gateway and the API documents (events/commands.py)


class PoolSetRequest(msgspec.Struct, kw_only=True):
    name: str
    gpu_model: str | None = None
    node_label: str | None = None


class ListRequest(msgspec.Struct, kw_only=True):
    pass


class QuotaService:
    def __init__(self, half_life_s: float) -> None:
        self.state = QuotaState(half_life_s=half_life_s)
        self.ctx: ServiceContext | None = None
        self.ready = False
        self._kv: KeyValue | None = None

    async def on_event(self, delivery: Delivery) -> None:
        evolve(self.state, delivery.envelope.event)  # type: ignore[arg-type]

    async def _record(self, event: Any, event_id: str) -> None:
        assert self.ctx is not None
        await self.ctx.publisher.publish(event, id=event_id)
        evolve(self.state, event)  # setting a quota is idempotent: the echo changes nothing

    async def _ensure_ready(self) -> None:
        if not self.ready:
            assert self.ctx is not None
            self.ready = await caught_up(self.ctx.js, self.ctx.consumers)
        if not self.ready:
            raise CommandRefused("the quota service is still reading its log; try again in a moment")

    async def set(self, req: SetQuotaRequest) -> dict[str, Any]:
        await self._ensure_ready()
        gpus = req.gpus if req.gpus is not None else req.guaranteed_gpus
        if gpus is None:
            raise CommandRefused("how many guaranteed GPUs? pass --gpus N", field="gpus")
        if req.guaranteed_gpus is not None and req.gpus is not None and req.gpus != req.guaranteed_gpus:
            raise CommandRefused("gpus and guaranteed_gpus differ; give one of them", field="gpus")
        try:
            event = set_quota(
                self.state,
                team=req.team,
                pool=req.pool,
                gpus=gpus,
                borrow_limit=req.borrow_limit,
                lend_limit=req.lend_limit,
                weight=req.weight,
                at=time.time(),
                critical=req.critical,
            )
        except QuotaRefused as exc:
            raise CommandRefused(str(exc), field=exc.field) from None
        if req.budget is not None and req.budget < 0:
            raise CommandRefused(f"budget must be 0 or more, got {req.budget:g}", field="budget")
        check_event(event)  # what the consumers' decoders will say, said now (InvalidName: refused)
        await self._record(event, stable_id("quota", req.pool, req.team, event.at))
        result: dict[str, Any] = {
            "team": event.team,
            "pool": event.pool,
            "guaranteed": event.guaranteed_gpus,
            "critical": event.critical,
        }
        if req.budget is not None:
            budget = BudgetSet(
                team=req.team,
                at=event.at,
                amount=req.budget,
                currency=req.currency,
                period=req.period,
                on_budget=req.on_budget,
            )
            check_event(budget)
            await self._record(budget, stable_id("budget", req.team, event.at))
            result["budget"] = req.budget
            result["on_budget"] = req.on_budget.value
        return result

    async def pool_set(self, req: PoolSetRequest) -> dict[str, Any]:
        await self._ensure_ready()
        try:
            event = define_pool(
                self.state, name=req.name, gpu_model=req.gpu_model, node_label=req.node_label, at=time.time()
            )
        except QuotaRefused as exc:
            raise CommandRefused(str(exc), field=exc.field) from None
        await self._record(event, stable_id("pool", req.name, event.at))
        return {"pool": event.pool, "gpu_model": event.gpu_model, "node_selector": event.node_selector}

    async def list(self, _: ListRequest) -> dict[str, Any]:
        return {"teams": rows(self.state, time.time())}

    async def tick(self, now: float) -> None:
        ctx = self.ctx
        assert ctx is not None
        if not self.ready:
            self.ready = await caught_up(ctx.js, ctx.consumers)
            if not self.ready:
                return
        for event, event_id in decide(self.state, now):
            await ctx.publisher.publish(event, id=event_id)
            evolve(self.state, event)
        kv = await self._bucket()
        for row in rows(self.state, now):
            await kv.put(f"{token(row['pool'])}.{token(row['team'])}", msgspec.json.encode(row))

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            assert self.ctx is not None
            try:
                self._kv = await self.ctx.js.key_value(KV_BUCKET)
            except BucketNotFoundError:
                with contextlib.suppress(Exception):
                    await self.ctx.js.create_key_value(bucket=KV_BUCKET, history=1, replicas=replicas_for(self.ctx.js))
                self._kv = await self.ctx.js.key_value(KV_BUCKET)
        return self._kv


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--half-life",
        type=float,
        default=DEFAULT_HALF_LIFE_S,
        help=f"fair-share usage half-life in seconds (default {DEFAULT_HALF_LIFE_S:.0f}, 7 days as in Slurm)",
    )
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between fair-share updates (default 10)")


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    service = QuotaService(args.half_life)

    async def setup(ctx: ServiceContext) -> None:
        service.ctx = ctx
        for stream in ("FLEET", "QUOTA", "JOBS"):
            ctx.consume(ConsumerOptions(stream=stream, durable=None), handler=service.on_event)
        ctx.command("set", SetQuotaRequest, service.set)
        ctx.command("pool_set", PoolSetRequest, service.pool_set)
        ctx.command("list", ListRequest, service.list)
        ctx.every(args.interval, service.tick)

    await serve(NAME, args.nats, setup, stop)
