"""The probes Kubernetes calls (/livez, /readyz), served by the service host, against a real nats-server."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from events import JobSubmitted
from services.runtime import ConsumerOptions, Delivery, Publisher
from services.runtime.host import ServiceContext, serve
from services.runtime.nats_server import NatsServerProcess
from tests.builders import a_job_submitted
from tests.integration.test_runtime import eventually

pytestmark = pytest.mark.integration


async def http_get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.json()


async def start_service(url: str) -> tuple[asyncio.Event, asyncio.Task[ServiceContext], list[ServiceContext]]:
    stop = asyncio.Event()
    contexts: list[ServiceContext] = []

    async def on_job(delivery: Delivery) -> None:
        assert isinstance(delivery.event, JobSubmitted)

    async def setup(ctx: ServiceContext) -> None:
        contexts.append(ctx)
        ctx.consume(ConsumerOptions(stream="JOBS", durable="health-test"), handler=on_job)

    return stop, asyncio.create_task(serve("probed", url, setup, stop, health_port=0)), contexts


async def test_ready_once_consuming_reports_progress_and_stays_live_but_unready_while_nats_is_down(
    nats_server: NatsServerProcess,
) -> None:
    stop, task, contexts = await start_service(nats_server.url)
    await eventually(lambda: bool(contexts) and contexts[0].health is not None)
    port = contexts[0].health.port  # type: ignore[union-attr]

    async def ready() -> bool:
        return (await http_get(port, "/readyz"))[0] == 200

    await eventually(ready)

    publisher = Publisher(contexts[0].js, source="test")
    for i in range(3):
        await publisher.publish(a_job_submitted(f"j{i}"))

    async def handled_three() -> bool:
        _, body = await http_get(port, "/readyz")
        return body["consumers"][0]["handled"] == 3  # type: ignore[index]

    await eventually(handled_three)
    status, body = await http_get(port, "/readyz")
    assert status == 200 and body["nats"] == "connected"
    [consumer] = body["consumers"]  # type: ignore[misc]
    assert consumer["stream"] == "JOBS" and consumer["consumer"] == "health-test" and consumer["last_acked_seq"] == 3

    nats_server.stop()

    async def unready() -> bool:
        return (await http_get(port, "/readyz"))[0] == 503

    await eventually(unready)
    status, body = await http_get(port, "/livez")
    assert status == 200 and body["nats"] == "disconnected"  # a NATS outage must not restart pods

    nats_server.start()
    await eventually(ready)

    stop.set()
    await asyncio.wait_for(task, 15)
    with pytest.raises(OSError):
        await http_get(port, "/livez")  # the probe server goes with the service


async def test_unknown_paths_and_methods_are_refused_without_harming_the_server(
    nats_server: NatsServerProcess,
) -> None:
    stop, task, contexts = await start_service(nats_server.url)
    await eventually(lambda: bool(contexts) and contexts[0].health is not None)
    port = contexts[0].health.port  # type: ignore[union-attr]
    assert (await http_get(port, "/nothing"))[0] == 404
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
        assert r.status == 200 and 'chamber_replaying{service="probed"} 0' in await r.text()  # no host: 0
    assert (await http_get(port, "/livez", method="POST"))[0] == 405
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"garbage\r\n\r\n")
    await writer.drain()
    assert (await reader.read()).split(b" ", 2)[1] == b"400"  # not an HTTP request: refused
    writer.close()
    assert (await http_get(port, "/livez"))[0] == 200
    stop.set()
    await asyncio.wait_for(task, 15)


async def test_the_health_port_comes_from_the_environment(
    nats_server: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.runtime.nats_server import free_port

    port = free_port()
    monkeypatch.setenv("CHAMBER_HEALTH_PORT", str(port))
    stop = asyncio.Event()
    started = asyncio.Event()

    async def setup(ctx: ServiceContext) -> None:
        started.set()

    task = asyncio.create_task(serve("env-probed", nats_server.url, setup, stop))
    await asyncio.wait_for(started.wait(), 10)
    status, body = await http_get(port, "/readyz")
    assert status == 200 and body["service"] == "env-probed" and body["consumers"] == []
    stop.set()
    await asyncio.wait_for(task, 15)


def test_a_health_port_that_is_not_a_number_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.runtime.health import port_from_env

    monkeypatch.setenv("CHAMBER_HEALTH_PORT", "http")
    with pytest.raises(ValueError, match="CHAMBER_HEALTH_PORT must be a port number, got 'http'"):
        port_from_env()
    for off in ("", "0"):
        monkeypatch.setenv("CHAMBER_HEALTH_PORT", off)
        assert port_from_env() is None
