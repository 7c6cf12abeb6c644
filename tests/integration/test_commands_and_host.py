"""Commands over request/reply (FastStream) and the service host, against a real nats-server."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from nats.aio.client import Client

from events import JobSubmitted
from services.runtime import ConsumerOptions, Delivery
from services.runtime.commands import CommandRefused, CommandUnavailable, request
from services.runtime.host import ServiceContext, serve
from services.runtime.nats_server import NatsServerProcess
from tests.builders import a_job_submitted
from tests.integration.test_runtime import eventually

pytestmark = pytest.mark.integration


class SetQuota(msgspec.Struct):
    team: str
    gpus: int


contexts: list[ServiceContext] = []


async def start_quota_like_service(url: str) -> tuple[asyncio.Event, asyncio.Task[ServiceContext], list[str]]:
    seen: list[str] = []
    stop = asyncio.Event()

    async def set_quota(cmd: SetQuota) -> dict[str, object]:
        if cmd.gpus < 0:
            raise CommandRefused("gpus must be 0 or more; pass --gpus N with N >= 0", field="gpus")
        return {"team": cmd.team, "gpus": cmd.gpus}

    async def on_job(delivery: Delivery) -> None:
        assert isinstance(delivery.event, JobSubmitted)
        seen.append(delivery.event.job_id)

    async def setup(ctx: ServiceContext) -> None:
        contexts.append(ctx)
        ctx.command("set", SetQuota, set_quota)
        ctx.consume(ConsumerOptions(stream="JOBS", durable="quota-test"), handler=on_job)

    task = asyncio.create_task(serve("quota", url, setup, stop))
    return stop, task, seen


async def test_a_command_is_answered_refused_with_the_field_or_reported_unavailable(
    nats_server: NatsServerProcess, nc: Client
) -> None:
    with pytest.raises(CommandUnavailable, match="no quota service"):
        await request(nc, "quota", "set", {"team": "a", "gpus": 1}, timeout=1)

    stop, task, _ = await start_quota_like_service(nats_server.url)
    await eventually(lambda: _answers(nc))
    assert await request(nc, "quota", "set", {"team": "vision", "gpus": 8}) == {"team": "vision", "gpus": 8}
    ctx = contexts[-1]
    assert ctx._commands is not None and ctx._commands.broker._connection is ctx.nc  # one connection per service
    with pytest.raises(CommandRefused) as refused:
        await request(nc, "quota", "set", {"team": "vision", "gpus": -1})
    assert refused.value.field == "gpus" and "--gpus" in str(refused.value)
    with pytest.raises(CommandRefused) as wrong:
        await request(nc, "quota", "set", {"team": "vision", "gpus": "many"})
    assert wrong.value.field == "gpus" and "Expected `int`" in str(wrong.value)
    reply = await nc.request("chamber.cmd.quota.set", b"{not json", timeout=2)
    assert b'"ok":false' in reply.data and b"not valid JSON" in reply.data
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_the_host_runs_consumers_until_stopped_then_drains(nats_server: NatsServerProcess, nc: Client) -> None:
    stop, task, seen = await start_quota_like_service(nats_server.url)
    js = nc.jetstream()
    await eventually(lambda: _stream_exists(js))
    from services.runtime import Publisher

    await Publisher(js, source="test").publish(a_job_submitted("j1"), id="j1")
    await eventually(lambda: seen == ["j1"])
    stop.set()
    ctx = await asyncio.wait_for(task, 10)
    assert ctx.consumers[0].stats.handled == 1
    assert ctx.nc.is_closed


async def _answers(nc: Client) -> bool:
    try:
        await request(nc, "quota", "set", {"team": "a", "gpus": 0}, timeout=0.5)
    except CommandUnavailable:
        return False
    return True


async def _stream_exists(js: object) -> bool:
    try:
        await js.stream_info("JOBS")  # type: ignore[attr-defined]
    except Exception:
        return False
    return True
