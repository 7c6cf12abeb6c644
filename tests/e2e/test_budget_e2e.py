"""End to end: a budget that acts. Quota, billing and scheduler run as processes; the test publishes
the fleet discovery would. A team with `--budget 1 --on-budget hold` spends past it (billing accrues
one-second periods at 3,600 per GPU-hour), billing publishes BudgetExceeded, and the team's next job
waits, with `chamber explain` saying why, until the budget is raised."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from events import BudgetExceeded
from services.runtime import Publisher
from tests.e2e.test_scheduler_e2e import CHAMBER, achamber, queue, state_is
from tests.integration.test_billing_service import billing_events
from tests.integration.test_runtime import eventually
from tests.scheduler_builders import a_node
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.e2e


@pytest.fixture
def services(nats_server: SecuredNatsServer, tmp_path: Path) -> Iterator[None]:
    procs = []
    for name, extra in (
        ("quota", ["--interval", "0.5"]),
        ("scheduler", ["--interval", "0.2", "--full-every", "1"]),
        ("billing", ["--period", "1", "--settle", "0", "--tick", "0.5", "--price", "H100=3600"]),
    ):
        log = (tmp_path / f"{name}.log").open("w")
        procs.append(
            subprocess.Popen(
                [CHAMBER, "service", name, "--nats", nats_server.url_for(name), *extra],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        )
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


async def test_a_team_over_its_budget_with_hold_waits_until_the_budget_is_raised(
    nats_server: SecuredNatsServer, js: JetStreamContext, services: None
) -> None:
    url = nats_server.url
    discovery = Publisher(js, source="test/discovery")
    for node in ("n1", "n2"):
        await discovery.publish(a_node(node, gpus=8, at=time.time()))

    async def quota_set(budget: str) -> bool:
        args = [CHAMBER, "quota", "set", "vision", "--gpus", "8", "--budget", budget, "--on-budget", "hold"]
        done = await asyncio.to_thread(subprocess.run, [*args, "--nats", url], capture_output=True, timeout=60)
        return done.returncode == 0

    await eventually(lambda: quota_set("1"), within=30)
    await achamber(url, "submit", "--team", "vision", "--gpus", "8", "--id", "first")
    await eventually(lambda: state_is(url, "first", "running"), within=30)

    # 8 GPUs at 1 per GPU-second: past the budget of 1 within the first accrued second
    async def exceeded() -> bool:
        return any(isinstance(e, BudgetExceeded) and e.team == "vision" for e in await billing_events(js))

    await eventually(exceeded, within=60)

    async def scheduler_knows() -> bool:  # the scheduler folded BudgetExceeded too (it reads BILLING)
        return "over its budget" in await achamber(url, "explain", "first")

    await eventually(scheduler_knows, within=30)
    await achamber(url, "submit", "--team", "vision", "--gpus", "8", "--id", "second")  # n2 is free

    async def held() -> bool:
        row = (await queue(url)).get("second", {})
        return row.get("state") == "pending" and "over its budget" in row.get("reason", "")

    await eventually(held, within=30)
    why = await achamber(url, "explain", "second")
    assert "is pending" in why and "--on-budget hold" in why and "new work waits until the budget is raised" in why
    assert await state_is(url, "first", "running")  # running work goes on

    await eventually(lambda: quota_set("1000000000"), within=30)
    await eventually(lambda: state_is(url, "second", "running"), within=30)
