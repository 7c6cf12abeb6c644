"""A snapshot is the base of replay (issue 14 item 3): history below it can be trimmed without losing
state; a snapshot the build cannot trust is refused and the log replayed; history trimmed past what a
service folded is reported, not silently lost. Real nats-server, real decider host."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from events import Event, JobSubmitted
from events.codec import stable_id
from services.runtime import Publisher
from services.runtime.decider import Decider, DeciderHost, Input, pickle_codec, snapshot_format
from services.runtime.host import ServiceContext, serve
from services.runtime.nats_server import NatsServerProcess
from services.runtime.snapshots import Snapshot, SnapshotStore
from tests.integration.test_runtime import eventually
from tests.scheduler_builders import a_job

pytestmark = pytest.mark.integration


@dataclass
class Submitted:
    jobs: list[str] = field(default_factory=list)
    setting: str = "first"  # a service setting (like a retention window) the state is folded under


def fold(state: Submitted, event: Event) -> None:
    if isinstance(event, JobSubmitted):
        state.jobs.append(event.job_id)


CODEC = pickle_codec(Submitted, version=1)


@contextlib.asynccontextmanager
async def host(url: str, setting: str = "first") -> AsyncIterator[DeciderHost[Submitted]]:
    """A decider with snapshots over JOBS; saves its snapshot when it stops."""
    stop = asyncio.Event()
    hosts: list[DeciderHost[Submitted]] = []

    async def setup(ctx: ServiceContext) -> None:
        decider = Decider(
            name="trimmed",
            inputs=(Input("JOBS"),),
            initial=lambda: Submitted(setting=setting),
            evolve=fold,
            snapshot=CODEC,
        )
        hosts.append(DeciderHost(decider, ctx))
        hosts[0].install()

    task = asyncio.create_task(serve("trimmed", url, setup, stop, health_port=None))
    try:
        await eventually(lambda: bool(hosts) and hosts[0].ready)
        yield hosts[0]
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def submit(js: JetStreamContext, *jobs: str) -> None:
    pub = Publisher(js, source="test/trim")
    for job in jobs:
        await pub.publish(a_job(job, at=1.0), id=stable_id("submitted", job))


async def test_a_restart_after_trimming_below_the_snapshot_restores_the_same_state(
    nats_server: NatsServerProcess, js: JetStreamContext
) -> None:
    await submit(js, "a", "b", "c")
    async with host(nats_server.url) as h:
        assert h.state.jobs == ["a", "b", "c"]
    snap = await SnapshotStore(js).load("trimmed")
    assert snap is not None and snap.positions["JOBS"] == 3

    await js.purge_stream("JOBS", seq=snap.positions["JOBS"] + 1)  # keep only what the snapshot does not cover
    await submit(js, "d", "e")
    info = await js.stream_info("JOBS")
    assert (info.state.first_seq, info.state.messages) == (4, 2)

    async with host(nats_server.url) as h:
        assert h.state.jobs == ["a", "b", "c", "d", "e"]  # as if the history were all there
        assert h.stats.restored_from == {"JOBS": 3} and not h.stats.trimmed


async def test_a_snapshot_of_another_build_is_refused_and_the_log_replayed(
    nats_server: NatsServerProcess, js: JetStreamContext
) -> None:
    await submit(js, "a", "b")
    old = Snapshot(
        service="trimmed", taken_at=0.0, positions={"JOBS": 2}, state=b"old bytes", format="pickle-5-oldbuild"
    )
    await SnapshotStore(js).save(old)
    async with host(nats_server.url) as h:
        assert h.state.jobs == ["a", "b"] and not h.stats.restored_from


async def test_a_snapshot_taken_under_other_settings_is_refused_and_the_log_replayed(
    nats_server: NatsServerProcess, js: JetStreamContext
) -> None:
    await submit(js, "a")
    async with host(nats_server.url) as h:
        assert h.state.jobs == ["a"]
    async with host(nats_server.url, setting="second") as h:
        assert h.state == Submitted(jobs=["a"], setting="second") and not h.stats.restored_from
    async with host(nats_server.url, setting="second") as h:  # its own snapshot is used
        assert h.state.jobs == ["a"] and h.stats.restored_from == {"JOBS": 1}


async def test_a_snapshot_naming_a_command_is_refused_not_run(
    nats_server: NatsServerProcess, js: JetStreamContext, tmp_path: Path
) -> None:
    """Whoever can write to the snapshot bucket cannot run code in the service."""
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, (f"touch {marker}",)

    await submit(js, "a")
    evil = Snapshot(
        service="trimmed",
        taken_at=0.0,
        positions={"JOBS": 1},
        state=pickle.dumps(Evil()),
        format=snapshot_format(CODEC, Submitted()),  # the format it would take: only the allow-list stops it
    )
    await SnapshotStore(js).save(evil)
    async with host(nats_server.url) as h:
        assert h.state.jobs == ["a"] and not h.stats.restored_from
    assert not marker.exists()


async def test_history_trimmed_past_what_was_folded_is_reported(
    nats_server: NatsServerProcess, js: JetStreamContext
) -> None:
    await submit(js, "a", "b", "c")
    await js.purge_stream("JOBS", seq=3)  # no snapshot covers a and b
    async with host(nats_server.url) as h:
        assert h.state.jobs == ["c"]
        assert h.stats.trimmed == {"JOBS": (1, 3)}
