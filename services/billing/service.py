"""`chamber service billing`: a manifest for the decider host. Inputs JOBS, FLEET, QUOTA and BILLING;
`decide` accrues each closed period (CostAccrued / BudgetExceeded) and sets the `--price`s the
process was started with when the log has others; answers `chamber billing price set MODEL RATE`
(a pure validation served by the host; a change carries the prices' last sequence, so of two
concurrent changes one wins and the other is told the prices changed), `chamber billing price list`
(`prices`), `reclaimed` (GPU-hours idle reclaim gave back per team), `tokens` (a serving workload's
tokens, recorded as ServingTokensReported) and `serving` (cost per serving workload and per million
tokens)."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Annotated, Any

import msgspec

from events import Event, PriceSet, ServingTokensReported, subjects
from events.codec import stable_id
from events.commands import ExpectedSeq
from services.billing import core
from services.billing.core import BillingState, decide, evolve
from services.billing.idle import by_team as reclaimed_by_team
from services.billing.serving import by_workload, find
from services.runtime.commands import Accepted, Append, Command, CommandRefused
from services.runtime.decider import Decider, DeciderHost, Input, SnapshotCodec
from services.runtime.host import ServiceContext, serve
from services.runtime.logs import get_logger
from services.runtime.manifest import Manifest
from services.runtime.state_codec import facts_codec

NAME = "billing"
DESCRIPTION = "accrue GPU-hour cost per team and job, idle cost per pool, and budgets exceeded"
STREAMS = ("JOBS", "FLEET", "QUOTA", "BILLING")
log = get_logger("chamber.billing")

ROLE = Manifest(
    reads=STREAMS,
    publishes=("chamber.billing.>",),
    snapshots=True,
    why="owns prices, accrued cost and budgets (BILLING)",
)


class ListPrices(msgspec.Struct):
    pass


class SetPrice(msgspec.Struct):
    """One of gpu_model, instance_type or cluster names what is priced (per GPU-hour)."""

    price_per_gpu_hour: float
    gpu_model: str = ""
    currency: str = "USD"
    instance_type: str | None = None
    cluster: str | None = None
    expected_seq: ExpectedSeq | None = None  # the prices' sequence as read (`seq` of the last change's answer)


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


def snapshot_codec() -> SnapshotCodec[BillingState]:
    return facts_codec(BillingState, version=core.STATE_VERSION)


class Billing:
    def __init__(self, period_s: float, settle_s: float, tick_s: float, configured_prices: dict[str, float]) -> None:
        self.period_s, self.settle_s, self.tick_s = period_s, settle_s, tick_s
        self.configured_prices = configured_prices
        self.host: DeciderHost[BillingState] | None = None

    def manifest(self) -> Decider[BillingState]:
        return Decider(
            name=NAME,
            inputs=tuple(Input(stream) for stream in STREAMS),
            initial=lambda: BillingState(period_s=self.period_s, settle_s=self.settle_s),
            evolve=evolve,
            evolve_with_id=True,  # the core de-duplicates by event id
            decide=self.decide,
            tick_s=self.tick_s,
            snapshot=snapshot_codec(),
            commands=COMMANDS,
        )

    def decide(self, state: BillingState, now: float) -> list[tuple[Event, str]]:
        """The configured prices the log does not have yet; else the core's accruals."""
        out: list[tuple[Event, str]] = [
            (PriceSet(gpu_model=model, at=now, price_per_gpu_hour=rate), stable_id("price", model, rate, now))
            for model, rate in sorted(self.configured_prices.items())
            if state.prices.get(model) != rate
        ]
        self.configured_prices = {}  # once: a later `price set` command wins over the flag
        if out:  # costs wait for the next cycle, when these prices have come back from the log
            return out
        return decide(state, now)


def _price_subject(_: BillingState, request: SetPrice) -> tuple[str, str]:
    """Prices are fleet-wide settings on one subject: a price change carries its last sequence."""
    return "BILLING", subjects.billing(None)


def _prices_changed(request: SetPrice) -> str:
    return f"prices changed since you read them (seq {request.expected_seq}); re-read and retry"


