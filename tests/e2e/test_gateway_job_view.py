"""The dashboard's job view end to end: the simulated fleet (agent), the perf service and the gateway
over a real nats-server, Chromium clicking the slow job. A GPU slowed through `sim.inject` must show as
the outlined rank of the job's per-rank activity heat."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import JobScheduled, JobSpec, JobSubmitted, Placement
from services.perf.scenario import busy_job_id
from services.runtime import Publisher
from services.runtime.commands import request
from tests.e2e.test_gateway_dashboard import CHROMIUM, CHROMIUM_ARGS, needs_chromium
from tests.integration.test_gateway_api import Gateway, _up, start_gateway
from tests.integration.test_perf_service import SEED, answers, running_fleet, running_perf
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.e2e


@needs_chromium
async def test_clicking_a_slow_job_shows_its_ranks_with_the_culprit_outlined(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    async with (
        running_fleet(nats_server.url_for("simulator"), tmp_path / "spool"),
        running_perf(nats_server.url_for("perf")),
    ):
        await _slow_job_in_the_browser(nats_server, nc, js)


async def _slow_job_in_the_browser(nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext) -> None:
    from playwright.async_api import async_playwright

    await eventually(lambda: answers(nc, "sim", "inject", {"node": "sim-000", "kind": "clear"}))
    await eventually(lambda: answers(nc, "perf", "status", {}))
    job = busy_job_id(SEED)
    publisher = Publisher(js, source="test-scheduler")
    spec = JobSpec(team="t", gpus_per_replica=4, replicas=2)
    await publisher.publish(JobSubmitted(job_id=job, at=time.time(), spec=spec))
    placements = [Placement(cluster="c1", node=n, gpu_indices=[0, 1, 2, 3]) for n in ("sim-000", "sim-001")]
    await publisher.publish(JobScheduled(job_id=job, at=time.time(), team="t", placements=placements, pool="default"))

    async def verdict(expected: str) -> bool:
        jobs = (await request(nc, "perf", "status", {}))["jobs"]
        return bool(jobs) and jobs[0]["verdict"] == expected

    await eventually(lambda: verdict("healthy"), within=40)
    await request(nc, "sim", "inject", {"node": "sim-001", "kind": "gpu_slow", "gpu": 2})
    await eventually(lambda: verdict("slow"), within=40)

    stop, task, url = await start_gateway(nats_server.url_for("gateway"))
    try:
        async with aiohttp.ClientSession() as http:
            await eventually(lambda: _up(Gateway(url, http)))
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1440, "height": 1600})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(url + "/")
            row = page.locator(f'#slowdowns tr[data-job="{job}"]')
            await row.wait_for(timeout=15_000)
            await row.click()
            title = page.locator("#job-view-title")
            await title.filter(has_text="culprit gpu sim-001 GPU 2").wait_for(timeout=10_000)
            assert await page.locator("#job-heat rect.culprit").count() == 1
            assert await page.locator("#job-heat text").count() == 8  # one label per rank
            assert errors == []
            await browser.close()
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
