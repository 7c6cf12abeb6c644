"""`chamber dead list|show|replay` against a real nats-server: a message a handler refused is listed
with its reason, shown with control characters escaped, and replayed after the fix."""

from __future__ import annotations

import asyncio
import json

import pytest
from nats.js import JetStreamContext

from events import encode
from services.cli import main
from services.runtime.consumer import Consumer, ConsumerOptions, Delivery
from services.runtime.nats_server import NatsServerProcess
from tests.integration.test_runtime import eventually
from tests.warehouse_builders import T0, submitted

pytestmark = pytest.mark.integration


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_a_refused_message_is_listed_shown_and_replayed_after_the_fix(
    nats_server: NatsServerProcess, js: JetStreamContext, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = True
    handled: list[str] = []

    async def handler(d: Delivery) -> None:
        if broken:
            raise RuntimeError("bug\x1b[31m fixed in the next release")
        handled.append(d.envelope.id)

    headers, body = encode(submitted("j1", "vision", 1, T0), source="test", id="j1")
    # a message of the past, beyond the duplicate window by the time it is replayed: no Nats-Msg-Id
    await js.publish("chamber.jobs.j1", body, headers={k: v for k, v in headers.items() if k != "Nats-Msg-Id"})
    options = ConsumerOptions(stream="JOBS", durable="t-cli", max_attempts=1, retry_delay_s=0.01)
    consumer = Consumer(js, options, handler=handler)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await eventually(lambda: consumer.stats.dead == 1)
        url = nats_server.url
        code, out, _ = await cli(capsys, "dead", "list", "--nats", url, "--json")
        [letter] = json.loads(out[out.index('{\n  "dead_letters"') :])["dead_letters"]  # after any log lines
        assert code == 0 and letter["stream"] == "JOBS" and letter["reason"] == "handler_failed"
        assert letter["subject"] == "chamber.jobs.j1" and "RuntimeError" in letter["detail"]

        code, out, _ = await cli(capsys, "dead", "list", "--nats", url)
        assert code == 0 and "handler_failed" in out and "\x1b" not in out and "\\x1b" in out
        code, out, _ = await cli(capsys, "dead", "show", str(letter["seq"]), "--nats", url)
        assert code == 0 and "chamber-dead-reason: handler_failed" in out and "\x1b" not in out

        code, _, err = await cli(capsys, "dead", "replay", "--nats", url)
        assert code == 2 and "--all" in err  # nothing replayed without saying what
        broken = False  # the fix is deployed
        code, out, _ = await cli(capsys, "dead", "replay", str(letter["seq"]), "--nats", url)
        assert code == 0 and "1 replayed" in out
        await eventually(lambda: handled == ["j1"])
        code, _, err = await cli(capsys, "dead", "show", "999", "--nats", url)
        assert code == 2 and "no dead letter 999" in err
    finally:
        stop.set()
        await task
