"""The OpenAPI document is valid OpenAPI 3.1 and describes every route the gateway serves."""

from __future__ import annotations

import asyncio

from openapi_spec_validator import validate

from services.gateway import openapi
from services.gateway.api import ROUTES, GatewayContext, make_app
from services.gateway.core import GatewayState


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = openapi.build([op for op, _ in ROUTES], title="Chamber gateway", version="0")
    validate(doc)
    assert doc["openapi"] == "3.1.0"


def test_every_api_route_is_documented_and_commands_need_the_bearer_token() -> None:
    async def forward(service: str, verb: str, payload: dict[str, object]) -> None:
        raise AssertionError("no command is sent here")

    app = make_app(GatewayContext(GatewayState(), forward, token="t", stop=asyncio.Event()))
    doc = openapi.build([op for op, _ in ROUTES], title="Chamber gateway", version="0")
    served = {
        (r.method.lower(), r.resource.canonical)
        for r in app.router.routes()
        if r.resource is not None and r.method != "HEAD" and not r.resource.canonical.startswith("/static")
    }
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert served - {("get", "/")} == documented
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert ("security" in op) == (method != "get"), (method, path)
