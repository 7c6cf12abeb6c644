"""Honest readiness: a decider-hosted service started on a filled stream says "replaying: folded N of
M" on /readyz (503), its gateway answers /api/* with 503 and Retry-After, /metrics has
`chamber_replaying` 1; once caught up, 200 and 0. A command meanwhile is refused with one message."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import aiohttp
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from services.runtime import Publisher
from services.runtime.commands import CommandRefused, CommandUnavailable, request
from services.runtime.nats_server import free_port
from tests.builders import a_job_submitted
from tests.integration.test_gateway_api import start_gateway
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration
EVENTS = 40_000  # enough that folding them takes the gateway a while on any machine
COMMAND_EVENTS = 10_000  # the scheduler folds slower than the gateway: fewer keep it busy long enough


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str], str]:
    try:
        async with http.get(url) as r:
            return r.status, dict(r.headers), await r.text()
    except aiohttp.ClientError:
        return 0, {}, ""


async def test_a_gateway_on_a_filled_stream_answers_503_while_replaying_then_200(
    nats_server: SecuredNatsServer, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher = Publisher(js, source="test")
    await publisher.publish_many((a_job_submitted(f"j{i}", at=float(i)), None, None) for i in range(EVENTS))
    health_port = free_port()
    monkeypatch.setenv("CHAMBER_HEALTH_PORT", str(health_port))
    stop, task, url = await start_gateway(nats_server.url_for("gateway"))
    probe = f"http://127.0.0.1:{health_port}"
    seen: dict[str, list[Any]] = {"readyz": [], "api": [], "metrics": []}
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                ready = await _get(http, f"{probe}/readyz")
                api = await _get(http, f"{url}/api/summary")
                metrics = await _get(http, f"{probe}/metrics")
                seen["readyz"].append(ready)
                seen["api"].append(api)
                seen["metrics"].append(metrics)
                if ready[0] == 200 and api[0] == 200:
                    break
                await asyncio.sleep(0.02)
            gateway_metrics = await _get(http, f"{url}/metrics")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)

    # /readyz: 503 with the progress while folding, then 200
    replaying = [body for code, _, body in seen["readyz"] if code == 503 and "replaying: folded" in body]
    assert replaying, [r[:1] for r in seen["readyz"]]
    totals = [int(m.group(2)) for b in replaying for m in re.finditer(r"folded (\d+) of (\d+)", b)]
    assert max(totals) >= EVENTS
    assert seen["readyz"][-1][0] == 200 and '"replaying": null' in seen["readyz"][-1][2]

    # the API: 503 + Retry-After while catching up (never a half-folded answer), then 200
    busy = [(headers, body) for code, headers, body in seen["api"] if code == 503]
    assert busy, [a[0] for a in seen["api"]]
    assert all(h.get("Retry-After") == "5" and "catching up" in b for h, b in busy)
    assert seen["api"][-1][0] == 200
    first_ok = next(i for i, a in enumerate(seen["api"]) if a[0] == 200)
    assert all(a[0] == 200 for a in seen["api"][first_ok:])  # ready stays ready

    # /metrics: the gauge per service, 1 while replaying, 0 after
    gauges = [body for code, _, body in seen["metrics"] if code == 200]
    assert any('chamber_replaying{service="gateway"} 1' in b for b in gauges)
    assert 'chamber_replaying{service="gateway"} 0' in gauges[-1]  # fetched after /readyz said 200
    assert 'chamber_replaying{service="gateway"} 0.0' in gateway_metrics[2]


async def test_a_command_while_the_service_catches_up_is_refused_with_the_one_message(
    nats_server: SecuredNatsServer, js: JetStreamContext, nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every decider-hosted service refuses a command that comes before it caught up with its log the
    same way (services/runtime/command_path.py), with its progress; once caught up, it answers."""
    from services.runtime import command_path
    from services.scheduler import service as scheduler_service
    from tests.integration.test_scheduler_service import Running

    monkeypatch.setattr(command_path, "CATCH_UP_WAIT_S", 0.0)  # say it at once instead of waiting 3 s
    publisher = Publisher(js, source="test")
    await publisher.publish_many((a_job_submitted(f"j{i}", at=float(i)), None, None) for i in range(COMMAND_EVENTS))
    sched = Running(scheduler_service, nats_server.url_for("scheduler"))
    refusals: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                answer = await request(nc, "scheduler", "queue", {"limit": 1}, timeout=5)
                break
            except CommandUnavailable:  # not subscribed yet
                await asyncio.sleep(0.01)
            except CommandRefused as exc:
                refusals.append(str(exc))
                assert exc.kind == "catching_up"  # the gateway answers it 503 with Retry-After
                await asyncio.sleep(0.02)
    finally:
        await sched.close()
    assert refusals, "no command arrived while the scheduler was folding"
    pattern = r"scheduler is catching up with its log \(replaying: (folded \d+ of \d+|opening the inputs)\); try again"
    assert all(re.fullmatch(pattern + " in a moment", r) for r in refusals), refusals[:3]
    assert answer["total"] == COMMAND_EVENTS
