"""The decider host's options, against a real nats-server: acting on folded events (`on_event`),
deciding right after a fold (`decide_on_fold`), and catching up on an input whose filter skips
most of its stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.js import JetStreamContext

from events import Event, JobStarted, JobSubmitted
from events.codec import stable_id
from services.runtime import Publisher
from services.runtime.decider import Decider, DeciderHost, Input
from services.runtime.host import ServiceContext, serve
from services.runtime.nats_server import NatsServerProcess
from tests.integration.test_runtime import eventually
from tests.scheduler_builders import a_job

pytestmark = pytest.mark.integration


def _start_every_job(state: dict[str, set[str]], now: float) -> list[tuple[Event, str]]:
    """Decide: every submitted job not started yet is started (a stand-in policy, pure)."""
    return [
        (JobStarted(job_id=job, at=now), stable_id("started", job))
        for job in sorted(state["submitted"] - state["started"])
    ]


def _fold(state: dict[str, set[str]], event: Event) -> None:
    if isinstance(event, JobSubmitted):
        state["submitted"].add(event.job_id)
    elif isinstance(event, JobStarted):
        state["started"].add(event.job_id)


@contextlib.asynccontextmanager
async def host(url: str, **options: Any) -> AsyncIterator[DeciderHost[dict[str, set[str]]]]:
    stop = asyncio.Event()
    hosts: list[DeciderHost[dict[str, set[str]]]] = []

    async def setup(ctx: ServiceContext) -> None:
        decider = Decider(
            name="options-probe",
            inputs=options.pop("inputs", (Input("JOBS"),)),
            initial=lambda: {"submitted": set(), "started": set()},
            evolve=_fold,
            **options,
        )
        h: DeciderHost[dict[str, set[str]]] = DeciderHost(decider, ctx)
        h.install()
        hosts.append(h)

    task = asyncio.create_task(serve("options-probe", url, setup, stop, health_port=None))
    try:
        await eventually(lambda: bool(hosts) and hosts[0].ready)
        yield hosts[0]
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_on_event_sees_the_live_events_not_the_replay(
    nats_server: NatsServerProcess, js: JetStreamContext
) -> None:
    publisher = Publisher(js, source="test")
    await publisher.publish(a_job("old-1"))
    await publisher.publish(a_job("old-2"))
    seen: list[Event] = []
    async with host(nats_server.url, on_event=seen.append) as h:
        assert h.state["submitted"] == {"old-1", "old-2"} and seen == []  # replayed, not acted on
        await publisher.publish(a_job("new-1"))
        await eventually(lambda: [getattr(e, "job_id", None) for e in seen] == ["new-1"])


async def test_decide_on_fold_decides_without_waiting_for_the_tick(
    nats_server: NatsServerProcess, js: JetStreamContext
) -> None:
    publisher = Publisher(js, source="test")
    # An hour between ticks: only a decision made right after the fold can start the job in time.
    async with host(nats_server.url, decide=_start_every_job, tick_s=3600.0, decide_on_fold=True) as h:
        await publisher.publish(a_job("j1"))
        await eventually(lambda: h.state["started"] == {"j1"})  # decided, published, folded back from the log


async def test_an_input_whose_filter_skips_most_of_its_stream_still_catches_up(
    nats_server: NatsServerProcess, js: JetStreamContext
) -> None:
    """A last-per-subject consumer whose filter matches nothing reports a delivered stream sequence
    past the messages it skipped; catching up is counted by what it delivered (health reads the last
    sample of every node from TELEMETRY, which also holds inventories)."""
    publisher = Publisher(js, source="test")
    for i in range(5):
        await publisher.publish(a_job(f"j{i}"))  # chamber.jobs.j<i>: not what the filter asks for
    async with host(
        nats_server.url, inputs=(Input("JOBS", ("chamber.jobs.*.perf",), deliver="last_per_subject"),)
    ) as h:
        assert h.ready and h.state["submitted"] == set()
