"""`chamber service quota`: pools, team quotas and fair-share factors.

A manifest for the decider host: inputs FLEET, QUOTA and JOBS, the core's `evolve`, and as `decide`
the FairShareUpdated of teams whose factor moved (every `--interval` seconds). Answers `set`,
`patch`, `pool_set`, `pool_delete` and `list` (pure validations and reads, served by the host: a valid command is
appended to QUOTA and answered once folded back; a change of a team's quota carries the team's last
sequence, so of two concurrent changes one wins and the other is told the quota changed), and
writes each team's row to the KV bucket `chamber_quota` (key `<pool>.<team>`) for dashboards.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import msgspec
from nats.js.kv import KeyValue

from events import BudgetAction, BudgetSet, subjects
from events.codec import stable_id
from events.commands import PatchTeamQuota, SetTeamQuota
from events.names import check_event
from events.subjects import token
from services.quota import core
from services.quota.core import (
    DEFAULT_HALF_LIFE_S,
    QuotaRefused,
    QuotaState,
    changes,
    decide,
    define_pool,
    evolve,
    over_commitment,
    patched,
    pool_rows,
    remove_pool,
    rows,
    set_quota,
    settings_of,
)
from services.runtime.buckets import open_kv
from services.runtime.commands import Accepted, Append, Command, CommandRefused
from services.runtime.decider import Decider, DeciderHost, Input, SnapshotCodec
from services.runtime.host import ServiceContext, serve
from services.runtime.manifest import Manifest
from services.runtime.state_codec import facts_codec

NAME = "quota"
DESCRIPTION = "pools, team quotas (guarantee, borrow and lend limits) and decayed fair share"
KV_BUCKET = "chamber_quota"

ROLE = Manifest(
    reads=("FLEET", "QUOTA", "JOBS"),
    publishes=("chamber.quota.>",),
    buckets=(KV_BUCKET,),
    snapshots=True,
    why="owns pools, team quotas and fair share (QUOTA) and the quota rows bucket",
)


SetQuotaRequest = SetTeamQuota  # shared with the gateway and the API documents (events/commands.py)


class PoolSetRequest(msgspec.Struct, kw_only=True):
    name: str
    gpu_model: str | None = None
    node_label: str | None = None


class PoolDeleteRequest(msgspec.Struct, kw_only=True):
    name: str


class ListRequest(msgspec.Struct, kw_only=True):
    pass


def snapshot_codec() -> SnapshotCodec[QuotaState]:
    return facts_codec(QuotaState, version=core.STATE_VERSION, caches=("use_milli",), rebuild=QuotaState.rebuild_use)


def _team_subject(_: QuotaState, req: SetTeamQuota | PatchTeamQuota) -> tuple[str, str]:
    """A quota change acts on the team's subject (its quotas in every pool, its budget)."""
    return "QUOTA", subjects.quota(req.team)


def _changed(req: SetTeamQuota | PatchTeamQuota) -> str:
    return f"quota of team {req.team} changed since you read it (seq {req.expected_seq}); re-read and retry"


def validate_set(state: QuotaState, req: SetTeamQuota, now: float) -> Accepted:
    """Replace the team's quota in the pool: fields left out take their defaults."""
    if req.gpus is None and req.guaranteed_gpus is None:
        raise CommandRefused("how many guaranteed GPUs? pass --gpus N", field="gpus")
    if req.guaranteed_gpus is not None and req.gpus is not None and req.gpus != req.guaranteed_gpus:
        raise CommandRefused("gpus and guaranteed_gpus differ; give one of them", field="gpus")
    given: dict[str, Any] = {
        "gpus": req.gpus if req.gpus is not None else req.guaranteed_gpus,
        "borrow_limit": req.borrow_limit,
        "lend_limit": req.lend_limit,
        "np_lend_limit": req.np_lend_limit,
        "weight": req.weight,
        "critical": req.critical,
    }
    budget = None
    if req.budget is not None:
        budget = {"amount": req.budget, "currency": req.currency, "period": req.period, "on_budget": req.on_budget}
    return _quota_change(state, req, given, budget, now, replace=True)


def validate_patch(state: QuotaState, req: PatchTeamQuota, now: float) -> Accepted:
    """Change only the fields the request names; the others keep their current values."""
    given = req.given()
    budget_fields = {k: given.pop(k) for k in ("budget", "currency", "period", "on_budget") if k in given}
    budget = None
    if budget_fields:
        current = state.budgets.get(req.team)
        if "budget" not in budget_fields and current is None:
            raise CommandRefused(f"team {req.team} has no budget to change: pass --budget AMOUNT", field="on_budget")
        budget = {
            "amount": budget_fields.get("budget", current.amount if current else 0.0),
            "currency": budget_fields.get("currency", current.currency if current else "USD"),
            "period": budget_fields.get("period", current.period if current else "month"),
            "on_budget": budget_fields.get("on_budget", current.on_budget if current else BudgetAction.NOTIFY),
        }
    return _quota_change(state, req, given, budget, now, replace=False)


