"""The fabric panel in a real browser and `GET /api/fabric`: fabric samples and a slowdown verdict
published as the agents and the perf service would, shown on the dashboard; per-NIC series on /metrics."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client

from events import Event
from events.fabric import CulpritKind, FabricSample, JobSlowdownDetected, LinkState, NicSample
from tests.e2e.test_gateway_dashboard import CHROMIUM, CHROMIUM_ARGS, needs_chromium
from tests.integration.test_gateway_api import Gateway, _folded, _up, publish, start_gateway
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.e2e


def fabric_events(now: float) -> list[Event]:
    def nics(down: int | None) -> list[NicSample]:
        return [
            NicSample(
                name=f"mlx5_{i}/1",
                index=i,
                gpu_index=i,
                rate_gbps=None if i == down else 400.0,
                state=LinkState.DOWN if i == down else LinkState.UP,
                tx_bytes_per_s=4e10,
                errors=0,
                pause=2,
                flaps=0,
            )
            for i in range(8)
        ]

    samples: list[Event] = [
        FabricSample(
            cluster="c1",
            node=f"n{k}",
            seq=1,
            observed_at=now,
            interval_s=1.0,
            nics=nics(3 if k == 1 else None),
            labels={"leaf": "leaf-0"},
        )
        for k in range(3)
    ]
    verdict = JobSlowdownDetected(
        job_id="train-7",
        episode=1,
        at=now,
        since=now - 8,
        culprit=CulpritKind.NIC,
        score=0.0,
        confidence=0.95,
        cluster="c1",
        node="n1",
        gpu_index=3,
        nic="mlx5_3/1",
        reason="NIC mlx5_3/1 on n1 is down",
    )
    return [*samples, verdict]


@needs_chromium
async def test_the_fabric_panel_shows_the_slow_job_and_the_down_link(
    nats_server: SecuredNatsServer, nc: Client, js: object, tmp_path: Path
) -> None:
    from playwright.async_api import async_playwright

    events = fabric_events(time.time())
    await publish(nc, events)
    stop, task, url = await start_gateway(nats_server.url_for("gateway"))
    try:
        async with aiohttp.ClientSession() as http:
            gw = Gateway(url, http)
            await eventually(lambda: _up(gw))
            await eventually(lambda: _folded(gw, len(events)))
            status, body = await gw.get("/api/fabric")
            assert status == 200
            assert [(n["node"], n["flagged"]) for n in body["nodes"]] == [("n0", 0), ("n1", 1), ("n2", 0)]
            assert body["slowdowns"][0]["job_id"] == "train-7" and body["slowdowns"][0]["culprit"] == "nic"
            _, metrics = await gw.get("/metrics")
            assert 'chamber_nic_up{cluster="c1",leaf="leaf-0",nic="mlx5_3/1",node="n1"} 0.0' in metrics

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1440, "height": 1500})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(url + "/")
            row = page.locator("#slowdowns tbody tr").filter(has_text="train-7")
            await row.wait_for(timeout=10_000)
            assert "n1 · GPU 3 · mlx5_3/1" in await row.text_content()  # type: ignore[operator]
            assert await page.locator("#fabric .n.down").count() == 1
            assert await page.locator("#fabric .n.ok").count() == 23
            assert "1 slow job" in await page.locator("#fabric-summary").text_content()  # type: ignore[operator]
            assert errors == []
            await page.screenshot(path=str(tmp_path / "fabric.png"), full_page=True)
            await browser.close()
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
