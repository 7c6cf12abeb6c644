"""Poison messages end in DEAD once and the consumer goes on: messages carrying JetStream's own
headers, a batch with one message that crashes its handler, a DEAD stream the copy cannot reach,
a core that raises while folding, and the recorder on a crafted sample."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from events import encode
from services.runtime import Publisher
from services.runtime.consumer import Consumer, ConsumerOptions, Delivery
from services.runtime.dead_letter import DEAD_ORIGINAL, DEAD_REASON, replay_headers
from services.runtime.nats_server import NatsServerProcess
from services.warehouse import migrate
from services.warehouse.chdb_backend import ChdbWarehouse
from tests.integration.test_decider_host import probe_host
from tests.integration.test_recorder_pipeline import start_recorder
from tests.integration.test_runtime import dead_letters, eventually, settled
from tests.warehouse_builders import T0, a_sample, submitted

pytestmark = pytest.mark.integration
EXPECTED_SEQ = "Nats-Expected-Last-Subject-Sequence"


async def test_a_message_carrying_an_expected_sequence_is_copied_to_dead_once(js: JetStreamContext) -> None:
    # The scheduler's own JOBS events carry this header; on the copy the server would check it again.
    headers, _ = encode(submitted("j1", "vision", 1, T0), source="test", id="j1")
    await js.publish("chamber.jobs.j1", b"{not json", headers={**headers, EXPECTED_SEQ: "0"})
    handled: list[Delivery] = []

    async def seen(d: Delivery) -> None:
        handled.append(d)

    consumer = Consumer(js, ConsumerOptions(stream="JOBS", durable="t-expected"), handler=seen)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await eventually(lambda: consumer.stats.dead == 1)
    await Publisher(js, source="test").publish(submitted("j2", "vision", 1, T0), id="j2")
    await eventually(lambda: len(handled) == 1)  # it went on
    stop.set()
    await task
    [(subject, dead, _)] = await dead_letters(js)
    assert subject == "chamber.dead.jobs" and dead[DEAD_REASON] == "malformed"
    assert EXPECTED_SEQ not in dead and dead[f"{DEAD_ORIGINAL}{EXPECTED_SEQ}"] == "0"
    assert EXPECTED_SEQ not in replay_headers(dead)  # a replay does not check a sequence long gone


async def test_one_message_that_crashes_a_batch_handler_is_dead_lettered_alone(js: JetStreamContext) -> None:
    pub = Publisher(js, source="test")
    for i in range(10):
        await pub.publish(submitted(f"j{i}", "vision", 1, T0), id=f"j{i}")
    stored: list[str] = []

    async def store(batch: list[Delivery]) -> None:
        ids = [d.envelope.id for d in batch]
        if "j7" in ids:
            raise ValueError("j7 breaks the store")
        stored.extend(ids)

    options = ConsumerOptions(stream="JOBS", durable="t-split", batch=10, retry_delay_s=0.01)
    consumer = Consumer(js, options, batch_handler=store)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await eventually(lambda: consumer.stats.dead == 1 and len(stored) == 9)
    stop.set()
    await task
    [(_, dead, _)] = await dead_letters(js)
    assert dead[DEAD_REASON] == "handler_failed" and "ValueError: j7 breaks the store" in dead["chamber-dead-detail"]
    assert sorted(stored) == sorted(f"j{i}" for i in range(10) if i != 7)
    assert consumer.stats.split >= 1
    await settled(js, "JOBS", "t-split")  # nothing left to redeliver


async def test_a_copy_that_cannot_be_stored_does_not_stop_the_consumer(js: JetStreamContext) -> None:
    await js.delete_stream("DEAD")  # as for a role that may not publish dead letters: the copy fails
    await js.publish("chamber.jobs.poison", b"garbage")
    await Publisher(js, source="test").publish(submitted("j1", "vision", 1, T0), id="j1")
    handled: list[Delivery] = []

    async def seen(d: Delivery) -> None:
        handled.append(d)

    consumer = Consumer(js, ConsumerOptions(stream="JOBS", durable="t-nodead"), handler=seen)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await eventually(lambda: len(handled) == 1, within=20)
    stop.set()
    await task
    assert consumer.stats.dead == 1
    await settled(js, "JOBS", "t-nodead")  # terminated: never redelivered
    assert (await js.stream_info("JOBS")).state.messages == 2  # the poison stays in its own stream


async def test_a_core_that_raises_on_one_event_dead_letters_it_and_folds_on(
    nats_server: NatsServerProcess, js: JetStreamContext
) -> None:
    def evolve(state: list[object], event: object) -> None:
        if getattr(event, "job_id", "") == "bad":
            raise KeyError("a core bug")
        state.append(event)

    pub = Publisher(js, source="test")
    await pub.publish(submitted("bad", "vision", 1, T0), id="bad")
    await pub.publish(submitted("good", "vision", 1, T0), id="good")
    async with probe_host(nats_server.url, evolve=evolve) as host:
        await eventually(lambda: [e.job_id for e in host.state] == ["good"])
        await eventually(lambda: host.stats.dead == 1)
    dead = await dead_letters(js)
    assert [h[DEAD_REASON] for _, h, _ in dead] == ["evolve_failed"]
    assert "KeyError" in dead[0][1]["chamber-dead-detail"]


async def test_the_recorder_dead_letters_a_crafted_sample_once_and_keeps_running(
    nats_server: NatsServerProcess, js: JetStreamContext, tmp_path: Path
) -> None:
    warehouse = ChdbWarehouse(tmp_path)
    migrate(warehouse)
    subject = "chamber.telemetry.sample.c1.n1"
    good_headers, good_body = encode(a_sample("n1", T0, [10.0, 20.0]), source="test", id="good")
    crafted = {**good_headers, "ce-id": "crafted", "Nats-Msg-Id": "crafted", EXPECTED_SEQ: "0"}
    await js.publish(subject, b'{"cluster": "c1", "gpus": [{"index": "x"}]}', headers=crafted)
    stop, task, writer = await start_recorder(nats_server.url, warehouse)
    try:
        await js.publish(subject, good_body, headers=good_headers)
        await eventually(lambda: warehouse.count("gpu_samples") == 2, within=30)
        await asyncio.sleep(1.0)  # a loop would show as a second copy or a finished service
        assert not task.done()
        [(_, dead, _)] = await dead_letters(js)
        assert dead[DEAD_REASON] in ("invalid", "malformed") and dead["chamber-dead-subject"] == subject
        assert dead[f"{DEAD_ORIGINAL}{EXPECTED_SEQ}"] == "0"
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        writer.close()
        warehouse.close()
