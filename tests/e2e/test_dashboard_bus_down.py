"""Issue 16, finding 7: with its bus killed, the dashboard says "bus down" instead of a green live dot
over frozen numbers, and goes live again when the bus is back (Debian's chromium, Playwright)."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.test_gateway_dashboard import CHROMIUM, CHROMIUM_ARGS, needs_chromium
from tests.integration.test_gateway_api import start_gateway
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.e2e


@needs_chromium
async def test_the_dashboard_says_the_bus_is_down_and_recovers(nats_server: SecuredNatsServer) -> None:
    from playwright.async_api import async_playwright

    stop, task, url = await start_gateway(nats_server.url_for("gateway"))
    try:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page()
            await page.goto(url + "/")
            text, dot = page.locator("#live-text"), page.locator("#live-dot")
            await text.filter(has_text="live").wait_for(timeout=60_000)
            nats_server.kill()
            await text.filter(has_text="bus down").wait_for(timeout=60_000)
            assert await dot.get_attribute("class") == "dot off"
            nats_server.start()
            await text.filter(has_text="live ·").wait_for(timeout=60_000)
            assert await dot.get_attribute("class") == "dot"
            await browser.close()
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
