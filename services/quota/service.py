"""`chamber service quota`: pools, team quotas and fair-share factors.

A manifest for the decider host: inputs FLEET, QUOTA and JOBS, the core's `evolve`, and as `decide`
the FairShareUpdated of teams whose factor moved (every `--interval` seconds). Answers `set`,
`pool_set` and `list` (a valid command is appended to QUOTA and answered once folded back), and
writes each team's row to the KV bucket `chamber_quota` (key `<pool>.<team>`) for dashboards.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import msgspec
from nats.js.kv import KeyValue

from events import BudgetSet
from events.codec import stable_id
from events.commands import SetTeamQuota
from events.names import check_event
from events.subjects import token
from services.quota import core
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
from services.runtime.buckets import open_kv
from services.runtime.commands import CommandRefused
from services.runtime.decider import Decider, DeciderHost, Input, SnapshotCodec
from services.runtime.host import ServiceContext, serve
from services.runtime.state_codec import facts_codec

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


def snapshot_codec() -> SnapshotCodec[QuotaState]:
    return facts_codec(QuotaState, version=core.STATE_VERSION)


class QuotaService:
    def __init__(self, half_life_s: float, interval_s: float) -> None:
        self.half_life_s = half_life_s
        self.interval_s = interval_s
        self.host: DeciderHost[QuotaState] | None = None
        self._kv: KeyValue | None = None

    def manifest(self) -> Decider[QuotaState]:
        return Decider(
            name=NAME,
            inputs=(Input("FLEET"), Input("QUOTA"), Input("JOBS")),
            initial=lambda: QuotaState(half_life_s=self.half_life_s),
            evolve=evolve,
            decide=decide,
            tick_s=self.interval_s,
            snapshot=snapshot_codec(),
        )

    @property
    def state(self) -> QuotaState:
        assert self.host is not None
        return self.host.state

    async def _record(self, event: Any, event_id: str) -> None:
        assert self.host is not None
        await self.host.append(event, id=event_id, expected_subject_seq=None)  # answered once folded

    async def _ensure_ready(self, within_s: float = 3.0) -> None:
        """A command right after start waits (briefly) for the log to be read, then is refused."""
        deadline = time.monotonic() + within_s
        while (self.host is None or not self.host.ready) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if self.host is None or not self.host.ready:
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
                np_lend_limit=req.np_lend_limit,
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

    async def write_view(self, now: float) -> None:
        """Each team's row into the KV view, once the state is rebuilt."""
        host = self.host
        if host is None or not host.ready:
            return
        if self._kv is None:
            self._kv = await open_kv(host.ctx.js, KV_BUCKET, history=1)
        for row in rows(self.state, now):
            await self._kv.put(f"{token(row['pool'])}.{token(row['team'])}", msgspec.json.encode(row))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--half-life",
        type=float,
        default=DEFAULT_HALF_LIFE_S,
        help=f"fair-share usage half-life in seconds (default {DEFAULT_HALF_LIFE_S:.0f}, 7 days as in Slurm)",
    )
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between fair-share updates (default 10)")


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    service = QuotaService(args.half_life, args.interval)

    async def setup(ctx: ServiceContext) -> None:
        service.host = DeciderHost(service.manifest(), ctx)
        service.host.install()
        ctx.command("set", SetQuotaRequest, service.set)
        ctx.command("pool_set", PoolSetRequest, service.pool_set)
        ctx.command("list", ListRequest, service.list)
        ctx.every(args.interval, service.write_view)

    await serve(NAME, args.nats, setup, stop)
