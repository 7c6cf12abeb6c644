"""The decider host against a real nats-server: commands refused by the stream, restart from a
snapshot, finished jobs leaving memory, own decisions folded only from the log."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import nats.errors
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import JobScheduled, JobSubmitted
from events.codec import stable_id
from services.runtime import Publisher
from services.runtime.commands import CommandRefused, request
from services.runtime.decider import CommandConflict, Decider, DeciderHost, Input
from services.runtime.host import ServiceContext, serve
from services.runtime.snapshots import SnapshotStore
from services.scheduler import service as scheduler_service
from tests.integration.test_runtime import eventually
from tests.integration.test_scheduler_service import ARGS, JobEvents, Running, answers
from tests.scheduler_builders import a_job, a_node, a_quota
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
async def vision_has_a_quota(js: JetStreamContext) -> None:
    """A team needs a quota before it submits (the scheduler's door)."""
    await Publisher(js, source="test/quota").publish(a_quota("vision", 8), id="vision-quota")


@pytest.fixture
async def watched(nc: Client) -> AsyncIterator[JobEvents]:
    seen = JobEvents()
    sub = await nc.subscribe("chamber.jobs.>", cb=seen.handler)
    yield seen
    await sub.unsubscribe()


def scheduler(url: str, **overrides: Any) -> Running:
    ARGS[scheduler_service].update(retention_hours=24.0, snapshot_every=300.0)
    running = Running(scheduler_service, url)
    running.task.cancel()  # restart it with the overrides
    running.stop = asyncio.Event()
    args = argparse.Namespace(nats=url, **{**ARGS[scheduler_service], **overrides})
    running.task = asyncio.create_task(scheduler_service.run(args, running.stop))
    return running


@contextlib.asynccontextmanager
async def probe_host(url: str, **decider: Any) -> AsyncIterator[DeciderHost[list[Any]]]:
    """A decider host over JOBS whose state is the list of events it folded, once ready (`decider`:
    more `Decider` fields, e.g. a `decide`)."""
    stop = asyncio.Event()
    hosts: list[DeciderHost[list[Any]]] = []

    async def setup(ctx: ServiceContext) -> None:
        probe = Decider(name="probe", inputs=(Input("JOBS"),), initial=list, evolve=lambda s, e: s.append(e))
        host: DeciderHost[list[Any]] = DeciderHost(replace(probe, **decider), ctx)
        host.install()
        hosts.append(host)

    task = asyncio.create_task(serve("probe", url, setup, stop, health_port=None))
    try:
        await eventually(lambda: bool(hosts) and hosts[0].ready)
        yield hosts[0]
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_a_second_submit_with_the_same_id_is_refused_even_when_both_race(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    sched = scheduler(nats_server.url_for("scheduler"))
    await eventually(lambda: answers(nc, "scheduler", "queue", {}))
    payload = {"team": "vision", "gpus": 1, "id": "twice"}
    results = await asyncio.gather(
        request(nc, "scheduler", "submit", payload), request(nc, "scheduler", "submit", payload), return_exceptions=True
    )
    assert sorted(type(r).__name__ for r in results) == ["CommandRefused", "dict"]
    info = await js.stream_info("JOBS", subjects_filter="chamber.jobs.twice")
    assert info.state.subjects == {"chamber.jobs.twice": 1}  # one spec in the log, the one every replica has
    await sched.close()


async def test_a_submit_retried_with_its_request_id_is_applied_once_and_answers_the_same_job(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    """A client that got no answer (a timeout, a 503) and retries with the same request id gets the
    same job back, not a second one; another request id is another job."""
    sched = scheduler(nats_server.url_for("scheduler"))
    await eventually(lambda: answers(nc, "scheduler", "queue", {}))
    payload = {"team": "vision", "gpus": 1, "name": "train", "request_id": "r-1"}
    first = await request(nc, "scheduler", "submit", payload)
    retry = await request(nc, "scheduler", "submit", payload)
    assert retry["id"] == first["id"] and retry.get("duplicate") is True and "duplicate" not in first
    other = await request(nc, "scheduler", "submit", {**payload, "request_id": "r-2"})
    assert other["id"] != first["id"]
    info = await js.stream_info("JOBS", subjects_filter=f"chamber.jobs.{first['id']}")
    assert info.state.subjects == {f"chamber.jobs.{first['id']}": 1}
    with pytest.raises(CommandRefused, match="exists already"):  # the same id from another team is not a retry
        await request(nc, "scheduler", "submit", {**payload, "team": "nlp", "id": first["id"]})
    await sched.close()


async def test_append_with_expected_sequence_zero_is_refused_by_the_stream_for_a_known_subject(
    nats_server: SecuredNatsServer, js: JetStreamContext
) -> None:
    await Publisher(js, source="test/other-replica").publish(a_job("taken", at=1.0), id="first-writer")
    async with probe_host(nats_server.url) as host:
        # The host never saw this id in memory checks: the refusal comes from the stream itself.
        with pytest.raises(CommandConflict):
            await host.append(a_job("taken", at=2.0), id="second-writer", expected_subject_seq=0)
        seq = await host.append(a_job("fresh", at=3.0), id="fresh", expected_subject_seq=0)
        assert host.positions["JOBS"] >= seq  # folded before append returned: read your own writes
        assert [e.job_id for e in host.state if isinstance(e, JobSubmitted)] == ["taken", "fresh"]


async def test_an_append_whose_ack_was_lost_is_retried_and_lands_once_not_as_a_conflict(
    nats_server: SecuredNatsServer, js: JetStreamContext
) -> None:
    """The stream checks the expected subject sequence before it de-duplicates by id, so the retry of
    a try that landed is refused as "wrong last sequence": the host sees its own id there."""
    async with probe_host(nats_server.url) as host:
        publisher = host.ctx.publisher
        real = publisher.publish
        tries: list[str] = []

        async def ack_lost_once(event: Any, **kw: Any) -> Any:
            tries.append(kw["id"])
            ack = await real(event, **kw)  # the second try: "wrong last sequence" from the stream
            if len(tries) == 1:
                raise nats.errors.TimeoutError  # it landed; the ack never came back
            return ack

        publisher.publish = ack_lost_once  # type: ignore[method-assign]
        seq = await host.append(a_job("lost-ack", at=1.0), id="lost-ack", expected_subject_seq=0)
        assert tries == ["lost-ack", "lost-ack"]
        info = await js.stream_info("JOBS", subjects_filter="chamber.jobs.lost-ack")
        assert info.state.subjects == {"chamber.jobs.lost-ack": 1}
        assert host.positions["JOBS"] >= seq
        # another writer's message in between is still a conflict
        tries.clear()
        await Publisher(js, source="test/other-replica").publish(a_job("taken2", at=1.0), id="other")
        with pytest.raises(CommandConflict):
            await host.append(a_job("taken2", at=2.0), id="mine", expected_subject_seq=0)


async def test_a_restart_starts_from_the_snapshot_and_decides_nothing_twice(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, watched: JobEvents
) -> None:
    await Publisher(js, source="test/discovery").publish(a_node("n1", gpus=2))
    sched = scheduler(nats_server.url_for("scheduler"))
    await eventually(lambda: answers(nc, "scheduler", "queue", {}))
    await request(nc, "scheduler", "submit", {"team": "vision", "gpus": 2, "id": "runs"})
    await request(nc, "scheduler", "submit", {"team": "vision", "gpus": 2, "id": "waits"})
    await eventually(lambda: bool(watched.of(JobScheduled, "runs")))

    async def folded_its_decision() -> bool:  # the echo of its own JobScheduled, not only the publish
        answer = await request(nc, "scheduler", "explain", {"job": "runs"}, timeout=2.0)
        return bool(answer.get("placement"))

    await eventually(folded_its_decision)
    await sched.close()  # saves a snapshot on the way out
    snap = await SnapshotStore(js).load("scheduler")
    assert snap is not None and snap.positions["JOBS"] >= 3 and snap.positions["FLEET"] == 1

    # Something happened while it was down: the tail after the snapshot is folded on top of it.
    await Publisher(js, source="test/executor").publish(
        a_job("late", at=time.time(), gpus=2), id=stable_id("submitted", "late")
    )
    sched = scheduler(nats_server.url_for("scheduler"))
    await eventually(lambda: answers(nc, "scheduler", "queue", {}))

    async def queue_is_complete() -> bool:
        jobs = (await request(nc, "scheduler", "queue", {}))["jobs"]
        return {(j["id"], j["state"]) for j in jobs} == {("runs", "running"), ("waits", "pending"), ("late", "pending")}

    await eventually(queue_is_complete)
    await request(nc, "scheduler", "cancel", {"job": "runs"})
    await eventually(lambda: bool(watched.of(JobScheduled, "waits")))  # submitted before "late": first
    assert len(watched.of(JobScheduled, "runs")) == 1  # not decided again after the restart
    assert not watched.of(JobScheduled, "late")
    await sched.close()


async def test_finished_jobs_leave_memory_after_the_retention_window_and_explain_reads_the_log(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    publisher = Publisher(js, source="test/executor")
    sched = scheduler(nats_server.url_for("scheduler"), retention_hours=1.0)
    await eventually(lambda: answers(nc, "scheduler", "queue", {}))
    await publisher.publish(a_job("old", at=1_000.0), id="old")
    await publisher.publish(
        __import__("events").JobCancelled(job_id="old", at=1_001.0, reason="test"), id="old-cancelled"
    )
    await publisher.publish(a_job("new", at=1_001.0 + 2 * 3600), id="new")  # two hours of JOBS time later

    async def forgotten() -> bool:
        return "from the log" in (await request(nc, "scheduler", "explain", {"job": "old"}))["text"]

    await eventually(forgotten)
    explained = await request(nc, "scheduler", "explain", {"job": "old"})
    assert explained["state"] == "cancelled" and "from the log" in explained["text"]
    assert "team vision" in explained["text"] and "cancelled at 1970-01-01 00:16:41 UTC: test" in explained["text"]
    explained = await request(nc, "scheduler", "explain", {"job": "new"})
    assert "new" in explained["text"]
    with pytest.raises(CommandRefused, match="exists already"):  # its id stays taken in the log
        await request(nc, "scheduler", "submit", {"team": "vision", "gpus": 1, "id": "old"})
    with pytest.raises(CommandRefused, match="no job 'never'"):
        await request(nc, "scheduler", "explain", {"job": "never"})
    await sched.close()


async def test_a_poison_message_goes_to_dead_letters_and_the_fold_goes_on(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    await js.publish("chamber.jobs.bad", b"not json", headers={"ce-specversion": "1.0", "ce-id": "x", "ce-source": "t",
                                                               "ce-type": JobSubmitted.ce_type()})  # fmt: skip
    await Publisher(js, source="test").publish(a_job("good", at=1.0), id="good")

    async def dead_lettered() -> bool:
        try:
            msg = await js.get_last_msg("DEAD", "chamber.dead.jobs")
        except Exception:
            return False
        return msg.headers is not None and msg.headers.get("chamber-dead-reason") == "malformed"

    async with probe_host(nats_server.url) as host:
        await eventually(dead_lettered)
        assert [e.job_id for e in host.state] == ["good"] and host.stats.dead == 1


async def test_the_host_folds_on_after_the_server_was_killed_and_came_back(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    publisher = Publisher(js, source="test")
    await publisher.publish_many((a_job(f"before{i}", at=1.0), f"b{i}", None) for i in range(20))
    stop = asyncio.Event()
    hosts: list[DeciderHost[list[Any]]] = []

    async def setup(ctx: ServiceContext) -> None:
        host: DeciderHost[list[Any]] = DeciderHost(
            Decider(
                name="probe", inputs=(Input("JOBS"), Input("FLEET")), initial=list, evolve=lambda s, e: s.append(e)
            ),
            ctx,
        )
        host.install()
        hosts.append(host)

    task = asyncio.create_task(serve("probe", nats_server.url, setup, stop, health_port=None))
    await eventually(lambda: bool(hosts) and hosts[0].ready and len(hosts[0].state) == 20)
    nats_server.kill()  # kill -9 under the running fold loop
    nats_server.start()
    await eventually(lambda: nc.is_connected, within=15)
    for i in range(20):  # JetStream answers again a moment after the connection is back

        async def published(i: int = i) -> bool:
            try:
                await publisher.publish(a_job(f"after{i}", at=2.0), id=f"a{i}")
            except Exception:
                return False
            return True

        await eventually(published, within=30)
    await eventually(lambda: len(hosts[0].state) == 40, within=30)
    assert [e.job_id for e in hosts[0].state][18:22] == ["before18", "before19", "after0", "after1"]  # once each
    stop.set()
    await asyncio.wait_for(task, 15)


async def test_inputs_fold_in_the_order_the_server_stored_them_batch_after_batch(
    nats_server: SecuredNatsServer, js: JetStreamContext
) -> None:
    """The merge across inputs: runs of one stream, then the other, in stored order, with batches
    smaller than the runs (so a run is split across batches and a batch across runs)."""
    publisher = Publisher(js, source="test/order")
    expected = [("quota", "vision")]  # the autouse fixture's quota, stored first
    for i in range(30):
        if i % 7 in (2, 3, 5):
            team = f"team{i}"
            await publisher.publish(a_quota(team, 1), id=f"q-{i}")
            expected.append(("quota", team))
        else:
            await publisher.publish(a_job(f"j{i}", at=float(i)), id=f"j-{i}")
            expected.append(("job", f"j{i}"))

    def label(state: list[tuple[str, str]], event: Any) -> None:
        state.append(("job", event.job_id) if isinstance(event, JobSubmitted) else ("quota", event.team))

    stop = asyncio.Event()
    hosts: list[DeciderHost[list[tuple[str, str]]]] = []

    async def setup(ctx: ServiceContext) -> None:
        decider = Decider(name="order", inputs=(Input("JOBS"), Input("QUOTA")), initial=list, evolve=label, batch=4)
        host: DeciderHost[list[tuple[str, str]]] = DeciderHost(decider, ctx)
        host.install()
        hosts.append(host)

    task = asyncio.create_task(serve("order", nats_server.url, setup, stop, health_port=None))
    try:
        await eventually(lambda: bool(hosts) and hosts[0].ready)
        assert hosts[0].state == expected
        assert hosts[0].stats.folded == len(expected)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_an_input_the_server_cannot_open_yet_is_waited_for_not_fatal(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    """Opening the inputs fails while the bus is away or restarting (an API error or a timeout): the
    host retries with back-off instead of ending the service. Here the input's stream comes late."""
    stop = asyncio.Event()
    hosts: list[DeciderHost[list[Any]]] = []

    async def setup(ctx: ServiceContext) -> None:
        host: DeciderHost[list[Any]] = DeciderHost(
            Decider(name="late", inputs=(Input("LATE"),), initial=list, evolve=lambda s, e: s.append(e)), ctx
        )
        host.install()
        hosts.append(host)

    task = asyncio.create_task(serve("late", nats_server.url, setup, stop, health_port=None))
    try:
        await eventually(lambda: bool(hosts))
        await asyncio.sleep(1.0)  # a few failed opens (the stream does not exist)
        assert not task.done() and not hosts[0].ready
        await js.add_stream(name="LATE", subjects=["late.>"])
        await Publisher(js, source="test").publish(a_job("late0", at=1.0), subject="late.jobs.late0", id="l0")
        await eventually(lambda: hosts[0].ready and len(hosts[0].state) == 1, within=30)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_two_ticks_at_once_on_a_new_leader_decide_once(nats_server: SecuredNatsServer, nc: Client) -> None:
    """The timer and the after-fold pass may both tick a host that just became leader; each waits on
    the stream to check it caught up, so unserialized both passed and published the same decisions
    (JetStream dropped the copies, core subscribers saw them twice)."""
    armed: list[bool] = []

    def decide(state: list[Any], now: float) -> list[tuple[Any, str]]:
        if not armed or any(isinstance(e, JobScheduled) and e.job_id == "j1" for e in state):
            return []  # a real decider does not decide what its folded state already has
        event = JobScheduled(job_id="j1", at=now, team="vision", placements=[], pool="default")
        return [(event, stable_id("probe-decision", "j1"))]

    seen: list[str] = []

    async def on_job(msg: Any) -> None:
        seen.append(msg.subject)

    sub = await nc.subscribe("chamber.jobs.>", cb=on_job)
    try:
        async with probe_host(nats_server.url, decide=decide, tick_s=3600.0) as host:
            host.synced = False  # as after a lease change: the next tick checks it caught up first
            armed.append(True)
            await asyncio.gather(host.tick(time.time()), host.tick(time.time()))
            await nc.flush()
            await eventually(lambda: len(seen) >= 1)
            await asyncio.sleep(0.5)  # a second publish would have arrived by now
            assert len(seen) == 1, seen
    finally:
        await sub.unsubscribe()
