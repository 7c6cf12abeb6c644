"""The whole stack in a real browser: `chamber up` on 2 simulated nodes with the workload generator,
the dashboard in Debian's chromium (Playwright), numbers from the running fleet on the page, a fault
injected with `chamber sim-fault` isolating a node, and Ctrl-C stopping everything with exit 0.

Nothing is scripted here: the jobs come from `chamber workload`, the isolation from the health
service reading the agent's fault. Screenshots are saved in the test's tmp dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.runtime.nats_server import free_port
from tests.e2e.test_gateway_dashboard import CHROMIUM, CHROMIUM_ARGS, needs_chromium
from tests.integration.test_runtime import eventually

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TEAMS = {"vision", "nlp", "research"}


async def read_until(stream: asyncio.StreamReader, marker: str, seen: list[str], within: float) -> None:
    async def scan() -> None:
        while True:
            line = await stream.readline()
            if not line:
                raise AssertionError("chamber up exited before it was up:\n" + "".join(seen))
            seen.append(line.decode())
            if marker in seen[-1]:
                return

    try:
        await asyncio.wait_for(scan(), within)
    except TimeoutError:
        raise AssertionError(f"no {marker!r} within {within:g}s:\n" + "".join(seen)) from None


async def drain(stream: asyncio.StreamReader, seen: list[str]) -> None:
    """Keep reading the console, so the stack never blocks on a full pipe."""
    while line := await stream.readline():
        seen.append(line.decode())


async def get(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


@needs_chromium
async def test_chamber_up_shows_the_running_fleet_and_an_isolated_node(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    port, nats_port = free_port(), free_port()
    nats_url, url = f"nats://127.0.0.1:{nats_port}", f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")}
    up = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "services.cli", "up", "--data-dir", str(tmp_path / "stack")],
        *["--port", str(port), "--nats-port", str(nats_port), "--nodes", "2"],
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group: cleaned up as one if the test fails
    )
    assert up.stdout is not None
    console: list[str] = []
    reader: asyncio.Task[None] | None = None
    try:
        await read_until(up.stdout, "chamber is up", console, within=60)
        reader = asyncio.create_task(drain(up.stdout, console))

        async with aiohttp.ClientSession() as http:

            async def a_job_runs() -> bool:
                async with http.get(f"{url}/api/jobs?state=running") as response:
                    if response.status == 503:  # still catching up on the log: honest readiness, not yet
                        return False
                    assert response.status == 200, await response.text()
                    return bool((await response.json())["count"] > 0)

            await eventually(a_job_runs, within=45)  # the workload submits, the scheduler places, the agent runs
            fleet = await get(http, f"{url}/api/fleet?gpus=false")
            assert fleet["gpus_total"] == 16 and fleet["nodes_total"] == 2

            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = await browser.new_page(viewport={"width": 1440, "height": 1400})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                await page.goto(url + "/")

                await page.locator("#gpus-total").filter(has_text="16").wait_for(timeout=15_000)
                assert await page.locator("#heatmap .node").count() == 2
                # a running job submitted by the workload, with its team, as the API knows it
                row = page.locator("#running tbody tr[data-job]").first
                await row.wait_for(timeout=15_000)
                job_id = await row.get_attribute("data-job")
                job = await get(http, f"{url}/api/jobs/{job_id}")
                assert job["team"] in TEAMS and job["team"] in (await row.text_content() or "")
                teams = set(
                    await page.locator("#teams [data-team]").evaluate_all("els => els.map(e => e.dataset.team)")
                )
                assert teams == TEAMS
                assert int(await page.locator("#gpus-allocated").text_content() or "0") > 0
                await page.screenshot(path=str(tmp_path / "dashboard-running.png"), full_page=True)

                # an XID 79 (fallen off the bus) on sim-001: the health service isolates the node
                node = "sim-001"
                fault = await asyncio.create_subprocess_exec(
                    *[
                        sys.executable,
                        "-m",
                        "services.cli",
                        "sim-fault",
                        node,
                        "xid",
                        "--xid",
                        "79",
                        "--nats",
                        nats_url,
                    ],
                    cwd=ROOT,
                    env={**env, "CHAMBER_DATA_DIR": str(tmp_path / "stack")},  # the bus asks for the admin password
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                )
                out, _ = await asyncio.wait_for(fault.communicate(), 30)
                assert fault.returncode == 0, out.decode()
                await page.locator(f'#heatmap .node.isolated[data-node="{node}"]').wait_for(timeout=20_000)
                assert await page.locator(f'#heatmap .node[data-node="{node}"] .cell.isolated').count() == 8
                assert node in (await page.locator("#isolations").text_content() or "")
                assert await page.locator("#gpus-isolated").text_content() == "8"
                assert "isolated" in (await page.locator("#timeline").text_content() or "")
                await page.screenshot(path=str(tmp_path / "dashboard-isolated.png"), full_page=True)
                assert errors == []
                await browser.close()

        up.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(up.wait(), 40) == 0, "".join(console)
        await asyncio.wait_for(reader, 10)
        assert "stopping" in "".join(console) and "nats       stopped" in "".join(console)
        # no component logged an error along the way (a failed tick or handler is a bug to see here)
        errors_logged = [
            f"{log.name}: {line}"
            for log in sorted((tmp_path / "stack" / "logs").glob("*.log"))
            for line in log.read_text().splitlines()
            if '"level": "error"' in line
        ]
        assert errors_logged == []
    finally:
        if up.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(up.pid, signal.SIGKILL)
            await up.wait()
        if reader is not None:
            reader.cancel()
