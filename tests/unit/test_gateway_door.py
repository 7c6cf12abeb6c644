"""The HTTP door (issue 16, finding 11 and the HTTP side of 4 and 5): what a bad request is answered,
which headers every answer carries, and what /openapi.json says about request bodies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import validate

from services.gateway.api import OPENAPI, GatewayContext, make_app
from services.gateway.core import GatewayState

AUTH = {"Authorization": "Bearer t"}


class Forwarded(list[tuple[str, str, dict[str, Any]]]):
    async def __call__(self, service: str, verb: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.append((service, verb, payload))
        return {"id": "j-1"}


@pytest.fixture
def forwarded() -> Forwarded:
    return Forwarded()


async def client_for(ctx: GatewayContext) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(make_app(ctx))) as client:
        yield client


@pytest.fixture
async def client(forwarded: Forwarded) -> AsyncIterator[TestClient[Any, Any]]:
    async for c in client_for(GatewayContext(GatewayState(), forwarded, token="t", stop=asyncio.Event())):
        yield c


@pytest.mark.parametrize("since", ["nan", "inf", "-inf", "1e20", "-1", "yesterday"])
@pytest.mark.parametrize("path", ["/api/history", "/api/efficiency"])
async def test_a_since_that_is_no_time_is_a_400_naming_the_parameter(
    client: TestClient[Any, Any], path: str, since: str
) -> None:
    r = await client.get(path, params={"since": since})
    assert r.status == 400
    assert (await r.json())["field"] == "since"


async def test_a_wrong_method_is_a_405_that_says_which_methods_are_allowed(client: TestClient[Any, Any]) -> None:
    r = await client.delete("/api/jobs")
    assert r.status == 405
    assert set(r.headers["Allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


async def test_a_401_says_how_to_authenticate(client: TestClient[Any, Any]) -> None:
    r = await client.post("/api/jobs", json={"team": "vision", "gpus": 1})
    assert r.status == 401
    assert r.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"team": "x" * 5000, "gpus": 1}, "team"),
        ({"team": "vision", "gpus": 1, "id": "j" * 300}, "id"),
        ({"team": "vision", "gpus": 1, "name": "n" * 900_000}, "name"),
        ({"team": "vision", "gpus": 2**70}, "gpus"),
        ({"team": "../..", "gpus": 1}, "team"),
        ({"team": "*", "gpus": 1}, "team"),
        ({"team": "$SYS", "gpus": 1}, "team"),
        ({"team": "vi\x00sion", "gpus": 1}, "team"),
        ({"team": "vision", "gpus": 1, "gpu": 1}, "gpu"),
    ],
    ids=["long-team", "long-id", "huge-name", "2^70-gpus", "dots", "star", "sys", "nul", "unknown-field"],
)
async def test_a_submit_the_events_would_refuse_is_a_422_naming_the_field_and_nothing_is_sent(
    client: TestClient[Any, Any], forwarded: Forwarded, body: dict[str, Any], field: str
) -> None:
    r = await client.post("/api/jobs", json=body, headers=AUTH)
    assert r.status == 422
    assert (await r.json())["field"] == field
    assert forwarded == []


async def test_a_quota_put_with_a_typo_is_refused_instead_of_resetting_the_limit(
    client: TestClient[Any, Any], forwarded: Forwarded
) -> None:
    r = await client.put("/api/teams/vision/quota", json={"gpus": 8, "borrow": 0}, headers=AUTH)
    assert r.status == 422
    assert (await r.json())["field"] == "borrow"
    assert forwarded == []


async def test_team_names_are_normalised_before_they_are_forwarded(
    client: TestClient[Any, Any], forwarded: Forwarded
) -> None:
    r = await client.put("/api/teams/Vision/quota", json={"gpus": 8}, headers=AUTH)
    assert r.status == 200
    r = await client.post("/api/jobs", json={"team": " Vision ", "gpus": 1}, headers=AUTH)
    assert r.status == 200
    assert [(verb, p["team"]) for _, verb, p in forwarded] == [("set", "vision"), ("submit", "vision")]


async def test_every_answer_carries_the_security_headers(client: TestClient[Any, Any]) -> None:
    for path in ("/", "/api/fleet", "/healthz", "/api/nope", "/static/app.js"):
        r = await client.get(path)
        assert r.headers["X-Content-Type-Options"] == "nosniff", path
        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"], path


async def test_reads_can_be_put_behind_the_token(forwarded: Forwarded) -> None:
    ctx = GatewayContext(GatewayState(), forwarded, token="t", stop=asyncio.Event(), protect_reads=True)
    async for client in client_for(ctx):
        for path in ("/api/fleet", "/api/summary", "/metrics"):
            denied = await client.get(path)
            assert denied.status == 401 and "WWW-Authenticate" in denied.headers, path
            assert (await client.get(path, headers=AUTH)).status == 200, path
        assert (await client.get("/healthz")).status == 200  # probes need no token
        doc = client.app[OPENAPI]
        assert doc["paths"]["/api/fleet"]["get"]["security"] == [{"bearer": []}]


async def test_the_document_gives_each_command_its_real_request_schema(client: TestClient[Any, Any]) -> None:
    doc = client.app[OPENAPI]
    validate(doc)
    submit = doc["paths"]["/api/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    quota = doc["paths"]["/api/teams/{team}/quota"]["put"]
    assert submit == {"$ref": "#/components/schemas/SubmitJob"}
    schemas = doc["components"]["schemas"]
    assert schemas["SubmitJob"]["additionalProperties"] is False
    assert schemas["SubmitJob"]["properties"]["gpus"]["anyOf"][0]["maximum"] == 1024
    assert "borrow_limit" in schemas["SetTeamQuota"]["properties"]
    assert "replaces" in quota["description"] and "PATCH" in quota["description"]
    patch = doc["paths"]["/api/teams/{team}/quota"]["patch"]
    assert patch["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PatchTeamQuota"
    }
    assert (
        not schemas["PatchTeamQuota"].get("required") and "Only the fields sent" in patch["description"]
    )  # team: from the path


async def test_a_team_filter_follows_the_team_rule(client: TestClient[Any, Any]) -> None:
    assert (await client.get("/api/jobs", params={"team": "Vision "})).status == 200
    r = await client.get("/api/jobs", params={"team": "$SYS"})
    assert r.status == 400 and (await r.json())["field"] == "team"


def test_the_environment_the_chart_sets_turns_protected_reads_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from services.gateway import service

    for value, expected in (("true", True), ("", False)):
        monkeypatch.setenv("CHAMBER_API_PROTECT_READS", value)
        parser = argparse.ArgumentParser()
        service.add_arguments(parser)
        assert parser.parse_args([]).protect_reads is expected
