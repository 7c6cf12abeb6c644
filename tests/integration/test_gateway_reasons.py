"""The dashboard explains a waiting job with the scheduler's own reason (issue 16, finding 9): capacity
is free, but the team is at its borrow limit, and the API says that, not "waiting for the next cycle"."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from services.runtime import Publisher
from services.runtime.commands import request
from services.scheduler import service as scheduler_service
from tests.integration.test_gateway_api import Gateway, _up, start_gateway
from tests.integration.test_runtime import eventually
from tests.integration.test_scheduler_service import Running, answers
from tests.scheduler_builders import a_node, a_quota
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration


async def test_a_job_held_back_by_its_quota_shows_the_schedulers_reason_on_the_dashboard(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    publisher = Publisher(js, source="test/setup")
    await publisher.publish(a_node("n1", gpus=8))
    await publisher.publish(a_quota("vision", 0, borrow=0))  # may submit, may not borrow: it waits
    sched = Running(scheduler_service, nats_server.url_for("scheduler"))
    stop, task, url = await start_gateway(nats_server.url_for("gateway"))
    try:
        await eventually(lambda: answers(nc, "scheduler", "queue", {}))
        await request(nc, "scheduler", "submit", {"team": "vision", "gpus": 2, "id": "held", "allow_wait": True})

        async def scheduler_reason() -> str:
            rows = (await request(nc, "scheduler", "queue", {}))["jobs"]
            return next((r["reason"] for r in rows if r["id"] == "held"), "")

        async def decided() -> bool:  # past "submitted; waiting for the next scheduling cycle"
            return "borrow limit 0" in await scheduler_reason()  # it cannot run until the quota changes

        await eventually(decided, within=30)
        said = await scheduler_reason()
        assert "borrow limit 0" in said
        async with aiohttp.ClientSession() as http:
            gw = Gateway(url, http)
            await eventually(lambda: _up(gw))

            async def shown() -> Any:
                _, queue = await gw.get("/api/queue")
                reasons = [j["reason"] for j in queue["jobs"] if j["job_id"] == "held"]
                return reasons and reasons[0] == said

            await eventually(shown, within=30)
            _, summary = await gw.get("/api/summary")
            [job] = [j for j in summary["queue"]["jobs"] if j["job_id"] == "held"]
            assert job["reason"] == said and "next cycle" not in said
    finally:
        stop.set()
        await task
        await sched.close()
