"""The HTTP layer on its own (aiohttp's test server, no NATS): what a failing command answers."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from services.gateway.api import GatewayContext, make_app
from services.gateway.core import GatewayState


async def test_a_bug_behind_a_route_answers_json_500_and_the_server_keeps_serving() -> None:
    async def forward(service: str, verb: str, payload: dict[str, object]) -> None:
        raise RuntimeError("reply could not be decoded")

    app = make_app(GatewayContext(GatewayState(), forward, token="t", stop=asyncio.Event()))
    async with TestClient(TestServer(app)) as client:
        r = await client.post("/api/jobs", json={"team": "a"}, headers={"Authorization": "Bearer t"})
        assert r.status == 500
        assert await r.json() == {"error": "internal error: RuntimeError: reply could not be decoded", "status": 500}
        assert (await client.get("/healthz")).status == 200
