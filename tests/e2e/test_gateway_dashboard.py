"""The dashboard in a real browser: nats-server + gateway, a scripted fleet published as the services
would, Debian's chromium driven by Playwright. Real numbers from the fleet must appear on the page."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client

from events import BudgetExceeded, BudgetSet, NodeDiscovered
from events.fleet import IsolationHeld
from services.gateway import core, views
from services.gateway.core import GatewayState, evolve
from tests.gateway_builders import a_demo_fleet
from tests.integration.test_gateway_api import Gateway, _folded, _up, publish, start_gateway
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).is_file(),
    reason="Debian's chromium is not installed (/usr/bin/chromium); `scripts/ensure-chromium.sh` installs it",
)


# the flag is on the page, inside its cell's box (a cell that hides its overflow would cut it)
FLAG_SHOWN = """(() => {
  const flag = document.querySelector('#cost [data-cost="vision"] .pill.critical');
  if (!flag || flag.textContent !== 'over budget') return false;
  const f = flag.getBoundingClientRect(), row = flag.closest('.bar-row').getBoundingClientRect();
  const track = flag.closest('.bar-row').querySelector('.track').getBoundingClientRect();
  return f.width > 40 && f.left >= row.left && f.right <= track.left && f.bottom <= row.bottom + 1;
})()"""

HELD_SHOWN = "(() => { const e = document.getElementById('nodes-isolated'); return e.scrollWidth <= e.clientWidth; })()"


@needs_chromium
async def test_the_dashboard_shows_the_running_fleet(
    nats_server: SecuredNatsServer, nc: Client, js: object, tmp_path: Path
) -> None:
    from playwright.async_api import async_playwright

    events, waves = a_demo_fleet(t0=float(int(time.time()) - 3400))  # jobs started within the last hour
    # an isolation the budget held back: counted on the Isolated card and listed with its confirm command
    some = next(e for e in events if isinstance(e, NodeDiscovered))
    held = IsolationHeld(
        cluster=some.cluster, node=some.node, at=time.time() - 60, action="isolate_gpu", reason="nic_down; held",
        gpu_index=1,
    )  # fmt: skip
    over = [  # a team past its budget: the cost panel flags it, whatever the window's width
        BudgetSet(team="vision", at=time.time() - 120, amount=1.0),
        BudgetExceeded(team="vision", at=time.time() - 30, budget=1.0, spent=1.25),
    ]
    events = [*events, held, *over]
    expected = GatewayState()
    for event in [*events, *(e for w in waves for e in w)]:
        evolve(expected, event)
    fleet, running, teams = views.fleet(expected), views.jobs(expected, states={"running"}), views.teams(expected)
    a_running_job = sorted(running.jobs, key=lambda j: j.job_id)[0]

    await publish(nc, events)  # the fleet so far is replayed from the streams; samples then arrive live
    stop, task, url = await start_gateway(nats_server.url_for("gateway"))
    try:
        async with aiohttp.ClientSession() as http:
            gw = Gateway(url, http)
            await eventually(lambda: _up(gw))
            for wave in waves:  # samples over time, so the charts have a history to draw
                await publish(nc, wave)
                await asyncio.sleep(0.25)
            await eventually(lambda: _folded(gw, len(events) + sum(map(len, waves))))

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1440, "height": 1500})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(url + "/")
            gpus_total = page.locator("#gpus-total")
            await gpus_total.filter(has_text=str(fleet.gpus_total)).wait_for(timeout=10_000)
            assert await gpus_total.text_content() == str(fleet.gpus_total) == "128"
            assert await page.locator("#gpus-isolated").text_content() == str(fleet.gpus_isolated)
            assert await page.locator("#queue-depth").text_content() == str(views.queue(expected).depth)
            score = f"{core.efficiency(expected).score * 100:.1f} %"
            assert await page.locator("#efficiency-score").text_content() == score

            job_row = page.locator(f'#running tr[data-job="{a_running_job.job_id}"]')
            assert a_running_job.team in await job_row.text_content()  # type: ignore[operator]
            where = ", ".join(f"{p.node}[{','.join(map(str, p.gpu_indices))}]" for p in a_running_job.placements)
            assert where in await job_row.text_content()  # type: ignore[operator]  # as chamber queue writes it
            vision = next(t for t in teams.teams if t.team == "vision")
            team_row = page.locator('#teams [data-team="vision"]')
            assert f"{vision.used_gpus} / {vision.guaranteed_gpus} GPUs" in await team_row.text_content()  # type: ignore[operator]
            assert await page.locator("#heatmap .node").count() == fleet.nodes_total
            assert await page.locator("#heatmap .cell.isolated").count() == fleet.gpus_isolated
            assert await page.locator("#pending tbody tr").count() == views.queue(expected).depth
            assert "isolated" in await page.locator("#timeline").text_content()  # type: ignore[operator]
            assert "1 held" in await page.locator("#nodes-isolated").text_content()  # type: ignore[operator]
            chip = page.locator(f'#held [data-held="{some.node}/1"]')
            assert f"chamber health confirm {some.node} --gpu 1" in await chip.text_content()  # type: ignore[operator]
            await page.wait_for_function(  # the efficiency series is drawn, with points over time
                "(document.querySelector('#chart-efficiency polyline')?.getAttribute('points') ?? '')"
                ".split(' ').length >= 3",
                timeout=10_000,
            )

            for width in (1440, 900, 600):  # the flag was once cut off in the 90 px name cell
                await page.set_viewport_size({"width": width, "height": 1500})
                # the cost panel fills in on its own poll: wait for the flag, then for it to fit its cell
                await page.locator('#cost [data-cost="vision"] .pill.critical').wait_for(timeout=10_000)
                assert await page.evaluate(FLAG_SHOWN), f"the over-budget flag is cut off at {width} px"
                assert await page.evaluate(HELD_SHOWN), f"the held count is cut off at {width} px"
            await page.set_viewport_size({"width": 1440, "height": 1500})

            assert errors == []
            shot = tmp_path / "dashboard.png"  # for a person to look at: pytest keeps the last runs' tmp dirs
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            await browser.close()
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
