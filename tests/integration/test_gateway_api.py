"""The gateway against a real nats-server: events published as the other services would, read over HTTP."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import pytest
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families

from events import Event, JobCompleted
from services.gateway import service
from services.runtime import Publisher
from services.runtime.commands import CommandRefused
from services.runtime.host import ServiceContext, serve
from services.runtime.nats_server import free_port
from tests.gateway_builders import T0, a_node_inventory, a_sample, a_scripted_fleet, a_started
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration
TOKEN = "s3cret-token"


@dataclass
class Gateway:
    url: str
    http: aiohttp.ClientSession

    async def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.http.get(self.url + path, **kw) as r:
            return r.status, (await r.json() if r.content_type == "application/json" else await r.text())

    async def send(self, method: str, path: str, *, token: str | None = TOKEN, **kw: Any) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.http.request(method, self.url + path, headers=headers, **kw) as r:
            return r.status, await r.json()


async def start_gateway(
    nats_url: str, *, token: str | None = TOKEN, warehouse_history: bool = True, command_timeout: float = 2.0
) -> tuple[asyncio.Event, asyncio.Task[None], str]:
    port = free_port()
    args = argparse.Namespace(
        nats=nats_url,
        host="127.0.0.1",
        port=port,
        token=token,
        history_interval=0.2,
        stream_interval=0.2,
        command_timeout=command_timeout,
        no_warehouse_history=not warehouse_history,
        reasons_interval=0.2,
        protect_reads=False,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(args, stop))
    return stop, task, f"http://127.0.0.1:{port}"


async def publish(nc: Client, events: list[Event]) -> None:
    await Publisher(nc.jetstream(), source="test").publish_many((e, None, None) for e in events)


@pytest.fixture
async def gateway(nats_server: SecuredNatsServer, nc: Client) -> AsyncIterator[Gateway]:
    stop, task, url = await start_gateway(nats_server.url_for("gateway"))
    async with aiohttp.ClientSession() as http:
        gw = Gateway(url, http)
        await eventually(lambda: _up(gw))
        try:
            yield gw
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


async def _up(gw: Gateway) -> bool:
    """Connected and caught up: /api/* answers 503 "catching up" until the read model is folded."""
    try:
        status, body = await gw.get("/healthz")
    except aiohttp.ClientError:
        return False
    return status == 200 and body.get("replaying") is None


async def _folded(gw: Gateway, count: int) -> bool:
    return (await gw.get("/healthz"))[1]["events_seen"] >= count


async def test_a_scripted_fleet_is_served_as_json_and_metrics(gateway: Gateway, nc: Client) -> None:
    events = a_scripted_fleet()
    await publish(nc, events)
    await eventually(lambda: _folded(gateway, len(events)))

    status, fleet = await gateway.get("/api/fleet")
    assert status == 200, (fleet, await gateway.get("/healthz"))
    assert (fleet["gpus_total"], fleet["gpus_allocated"], fleet["gpus_idle"], fleet["gpus_isolated"]) == (24, 14, 2, 8)
    assert [n["node"] for n in fleet["nodes"]] == ["n1", "n2", "n3"] and fleet["nodes"][2]["isolated"] is True

    _, queue = await gateway.get("/api/queue")
    assert [(j["job_id"], j["reason"]) for j in queue["jobs"]] == [("big-sweep", "waiting for 8 free GPUs; 2 free now")]
    _, running = await gateway.get("/api/jobs", params={"state": "running"})
    assert {j["job_id"] for j in running["jobs"]} == {"train-llm", "finetune", "embed"}
    _, job = await gateway.get("/api/jobs/train-llm")
    whole_gpus = {"share_milli": 1000, "mig_profile": None, "mig_start": None}  # whole GPUs, not shares
    assert job["placements"] == [{"cluster": "local", "node": "n1", "gpu_indices": list(range(8)), **whole_gpus}]
    _, teams = await gateway.get("/api/teams")
    vision = next(t for t in teams["teams"] if t["team"] == "vision")
    assert (vision["used_gpus"], vision["guaranteed_gpus"], vision["borrowed_gpus"]) == (12, 8, 4)
    _, cost = await gateway.get("/api/cost")
    assert (cost["total"], cost["idle_cost"]) == (39.0, 4.0)
    _, faults = await gateway.get("/api/faults")
    assert [i["node"] for i in faults["isolations"]] == ["n3"]
    _, gpus = await gateway.get("/api/gpus")
    assert len(gpus) == 24 and sum(g["health"] == "node_isolated" for g in gpus) == 8

    status, text = await gateway.get("/metrics")
    assert status == 200
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
    assert values["chamber_gpus"] == 24
    assert values["chamber_gpus_allocated"] == 14
    assert values["chamber_gpus_idle"] == 2
    assert values["chamber_gpus_isolated"] == 8
    assert values["chamber_queue_depth"] == 1
    assert values["chamber_efficiency_score"] == pytest.approx(11.2 / 16)
    assert values["chamber_faults_total"] == 1
    labelled = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels
    }
    assert labelled[("chamber_team_gpus_used", (("team", "vision"),))] == 12
    assert labelled[("chamber_team_gpus_borrowed", (("team", "vision"),))] == 4
    assert labelled[("chamber_team_cost_total", (("currency", "USD"), ("team", "vision")))] == 30.0
    assert labelled[("chamber_nodes", (("status", "healthy"),))] == 3
    assert labelled[("chamber_jobs", (("state", "pending"),))] == 1

    await publish(nc, [JobCompleted(job_id="train-llm", at=2e9)])
    await eventually(lambda: _folded(gateway, len(events) + 1))
    _, eff = await gateway.get("/api/efficiency")
    assert (eff["allocated"], eff["idle"], eff["efficiency_score"]) == (6, 10, round(4.0 / 16, 4))
    await eventually(lambda: _has_history(gateway))


async def _has_history(gw: Gateway) -> bool:
    return len((await gw.get("/api/efficiency"))[1]["history"]) >= 2


async def test_the_dashboard_stream_pushes_the_summary(gateway: Gateway, nc: Client) -> None:
    await publish(nc, a_scripted_fleet())
    async with gateway.http.get(gateway.url + "/api/stream") as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        seen = 0
        async for line in r.content:
            if line.startswith(b"data: "):
                summary = msgspec.json.decode(line[6:])
                if summary["fleet"]["gpus_total"] == 24:
                    seen += 1
                    if seen == 2:  # a second push, without asking again
                        break
    assert seen == 2


async def test_openapi_describes_every_route_and_the_bearer_scheme(gateway: Gateway) -> None:
    status, doc = await gateway.get("/openapi.json")
    assert status == 200 and doc["openapi"] == "3.1.0"
    for path in ("/api/fleet", "/api/gpus", "/api/queue", "/api/jobs", "/api/teams", "/api/efficiency", "/api/cost"):
        assert "get" in doc["paths"][path], path
    assert doc["paths"]["/api/jobs"]["post"]["security"] == [{"bearer": []}]
    assert doc["paths"]["/api/fleet"]["get"]["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/FleetView"
    }
    assert "GpuView" in doc["components"]["schemas"]


async def test_commands_need_the_token_and_change_nothing_without_it(
    gateway: Gateway, nats_server: SecuredNatsServer
) -> None:
    received: list[dict[str, Any]] = []
    stop, task = await _fake_owners(nats_server.url, received)
    try:
        for token in (None, "wrong"):
            status, body = await gateway.send("POST", "/api/jobs", token=token, json={"team": "vision", "gpus": 8})
            assert status == 401 and "token" in body["error"]
        assert received == []

        status, body = await gateway.send("POST", "/api/jobs", json={"team": "vision", "gpus_per_replica": 8})
        assert (status, body["result"]) == (200, {"job_id": "job-1"})
        status, body = await gateway.send("POST", "/api/jobs/job-1/cancel")
        assert status == 200 and received[-1] == {"job_id": "job-1"}
        status, body = await gateway.send("PUT", "/api/teams/nlp/quota", json={"pool": "default", "guaranteed_gpus": 4})
        assert status == 200 and received[-1] == {"pool": "default", "guaranteed_gpus": 4, "team": "nlp"}
        # PATCH forwards only the fields sent (null clears a limit), to the patch verb
        status, body = await gateway.send("PATCH", "/api/teams/nlp/quota", json={"borrow_limit": None, "weight": 2})
        assert (status, body["result"]) == (200, {"done": "patch"})
        assert received[-1] == {"borrow_limit": None, "weight": 2.0, "team": "nlp"}
        status, body = await gateway.send("POST", "/api/nodes/local/n3/restore", json={"by": "replaced"})
        assert status == 200 and received[-1] == {"by": "replaced", "cluster": "local", "node": "n3"}

        # refused by the owning service: its message and field come back as a 422
        status, body = await gateway.send("POST", "/api/jobs", json={"team": "closed", "gpus_per_replica": 1})
        assert (status, body["field"]) == (422, "team") and "no new work" in body["error"]
        # the status says what to do next: re-read (409), wait (503 with Retry-After), look elsewhere (404)
        for team, want in (("raced", 409), ("early", 503), ("ghost", 404)):
            job = {"team": team, "gpus_per_replica": 1}
            async with gateway.http.post(gateway.url + "/api/jobs", json=job, headers=_auth()) as r:
                assert r.status == want and "refused as" in (await r.json())["error"]
                assert ("Retry-After" in r.headers) == (want == 503)
        count = len(received)
        # refused at the door with the same types and limits as the service: never forwarded
        status, body = await gateway.send("POST", "/api/jobs", json={"team": "vision", "gpus_per_replica": 0})
        assert (status, body["field"]) == (422, "gpus_per_replica") and ">= 1" in body["error"]
        # bad requests never reach a service
        async with gateway.http.post(gateway.url + "/api/jobs", data=b"{nope", headers=_auth()) as r:
            assert r.status == 400 and "not valid JSON" in (await r.json())["error"]
        status, body = await gateway.send("POST", "/api/jobs", json=[1, 2])
        assert status == 400 and "JSON object" in body["error"]
        deep = b'{"team": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # the parser would recurse 100,000 deep
        async with gateway.http.post(gateway.url + "/api/jobs", data=deep, headers=_auth()) as r:
            assert r.status == 400 and "nested deeper" in (await r.json())["error"]
        nan = b'{"team": "vision", "gpus_per_replica": 1, "expected_duration_s": NaN}'
        async with gateway.http.post(gateway.url + "/api/jobs", data=nan, headers=_auth()) as r:
            assert r.status == 400 and "NaN" in (await r.json())["error"]
        status, body = await gateway.send("PUT", "/api/teams/nlp/quota", json={"team": "vision", "guaranteed_gpus": 1})
        assert (status, body["field"]) == (400, "team")
        assert len(received) == count
        # a client's retry key travels to the scheduler, which applies a retried submit once
        job = {"team": "vision", "gpus_per_replica": 1}
        async with gateway.http.post(
            gateway.url + "/api/jobs", json=job, headers={**_auth(), "Idempotency-Key": "k-1"}
        ) as r:
            assert r.status == 200
        assert received[-1]["request_id"] == "k-1"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)

    status, body = await gateway.send("POST", "/api/jobs/job-1/cancel")
    assert status == 503 and "scheduler" in body["error"]


async def test_bad_reads_get_a_json_problem_naming_the_parameter(gateway: Gateway) -> None:
    status, body = await gateway.get("/api/jobs", params={"state": "sleeping"})
    assert (status, body["status"], body["field"]) == (400, 400, "state") and "sleeping" in body["error"]
    status, body = await gateway.get("/api/jobs", params={"limit": "lots"})
    assert (status, body["field"]) == (400, "limit")
    status, body = await gateway.get("/api/jobs/nope")
    assert status == 404 and "nope" in body["error"]
    status, body = await gateway.get("/api/nothing-here")
    assert status == 404 and body["error"] == "no route /api/nothing-here"
    async with gateway.http.delete(gateway.url + "/api/fleet") as r:
        assert r.status == 405 and "DELETE" in (await r.json())["error"]


async def test_a_gateway_without_a_token_refuses_every_command(nats_server: SecuredNatsServer) -> None:
    stop, task, url = await start_gateway(nats_server.url_for("gateway"), token=None)
    async with aiohttp.ClientSession() as http:
        gw = Gateway(url, http)
        await eventually(lambda: _up(gw))
        status, body = await gw.send("POST", "/api/jobs", token="anything", json={"team": "x"})
        assert status == 401 and "--token" in body["error"]
    stop.set()
    await asyncio.wait_for(task, 15)


async def test_a_restarted_gateway_rebuilds_the_same_view_from_the_streams(
    nats_server: SecuredNatsServer, nc: Client, js: object
) -> None:
    events = [*a_scripted_fleet(), a_started("finetune")]
    await publish(nc, events)
    answers = []
    for _ in range(2):
        stop, task, url = await start_gateway(nats_server.url_for("gateway"))
        async with aiohttp.ClientSession() as http:
            gw = Gateway(url, http)
            await eventually(lambda gw=gw: _up(gw))
            await eventually(lambda gw=gw: _folded(gw, len(events)))
            answers.append([(await gw.get(p))[1] for p in ("/api/fleet", "/api/queue", "/api/teams", "/api/cost")])
        stop.set()
        await asyncio.wait_for(task, 15)
    assert answers[0] == answers[1]


async def test_telemetry_is_replayed_from_each_nodes_latest_sample_only(
    nats_server: SecuredNatsServer, nc: Client, js: object
) -> None:
    """A day of samples is not replayed: the heatmap needs each node's newest one."""
    old = [a_sample("n1", [10.0] * 8, seq=s, at=T0 + s) for s in range(1, 50)]
    await publish(nc, [a_node_inventory("n1"), *old, a_sample("n1", [77.0] * 8, seq=50, at=T0 + 50)])
    stop, task, url = await start_gateway(nats_server.url_for("gateway"))
    async with aiohttp.ClientSession() as http:
        gw = Gateway(url, http)
        await eventually(lambda: _up(gw))
        await eventually(lambda: _folded(gw, 2))
        _, gpus = await gw.get("/api/gpus")
        assert [g["utilization_pct"] for g in gpus] == [77.0] * 8
        assert (await gw.get("/healthz"))[1]["events_seen"] == 2  # the inventory and the newest sample
        await publish(nc, [a_sample("n1", [33.0] * 8, seq=51, at=T0 + 51)])  # and live ones keep coming
        await eventually(lambda: _folded(gw, 3))
        _, gpus = await gw.get("/api/gpus")
        assert [g["utilization_pct"] for g in gpus] == [33.0] * 8
    stop.set()
    await asyncio.wait_for(task, 15)


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


class _Submit(msgspec.Struct, omit_defaults=True):
    team: str
    gpus_per_replica: int
    request_id: str | None = None


class _Anything(msgspec.Struct):
    pass


async def _fake_owners(url: str, received: list[dict[str, Any]]) -> tuple[asyncio.Event, asyncio.Task[ServiceContext]]:
    """Command servers standing in for the scheduler, quota and health services (the real runtime)."""
    stop = asyncio.Event()

    async def submit(cmd: _Submit) -> dict[str, str]:
        if cmd.team == "closed":
            raise CommandRefused("team closed takes no new work", field="team")
        kinds = {"raced": "conflict", "early": "catching_up", "ghost": "unknown"}
        if cmd.team in kinds:
            raise CommandRefused(f"refused as {kinds[cmd.team]}", kind=kinds[cmd.team])
        received.append(msgspec.structs.asdict(cmd))
        return {"job_id": "job-1"}

    def recorder(verb: str):  # type: ignore[no-untyped-def]
        async def handle(cmd: dict[str, Any]) -> dict[str, str]:
            received.append(cmd)
            return {"done": verb}

        return handle

    async def setup(ctx: ServiceContext) -> None:
        ctx.command("submit", _Submit, submit)
        ctx.command("cancel", dict, recorder("cancel"))

    async def setup_quota(ctx: ServiceContext) -> None:
        ctx.command("set", dict, recorder("set"))
        ctx.command("patch", dict, recorder("patch"))

    async def setup_health(ctx: ServiceContext) -> None:
        ctx.command("restore", dict, recorder("restore"))

    async def all_three() -> ServiceContext:
        results = await asyncio.gather(
            serve("scheduler", url, setup, stop),
            serve("quota", url, setup_quota, stop),
            serve("health", url, setup_health, stop),
        )
        return results[0]

    task = asyncio.create_task(all_three())
    nc = None
    from services.runtime import connect

    nc = await connect(url, name="probe")
    try:
        for subject in ("chamber.cmd.scheduler.submit", "chamber.cmd.quota.set", "chamber.cmd.health.restore"):
            await eventually(lambda s=subject: _answers(nc, s))
    finally:
        await nc.close()
    return stop, task


async def _answers(nc: Client, subject: str) -> bool:
    try:
        await nc.request(subject, b"{nope", timeout=0.5)
    except Exception:
        return False
    return True
