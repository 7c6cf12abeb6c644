"""Trace context on the wire (issue 16, finding 12): a command's trace continues in the event it
records, and events decided on a timer still carry a `traceparent` of their own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from opentelemetry import trace

from events import JobScheduled, JobSubmitted, decode
from services.runtime import Publisher
from services.runtime.commands import request
from services.runtime.tracing import configure_tracing, tracer
from tests.integration.test_runtime import eventually
from tests.integration.test_scheduler_service import Running, answers
from tests.scheduler_builders import a_node, a_quota
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration


def trace_id(traceparent: str | None) -> str:
    assert traceparent, "no traceparent"
    version, tid, span, _flags = traceparent.split("-")
    assert version == "00" and len(tid) == 32 and len(span) == 16
    return tid


async def test_a_submit_commands_trace_continues_in_the_event_it_records(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    from services.scheduler import service as scheduler_service

    configure_tracing("test")
    seen: list[Any] = []

    async def on(msg: Any) -> None:
        seen.append(decode(msg.headers, msg.data))

    sub = await nc.subscribe("chamber.jobs.>", cb=on)
    publisher = Publisher(js, source="test/setup")
    await publisher.publish(a_node("n1", gpus=4))
    await publisher.publish(a_quota("vision", 4))
    sched = Running(scheduler_service, nats_server.url_for("scheduler"))
    try:
        await eventually(lambda: answers(nc, "scheduler", "queue", {}))
        with tracer.start_as_current_span("operator submits") as span:
            ours = format(span.get_span_context().trace_id, "032x")
            await request(nc, "scheduler", "submit", {"team": "vision", "gpus": 2, "id": "traced"})

        def of(kind: type) -> list[Any]:
            return [e for e in seen if isinstance(e.event, kind) and e.event.job_id == "traced"]

        await eventually(lambda: bool(of(JobSubmitted)) and bool(of(JobScheduled)))
        assert trace_id(of(JobSubmitted)[0].traceparent) == ours
        # the placement is decided on the scheduler's timer: a trace of its own, but never none
        assert trace_id(of(JobScheduled)[0].traceparent) != "0" * 32
    finally:
        await sub.unsubscribe()
        await sched.close()


async def test_an_event_published_outside_any_span_starts_a_trace(js: JetStreamContext, nc: Client) -> None:
    got: asyncio.Queue[Any] = asyncio.Queue()

    async def on(msg: Any) -> None:
        await got.put(msg)

    sub = await nc.subscribe("chamber.fleet.>", cb=on)
    assert not trace.get_current_span().get_span_context().is_valid
    await Publisher(js, source="test/discovery").publish(a_node("n2", gpus=1))
    msg = await asyncio.wait_for(got.get(), 10)
    await sub.unsubscribe()
    assert trace_id(decode(msg.headers, msg.data).traceparent)


async def test_an_event_a_consumer_publishes_while_handling_another_continues_its_trace(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    from events import JobCompleted
    from services.runtime import ConsumerOptions, Delivery
    from services.runtime.host import ServiceContext, serve

    got: asyncio.Queue[Any] = asyncio.Queue()

    async def on(msg: Any) -> None:
        envelope = decode(msg.headers, msg.data)
        if isinstance(envelope.event, JobCompleted):
            await got.put(envelope)

    sub = await nc.subscribe("chamber.jobs.>", cb=on)
    stop = asyncio.Event()

    async def setup(ctx: ServiceContext) -> None:
        async def finish(delivery: Delivery) -> None:  # a process manager: submitted -> completed
            event = delivery.envelope.event
            if isinstance(event, JobSubmitted):
                await ctx.publisher.publish(JobCompleted(job_id=event.job_id, at=2.0))

        ctx.consume(ConsumerOptions(stream="JOBS", durable=None), handler=finish)

    task = asyncio.create_task(serve("finisher", nats_server.url, setup, stop))
    try:
        submitted = await Publisher(js, source="test/cli").publish_many([(a_submitted("t-1"), "t-1", 1.0)])
        assert submitted[0].seq >= 1
        completed = await asyncio.wait_for(got.get(), 20)
        [sent] = [m async for m in _jobs_of(js, "t-1") if isinstance(m.event, JobSubmitted)]
        assert trace_id(completed.traceparent) == trace_id(sent.traceparent)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await sub.unsubscribe()


async def _jobs_of(js: JetStreamContext, job: str) -> Any:
    sub = await js.subscribe(f"chamber.jobs.{job}", ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1)
            except TimeoutError:
                return
            yield decode(msg.headers, msg.data)
    finally:
        await sub.unsubscribe()


def a_submitted(job: str) -> JobSubmitted:
    from events import JobSpec

    return JobSubmitted(job_id=job, at=1.0, spec=JobSpec(team="vision", gpus_per_replica=1))
