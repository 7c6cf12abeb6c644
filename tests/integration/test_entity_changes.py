"""Per-entity changes under the deployed permissions: a quota or price change carries the sequence the
requester read, so of two concurrent changes exactly one wins and the other is told the entity changed.
Both services run as deployed (their own NATS users); the requests go over the bus."""

from __future__ import annotations

import argparse
import asyncio
import sys
from types import ModuleType
from typing import Any

import pytest
from nats.aio.client import Client

from services.billing import service as billing_service
from services.quota import service as quota_service
from services.runtime.commands import CommandRefused, request
from tests.integration.test_runtime import eventually
from tests.integration.test_scheduler_service import answers
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration
CHAMBER = [sys.executable, "-m", "services.cli"]

# Ticks far apart: no fair-share update or accrual lands on the entity between the reads and the changes.
ARGS: dict[ModuleType, dict[str, Any]] = {
    quota_service: {"half_life": 3600.0, "interval": 3600.0},
    billing_service: {"period": 300.0, "settle": 30.0, "tick": 3600.0, "price": []},
}


class Running:
    def __init__(self, module: ModuleType, url: str) -> None:
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(module.run(argparse.Namespace(nats=url, **ARGS[module]), self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 15)


async def both(nc: Client, service: str, verb: str, first: dict[str, Any], second: dict[str, Any]) -> list[Any]:
    return list(
        await asyncio.gather(
            request(nc, service, verb, first), request(nc, service, verb, second), return_exceptions=True
        )
    )


def one_wins(results: list[Any]) -> tuple[dict[str, Any], CommandRefused]:
    won = [r for r in results if isinstance(r, dict)]
    lost = [r for r in results if isinstance(r, CommandRefused)]
    assert len(won) == 1 and len(lost) == 1, results
    assert lost[0].kind == "conflict"  # the gateway answers it 409: re-read and retry
    return won[0], lost[0]


async def test_of_two_concurrent_quota_changes_of_a_team_exactly_one_wins(
    nats_server: SecuredNatsServer, nc: Client
) -> None:
    quota = Running(quota_service, nats_server.url_for("quota"))
    try:
        await eventually(lambda: answers(nc, "quota", "list", {}))
        read = (await request(nc, "quota", "set", {"team": "vision", "gpus": 4}))["seq"]
        results = await both(
            nc,
            "quota",
            "patch",
            {"team": "vision", "gpus": 6, "expected_seq": read},
            {"team": "Vision", "borrow_limit": 2, "expected_seq": read},
        )
        won, lost = one_wins(results)
        assert str(lost) == f"quota of team vision changed since you read it (seq {read}); re-read and retry"
        assert lost.field == "team" and won["seq"] > read
        [row] = (await request(nc, "quota", "list", {}))["teams"]
        assert row["guaranteed"] == won["guaranteed"]  # the winner's change, alone
        # re-read and retry: the winner's sequence is the one to carry; a change without one takes the latest
        again = await request(nc, "quota", "patch", {"team": "vision", "weight": 2, "expected_seq": won["seq"]})
        assert again["seq"] > won["seq"]
        assert (await request(nc, "quota", "patch", {"team": "vision", "weight": 3}))["settings"]["weight"] == 3
        # the CLI carries a sequence too: a stale one is refused with the same words, no traceback
        cli = await asyncio.create_subprocess_exec(
            *CHAMBER, "quota", "set", "vision", "--weight", "5", "--expected-seq", str(read), "--nats", nats_server.url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(cli.communicate(), 60)
        assert cli.returncode != 0 and "Traceback" not in err.decode(), err.decode()
        assert f"quota of team vision changed since you read it (seq {read}); re-read and retry" in err.decode()
    finally:
        await quota.close()


async def test_of_two_concurrent_price_changes_exactly_one_wins(nats_server: SecuredNatsServer, nc: Client) -> None:
    billing = Running(billing_service, nats_server.url_for("billing"))
    try:
        price = {"gpu_model": "H100-80GB", "price_per_gpu_hour": 3.0}
        await eventually(lambda: answers(nc, "billing", "price", price))
        read = (await request(nc, "billing", "price", price))["seq"]
        results = await both(
            nc,
            "billing",
            "price",
            {"gpu_model": "H100-80GB", "price_per_gpu_hour": 4.0, "expected_seq": read},
            {"gpu_model": "A100-80GB", "price_per_gpu_hour": 2.0, "expected_seq": read},
        )
        won, lost = one_wins(results)
        assert str(lost) == f"prices changed since you read them (seq {read}); re-read and retry"
        assert won["seq"] == read + 1
    finally:
        await billing.close()