def validate_price(state: BillingState, request: SetPrice, now: float) -> Accepted:
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
        at=now,
        price_per_gpu_hour=request.price_per_gpu_hour,
        currency=request.currency,
        instance_type=name if scope == "instance_type" else None,
        cluster=name if scope == "cluster" else None,
    )
    append = Append(event, stable_id("price", scope, name, event.price_per_gpu_hour, now), request.expected_seq)
    return Accepted((append,), {scope: name, "price_per_gpu_hour": event.price_per_gpu_hour, "at": event.at})


def answer_prices(state: BillingState, _: ListPrices, now: float) -> dict[str, Any]:
    """The prices in force by what they price, and the fleet's GPU models that have none."""
    models = sorted(set(state.gpu_model.values()))
    return {
        "currency": state.currency,
        "gpu_model": dict(sorted(state.prices.items())),
        "instance_type": dict(sorted(state.instance_prices.items())),
        "cluster": dict(sorted(state.cluster_prices.items())),
        "unpriced_models": [m for m in models if m not in state.prices],
    }


class ReclaimedRequest(msgspec.Struct, forbid_unknown_fields=True):
    month: Annotated[str, msgspec.Meta(pattern=r"^\d{4}-\d{2}$")] | None = None  # YYYY-MM; none: ever


def answer_reclaimed(state: BillingState, req: ReclaimedRequest, now: float) -> dict[str, Any]:
    """GPU-hours idle reclaim gave back per team (services/billing/idle.py)."""
    return {"month": req.month, "gpu_hours_by_team": reclaimed_by_team(state.reclaimed, now, req.month)}


class ReportTokens(msgspec.Struct, forbid_unknown_fields=True):
    """Tokens a serving workload served since its last report (a count, not a running total)."""

    namespace: str
    workload: str  # <kind>/<name>: deployment/llm
    tokens: Annotated[int, msgspec.Meta(ge=0, le=10**15)]
    cluster: str | None = None  # needed only when the workload's name is in more than one cluster
    report_id: str | None = None  # the reporter's id for this count: a retry with the same one counts once


def validate_tokens(state: BillingState, req: ReportTokens, now: float) -> Accepted:
    found = find(state.serving, req.namespace, req.workload, req.cluster)
    if not found:
        raise CommandRefused(
            f"billing knows no serving workload {req.workload} in namespace {req.namespace}"
            + (f" of cluster {req.cluster}" if req.cluster else "")
            + ": name it <kind>/<name> (deployment/llm), as a Deployment, StatefulSet or LeaderWorkerSet labelled "
            "chamber.io/team whose replicas Chamber admitted",
            field="workload",
        )
    if len(found) > 1:
        clusters = ", ".join(w[0] for w in found)
        raise CommandRefused(f"{req.workload} is in clusters {clusters}: name one with cluster", field="cluster")
    [(cluster, namespace, workload)] = found
    event = ServingTokensReported(
        team=state.serving.team_of[found[0]],
        cluster=cluster,
        namespace=namespace,
        workload=workload,
        tokens=req.tokens,
        at=now,
    )
    key = req.report_id if req.report_id else repr(now)
    append = Append(event, stable_id("serving-tokens", cluster, namespace, workload, req.tokens, key))
    return Accepted((append,), {"cluster": cluster, "namespace": namespace, "workload": workload, "tokens": req.tokens})


class ServingRequest(msgspec.Struct, forbid_unknown_fields=True):
    month: Annotated[str, msgspec.Meta(pattern=r"^\d{4}-\d{2}$")] | None = None  # YYYY-MM; none: ever


def answer_serving(state: BillingState, req: ServingRequest, now: float) -> dict[str, Any]:
    """Cost per serving workload, and per million tokens where it reports them (billing/serving.py)."""
    return {"month": req.month, "currency": state.currency, "workloads": by_workload(state.serving, req.month)}


COMMANDS: tuple[Command[BillingState, Any], ...] = (
    Command("price", SetPrice, validate=validate_price, entity=_price_subject, conflict=_prices_changed),
    Command("prices", ListPrices, answer=answer_prices),
    Command("reclaimed", ReclaimedRequest, answer=answer_reclaimed),
    Command("tokens", ReportTokens, validate=validate_tokens),
    Command("serving", ServingRequest, answer=answer_serving),
)


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    billing = Billing(args.period, args.settle, args.tick, parse_prices(args.price))

    async def setup(ctx: ServiceContext) -> None:
        billing.host = DeciderHost(billing.manifest(), ctx)
        billing.host.install()

    await serve(NAME, args.nats, setup, stop)
