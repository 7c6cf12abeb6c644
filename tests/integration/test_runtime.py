"""The runtime against a real nats-server: dead letters, dedup, crash and restart without loss."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from nats.js import JetStreamContext
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from events import JobSubmitted, encode, subject_for
from events.codec import DEFAULT_MAX_BYTES
from services.runtime import (
    DEAD_REASON,
    Consumer,
    ConsumerOptions,
    Delivery,
    Publisher,
    Snapshot,
    SnapshotStore,
    TransientError,
    connect,
    ensure_streams,
)
from services.runtime.nats_server import NatsServerProcess
from tests.builders import a_job_submitted

pytestmark = pytest.mark.integration


async def eventually(check: Callable[[], bool | Awaitable[bool]], within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def settled(js: JetStreamContext, stream: str, durable: str, within: float = 10.0) -> None:
    """The consumer has nothing pending and nothing awaiting an ack. Acks are fire and forget: the
    server applies them on its own time, so a consumer_info right after may still count some."""

    async def check() -> bool:
        info = await js.consumer_info(stream, durable)
        return info.num_pending == 0 and info.num_ack_pending == 0

    await eventually(check, within)


class Collector:
    def __init__(self) -> None:
        self.seen: list[Delivery] = []

    async def __call__(self, delivery: Delivery) -> None:
        self.seen.append(delivery)

    @property
    def job_ids(self) -> list[str]:
        return [d.envelope.event.job_id for d in self.seen]  # type: ignore[attr-defined]


async def run_consumer(consumer: Consumer) -> tuple[asyncio.Event, asyncio.Task[None]]:
    stop = asyncio.Event()
    await consumer.start()
    return stop, asyncio.create_task(consumer.run(stop))


async def dead_letters(js: JetStreamContext) -> list[tuple[str, dict[str, str], bytes]]:
    sub = await js.subscribe("chamber.dead.>", ordered_consumer=True)
    out = []
    try:
        while True:
            msg = await sub.next_msg(timeout=0.5)
            out.append((msg.subject, dict(msg.headers or {}), msg.data))
    except TimeoutError:
        pass
    finally:
        await sub.unsubscribe()
    return out


async def test_streams_are_created_idempotently(js: JetStreamContext) -> None:
    assert await ensure_streams(js) == []  # the fixture created them; a second call changes nothing
    info = await js.stream_info("TELEMETRY")
    assert info.config.max_age == 15 * 60  # minutes with a byte cap: the warehouse is the history
    assert info.config.max_bytes == 1024 * 1024 * 1024
    assert info.config.duplicate_window == 120


async def test_a_drifted_stream_is_updated_to_the_design(js: JetStreamContext) -> None:
    info = await js.stream_info("FAULTS")
    info.config.max_age = 3600.0
    await js.update_stream(info.config)
    assert await ensure_streams(js) == ["updated FAULTS"]
    assert (await js.stream_info("FAULTS")).config.max_age == 30 * 24 * 3600


async def test_poison_messages_go_to_the_dead_letter_subject_and_the_consumer_goes_on(
    js: JetStreamContext,
) -> None:
    good_headers, good_body = encode(a_job_submitted("good-1"), source="test", id="g1")
    headers2, body2 = encode(a_job_submitted("good-2"), source="test", id="g2")
    poison = {
        "malformed": (dict(good_headers, **{"Nats-Msg-Id": "p1"}), b"{this is not json"),
        "invalid": (dict(good_headers, **{"Nats-Msg-Id": "p2"}), good_body.replace(b'"good-1"', b"17")),
        "oversized": (
            dict(good_headers, **{"Nats-Msg-Id": "p3"}),
            good_body + b" " * (DEFAULT_MAX_BYTES + 1),
        ),
        "unknown_version": (
            dict(good_headers, **{"Nats-Msg-Id": "p4", "ce-type": "io.chamber.jobs.submitted.v7"}),
            good_body,
        ),
        "envelope": ({"Nats-Msg-Id": "p5"}, good_body),
    }
    await js.publish("chamber.jobs.good-1", good_body, headers=good_headers)
    for headers, body in poison.values():
        await js.publish("chamber.jobs.poison", body, headers=headers)
    await js.publish("chamber.jobs.good-2", body2, headers=headers2)

    seen = Collector()
    consumer = Consumer(js, ConsumerOptions(stream="JOBS", durable="t-dead"), handler=seen)
    stop, task = await run_consumer(consumer)
    await eventually(lambda: consumer.stats.handled == 2 and consumer.stats.dead == len(poison))
    stop.set()
    await task

    assert seen.job_ids == ["good-1", "good-2"]
    dead = await dead_letters(js)
    assert sorted(h[DEAD_REASON] for _, h, _ in dead) == sorted(poison)
    for subject, headers, body in dead:
        assert subject == "chamber.dead.jobs"
        assert headers["chamber-dead-subject"] == "chamber.jobs.poison"
        assert headers["chamber-dead-detail"]
        assert body == poison[headers[DEAD_REASON]][1]  # original bytes kept: nothing lost
    await settled(js, "JOBS", "t-dead")


async def test_unknown_event_types_are_skipped_not_dead_lettered(js: JetStreamContext) -> None:
    headers, body = encode(a_job_submitted("x"), source="test", id="u1")
    await js.publish("chamber.jobs.x", body, headers={**headers, "ce-type": "io.chamber.jobs.teleported.v1"})
    consumer = Consumer(js, ConsumerOptions(stream="JOBS", durable="t-unknown"), handler=Collector())
    stop, task = await run_consumer(consumer)
    await eventually(lambda: consumer.stats.skipped == 1)
    stop.set()
    await task
    assert consumer.stats.dead == 0 and await dead_letters(js) == []


async def test_duplicates_by_message_id_are_dropped(js: JetStreamContext) -> None:
    publisher = Publisher(js, source="test")
    event = a_job_submitted("dup")
    first = await publisher.publish(event, id="same-id")
    second = await publisher.publish(event, id="same-id")
    assert not first.duplicate and second.duplicate
    info = await js.stream_info("JOBS")
    assert info.state.messages == 1


async def test_transient_failures_are_retried_in_order_without_loss(js: JetStreamContext) -> None:
    publisher = Publisher(js, source="test")
    await publisher.publish_many((a_job_submitted(f"j{i}"), f"id{i}", None) for i in range(5))
    failures = {"left": 2}
    seen = Collector()

    async def flaky(delivery: Delivery) -> None:
        if delivery.envelope.event.job_id == "j2" and failures["left"]:  # type: ignore[attr-defined]
            failures["left"] -= 1
            raise TransientError("warehouse unavailable")
        await seen(delivery)

    consumer = Consumer(js, ConsumerOptions(stream="JOBS", durable="t-retry", retry_delay_s=0.05), handler=flaky)
    stop, task = await run_consumer(consumer)
    await eventually(lambda: len(seen.seen) == 5)
    stop.set()
    await task
    assert seen.job_ids == ["j0", "j1", "j2", "j3", "j4"]
    assert consumer.stats.dead == 0


async def test_a_handler_that_keeps_crashing_is_dead_lettered_after_max_deliver(js: JetStreamContext) -> None:
    publisher = Publisher(js, source="test")
    await publisher.publish_many([(a_job_submitted("bad"), "b", None), (a_job_submitted("ok"), "o", None)])
    seen = Collector()

    async def buggy(delivery: Delivery) -> None:
        if delivery.envelope.event.job_id == "bad":  # type: ignore[attr-defined]
            raise ZeroDivisionError("bug")
        await seen(delivery)

    options = ConsumerOptions(stream="JOBS", durable="t-bug", max_attempts=3, retry_delay_s=0.02)
    consumer = Consumer(js, options, handler=buggy)
    stop, task = await run_consumer(consumer)
    await eventually(lambda: seen.job_ids == ["ok"])
    stop.set()
    await task
    dead = await dead_letters(js)
    assert [h[DEAD_REASON] for _, h, _ in dead] == ["handler_failed"]
    assert "ZeroDivisionError" in dead[0][1]["chamber-dead-detail"]


async def test_a_consumer_restarted_after_a_crash_continues_after_the_last_acked_message(
    nats_server: NatsServerProcess,
) -> None:
    nc = await connect(nats_server.url, name="producer")
    js = nc.jetstream()
    await ensure_streams(js)
    publisher = Publisher(js, source="test")
    await publisher.publish_many((a_job_submitted(f"j{i:02d}"), f"id{i}", None) for i in range(20))

    # First life: handles ten messages, then the process "crashes" (connection dropped, no drain).
    crashed = await connect(nats_server.url, name="service-1")
    first = Collector()

    async def handle_ten(delivery: Delivery) -> None:
        if len(first.seen) >= 10:
            raise TransientError("crashing")
        await first(delivery)

    options = ConsumerOptions(stream="JOBS", durable="svc", batch=4, ack_wait_s=1.0, retry_delay_s=5.0)
    consumer = Consumer(crashed.jetstream(), options, handler=handle_ten)
    _stop, task = await run_consumer(consumer)
    await eventually(lambda: len(first.seen) == 10)

    async def acked_ten() -> bool:  # the server has the ten acks before the "crash"
        return (await js.consumer_info("JOBS", "svc")).ack_floor.stream_seq >= 10

    await eventually(acked_ten)
    task.cancel()
    await crashed.close()

    # Second life: a new process with the same durable gets exactly the unacked rest. The two messages the
    # dead process held come back once their ack wait expires, so they may follow the never-delivered ones.
    again = await connect(nats_server.url, name="service-2")
    second = Collector()
    consumer2 = Consumer(again.jetstream(), options, handler=second)
    stop2, task2 = await run_consumer(consumer2)
    await eventually(lambda: len(second.seen) == 10, within=15)
    stop2.set()
    await task2
    assert first.job_ids == [f"j{i:02d}" for i in range(10)]
    assert sorted(second.job_ids) == [f"j{i:02d}" for i in range(10, 20)]
    await again.close()
    await nc.close()


async def test_a_server_killed_and_restarted_loses_nothing_that_was_acked(
    nats_server: NatsServerProcess,
) -> None:
    nc = await connect(nats_server.url, name="service")
    js = nc.jetstream()
    await ensure_streams(js)
    publisher = Publisher(js, source="test")
    acks = await publisher.publish_many((a_job_submitted(f"j{i:03d}"), f"id{i}", None) for i in range(200))
    assert len(acks) == 200
    seen = Collector()
    consumer = Consumer(js, ConsumerOptions(stream="JOBS", durable="svc", batch=50), handler=seen)
    stop, task = await run_consumer(consumer)
    await eventually(lambda: len(seen.seen) >= 50)

    nats_server.kill()  # kill -9 while the consumer is running
    await asyncio.sleep(0.3)
    nats_server.start()

    await eventually(lambda: nc.is_connected, within=15)
    await publisher.publish_many((a_job_submitted(f"j{i:03d}"), f"id{i}", None) for i in range(200, 250))
    await eventually(lambda: len({*seen.job_ids}) == 250, within=30)
    stop.set()
    await task
    info = await js.stream_info("JOBS")
    assert info.state.messages == 250
    assert sorted(set(seen.job_ids)) == [f"j{i:03d}" for i in range(250)]
    await nc.close()


async def test_snapshots_store_state_with_the_positions_they_cover(js: JetStreamContext) -> None:
    store = SnapshotStore(js)
    assert await store.load("scheduler") is None
    await store.save(Snapshot(service="scheduler", taken_at=10.0, positions={"JOBS": 41}, state=b'{"q":[]}'))
    await store.save(Snapshot(service="scheduler", taken_at=20.0, positions={"JOBS": 99}, state=b'{"q":[1]}'))
    loaded = await store.load("scheduler")
    assert loaded is not None
    assert loaded.positions == {"JOBS": 99} and loaded.state == b'{"q":[1]}'


async def test_replay_from_a_snapshot_position_starts_after_it(js: JetStreamContext) -> None:
    publisher = Publisher(js, source="test")
    acks = await publisher.publish_many((a_job_submitted(f"j{i}"), f"id{i}", None) for i in range(6))
    covered = acks[2].seq
    seen = Collector()
    consumer = Consumer(js, ConsumerOptions(stream="JOBS", durable=None, start_seq=covered + 1), handler=seen)
    stop, task = await run_consumer(consumer)
    await eventually(lambda: len(seen.seen) == 3)
    stop.set()
    await task
    assert seen.job_ids == ["j3", "j4", "j5"]


async def test_batch_handlers_ack_only_after_the_whole_batch_is_stored(js: JetStreamContext) -> None:
    publisher = Publisher(js, source="test")
    await publisher.publish_many((a_job_submitted(f"j{i}"), f"id{i}", None) for i in range(30))
    stored: list[str] = []
    calls = {"n": 0}

    async def store(batch: list[Delivery]) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise TransientError("warehouse down")
        stored.extend(d.envelope.event.job_id for d in batch)  # type: ignore[attr-defined]

    options = ConsumerOptions(stream="JOBS", durable="rec", batch=30, retry_delay_s=0.05)
    consumer = Consumer(js, options, batch_handler=store)
    stop, task = await run_consumer(consumer)
    await eventually(lambda: len(stored) == 30)
    stop.set()
    await task
    assert stored == [f"j{i}" for i in range(30)]


async def test_each_handled_message_gets_a_span_continuing_the_producers_trace(js: JetStreamContext) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    from services.runtime import tracing

    original = tracing.tracer, tracing._exporting
    tracing.tracer = provider.get_tracer("chamber")
    tracing._exporting = True  # a span per message only when spans leave the process
    try:
        with tracer.start_as_current_span("submit") as producer_span:
            await Publisher(js, source="test").publish(a_job_submitted("traced"), id="t1")
        consumer = Consumer(js, ConsumerOptions(stream="JOBS", durable="traced"), handler=Collector())
        stop, task = await run_consumer(consumer)
        await eventually(lambda: consumer.stats.handled == 1)
        stop.set()
        await task
    finally:
        tracing.tracer, tracing._exporting = original
    spans = [s for s in exporter.get_finished_spans() if s.name == "process JOBS"]
    assert len(spans) == 1
    assert spans[0].context.trace_id == producer_span.get_span_context().trace_id
    assert spans[0].attributes["messaging.message.id"] == "t1"
    assert spans[0].kind == trace.SpanKind.CONSUMER


async def test_publish_uses_the_subject_of_the_event(js: JetStreamContext) -> None:
    event: JobSubmitted = a_job_submitted("Team.Job/7")
    ack = await Publisher(js, source="test").publish(event, id="s1")
    msg = await js.get_msg("JOBS", ack.seq)
    assert msg.subject == subject_for(event) == "chamber.jobs.team_job_7"