def _quota_change(
    state: QuotaState,
    req: SetTeamQuota | PatchTeamQuota,
    given: dict[str, Any],
    budget: dict[str, Any] | None,
    now: float,
    *,
    replace: bool,
) -> Accepted:
    """Record the quota the command leaves (and the budget, if it names one); answer with every
    setting before and after, and a warning when the pool's guarantees exceed what is installed.
    Carries the team's sequence as read: of two concurrent changes of one team, one wins."""
    team, pool = req.team, req.pool
    before = settings_of(state, pool, team)
    try:
        after = patched(before, given, replace=replace)
        event = set_quota(
            state,
            team=team,
            pool=pool,
            gpus=after["gpus"],
            borrow_limit=after["borrow_limit"],
            lend_limit=after["lend_limit"],
            weight=after["weight"],
            at=now,
            critical=after["critical"],
            np_lend_limit=after["np_lend_limit"],
        )
    except QuotaRefused as exc:
        raise CommandRefused(str(exc), field=exc.field) from None
    check_event(event)  # what the consumers' decoders will say, said now (InvalidName: refused)
    appends = [Append(event, stable_id("quota", pool, event.team, event.at), req.expected_seq)]
    if budget is not None:
        record = BudgetSet(team=event.team, at=event.at, **budget)
        check_event(record)
        appends.append(Append(record, stable_id("budget", event.team, event.at)))
    result: dict[str, Any] = {
        "team": event.team,
        "pool": event.pool,
        "guaranteed": event.guaranteed_gpus,
        "critical": event.critical,
        "replaced": replace,
        "new": before is None,
        "settings": after,
        "changes": changes(before, after),
        "installed": state.pool_installed(pool),
        "warnings": [w for w in (over_commitment(state, pool, event.team, event.guaranteed_gpus),) if w],
    }
    result.update(_budget_answer(state.budgets.get(event.team), budget))
    return Accepted(tuple(appends), result)


def _budget_answer(before: Any, budget: dict[str, Any] | None) -> dict[str, Any]:
    """The team's budget after the change, and whether this change moved it."""
    if budget is not None:
        current: dict[str, Any] = budget
    elif before is not None:
        current = {"amount": before.amount, "on_budget": before.on_budget, "currency": before.currency}
    else:
        return {}
    return {
        "budget": current["amount"],
        "on_budget": BudgetAction(str(current["on_budget"])).value,
        "currency": current["currency"],
        "budget_changed": budget is not None
        and (before is None or (before.amount, before.on_budget) != (budget["amount"], budget["on_budget"])),
    }


def validate_pool_set(state: QuotaState, req: PoolSetRequest, now: float) -> Accepted:
    try:
        event = define_pool(state, name=req.name, gpu_model=req.gpu_model, node_label=req.node_label, at=now)
    except QuotaRefused as exc:
        raise CommandRefused(str(exc), field=exc.field) from None
    result = {"pool": event.pool, "gpu_model": event.gpu_model, "node_selector": event.node_selector}
    return Accepted((Append(event, stable_id("pool", req.name, event.at)),), result)


def validate_pool_delete(state: QuotaState, req: PoolDeleteRequest, now: float) -> Accepted:
    try:
        event = remove_pool(state, name=req.name, at=now)
    except QuotaRefused as exc:
        raise CommandRefused(str(exc), field=exc.field) from None
    return Accepted(
        (Append(event, stable_id("pool-removed", req.name, event.at)),), {"pool": event.pool, "removed": True}
    )


def answer_list(state: QuotaState, _: ListRequest, now: float) -> dict[str, Any]:
    return {"teams": rows(state, now), "pools": pool_rows(state)}


COMMANDS: tuple[Command[QuotaState, Any], ...] = (
    Command(
        "set", SetQuotaRequest, validate=validate_set, entity=_team_subject, conflict=_changed, conflict_field="team"
    ),
    Command(
        "patch", PatchTeamQuota, validate=validate_patch, entity=_team_subject, conflict=_changed, conflict_field="team"
    ),
    Command("pool_set", PoolSetRequest, validate=validate_pool_set),
    Command("pool_delete", PoolDeleteRequest, validate=validate_pool_delete),
    Command("list", ListRequest, answer=answer_list),
)


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
            commands=COMMANDS,
        )

    @property
    def state(self) -> QuotaState:
        assert self.host is not None
        return self.host.state

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
        ctx.every(args.interval, service.write_view)

    await serve(NAME, args.nats, setup, stop)
