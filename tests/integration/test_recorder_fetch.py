"""The recorder's batched TELEMETRY pull against a real nats-server: whole batches, a quiet stream,
and messages in hand handed back at stop so the next consumer gets them at once."""

from __future__ import annotations

import asyncio

import nats.errors
import pyarrow as pa
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from services.recorder.samples import SampleConsumer, SubjectRate
from services.runtime import ConsumerOptions, Publisher
from tests.integration.test_runtime import eventually, settled
from tests.warehouse_builders import T0, a_sample

pytestmark = pytest.mark.integration


async def publish_samples(js: JetStreamContext, n: int, node: str = "n1") -> None:
    pub = Publisher(js, source="test")
    await pub.publish_many((a_sample(node, T0 + i, [50.0], seq=i), f"{node}-{i}", None) for i in range(n))


def options(**overrides: object) -> ConsumerOptions:
    base = {"stream": "TELEMETRY", "durable": "recorder", "batch": 10, "fetch_timeout_s": 0.3, "ack_wait_s": 30.0}
    return ConsumerOptions(**{**base, **overrides})  # type: ignore[arg-type]


async def _nothing(*_: object) -> None:
    return None


async def test_a_backlog_comes_in_whole_batches_and_a_quiet_stream_returns_empty_within_the_timeout(
    nc: Client, js: JetStreamContext
) -> None:
    await publish_samples(js, 25)
    expiry = 1.5  # the pull request's own expiry (the long poll on a quiet stream)
    consumer = SampleConsumer(
        js, nc=nc, options=options(fetch_timeout_s=expiry), batch_handler=_nothing, table_handler=_nothing
    )
    await consumer.start()
    try:
        sizes = []
        for _ in range(3):
            msgs = await consumer.fetch()
            sizes.append(len(msgs))
            for msg in msgs:
                await msg.ack()
        assert sizes == [10, 10, 5]
        assert await asyncio.wait_for(consumer.fetch(), expiry + 2.0) == []  # the pull's expiry, not a hang
        waiting = asyncio.create_task(consumer.fetch())  # a long poll, then a message arrives
        puller = consumer.puller
        assert puller is not None
        await eventually(lambda: puller.requesting, within=2)  # the long poll is open
        await js.publish("chamber.telemetry.sample.c1.n1", b"{}")
        # handed on when it came: waiting for the request's expiry would miss this deadline
        assert len(await asyncio.wait_for(waiting, expiry / 2)) == 1
    finally:
        await consumer.unsubscribe()


async def test_messages_in_hand_at_stop_are_handed_back_not_left_to_time_out(nc: Client, js: JetStreamContext) -> None:
    await publish_samples(js, 5)
    first = SampleConsumer(js, nc=nc, options=options(ack_wait_s=60.0), batch_handler=_nothing, table_handler=_nothing)
    await first.start()
    # Delivered but not yet taken (e.g. a request asked again across a reconnect): in hand, not handled.
    puller = first.puller
    assert puller is not None
    await puller.request(5, 1.0)
    await eventually(lambda: puller.ready == 5, within=5)
    await first.unsubscribe()

    second = SampleConsumer(js, nc=nc, options=options(ack_wait_s=60.0), batch_handler=_nothing, table_handler=_nothing)
    await second.start()
    try:
        msgs = await second.fetch()  # at once, not after the 60 s ack wait
        assert [m.metadata.sequence.stream for m in msgs] == [1, 2, 3, 4, 5]
        assert all(m.metadata.num_delivered == 2 for m in msgs)
    finally:
        await second.unsubscribe()


async def test_a_refused_pull_is_an_error_the_run_loop_backs_off_from_not_an_empty_batch(
    nc: Client, js: JetStreamContext
) -> None:
    await publish_samples(js, 1)
    consumer = SampleConsumer(
        js, nc=nc, options=options(fetch_timeout_s=5.0), batch_handler=_nothing, table_handler=_nothing
    )
    await consumer.start()
    try:
        assert len(await consumer.fetch()) == 1
        waiting = asyncio.create_task(consumer.fetch())  # a long poll on a quiet stream
        puller = consumer.puller
        assert puller is not None
        await eventually(lambda: puller.requesting, within=2)
        await js.delete_consumer("TELEMETRY", "recorder")  # the server ends the poll with a 409
        with pytest.raises(nats.errors.Error, match="409"):
            await asyncio.wait_for(waiting, 3)
    finally:
        await consumer.unsubscribe()


async def test_a_fetch_stops_at_its_byte_bound_and_the_next_one_goes_on(nc: Client, js: JetStreamContext) -> None:
    from services.recorder.samples import MIN_FETCH_MAX_BYTES

    body = b"x" * 300_000  # large samples: a batch of 10 would be 3 MB
    for i in range(10):
        await js.publish(f"chamber.telemetry.sample.c1.n{i}", body)
    consumer = SampleConsumer(
        js,
        options(batch=10),
        nc=nc,
        batch_handler=_nothing,
        table_handler=_nothing,
        fetch_max_bytes=MIN_FETCH_MAX_BYTES,
    )
    await consumer.start()
    try:
        sizes = []
        while sum(sizes) < 10:
            msgs = await consumer.fetch()  # the server's "409 Message Size Exceeds MaxBytes" ends it, no error
            assert msgs, "a fetch came back empty with messages waiting"
            sizes.append(len(msgs))
            for msg in msgs:
                await msg.ack()
        assert max(sizes) * len(body) <= MIN_FETCH_MAX_BYTES and len(sizes) >= 3
    finally:
        await consumer.unsubscribe()


def test_a_byte_bound_below_the_largest_message_is_refused(nc: Client, js: JetStreamContext) -> None:
    from services.recorder.samples import MIN_FETCH_MAX_BYTES

    with pytest.raises(ValueError, match="largest message"):
        SampleConsumer(
            js, nc=nc, options=options(), batch_handler=_nothing, table_handler=_nothing, fetch_max_bytes=1024
        )
    assert MIN_FETCH_MAX_BYTES > 1024 * 1024


async def test_a_node_over_its_rate_is_stored_only_up_to_it_and_the_others_in_full(
    nc: Client, js: JetStreamContext
) -> None:
    """Per subject and minute of the server's clock: a flooding node's excess is acknowledged
    without being stored, and another node's samples all are."""
    await publish_samples(js, 30, node="flood")
    await publish_samples(js, 4, node="calm")
    stored: list[str] = []

    async def keep(table: pa.Table, _suspect: bool) -> None:
        stored.extend(table.column("node").to_pylist())

    rate = SubjectRate(per_minute=5)
    consumer = SampleConsumer(
        js, nc=nc, options=options(batch=50), batch_handler=_nothing, table_handler=keep, rate=rate
    )
    await consumer.start()
    try:
        await consumer.process(await consumer.fetch())
    finally:
        await consumer.unsubscribe()
    # 5 a minute: 10 if the publishing straddled the turn of a minute
    assert stored.count("calm") == 4 and stored.count("flood") in (5, 10)
    assert stored.count("flood") + rate.refused["chamber.telemetry.sample.c1.flood"] == 30
    await nc.flush()
    await settled(js, "TELEMETRY", "recorder")  # the refused ones are acknowledged too
