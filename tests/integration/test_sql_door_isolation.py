"""Analytics never stall ingest: queries take their own slots and threads, wait in a bounded queue,
and are refused "busy" beyond it; the CLI waits longer than a query may run and, when it still gets
no answer, says which limit it waited for instead of trying to open the warehouse itself."""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from services.errors import UsageError
from services.recorder.writer import Writer
from services.runtime import connect
from services.runtime.nats_server import NatsServerProcess
from services.warehouse import access, idle_threads, migrate
from services.warehouse.analytics import Limits
from services.warehouse.backend import WarehouseError
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.door import QUEUE_WAIT_S, Busy, open_door

pytestmark = pytest.mark.integration

SLOW = "SELECT sleep(2)"  # holds its slot two seconds without needing a CPU: the same on a loaded machine


@pytest.fixture
def warehouse(tmp_path: Path) -> Iterator[ChdbWarehouse]:
    wh = ChdbWarehouse(tmp_path / "data")
    migrate(wh)
    try:
        yield wh
    finally:
        wh.close()


async def test_a_full_queue_is_refused_at_once_with_how_busy_the_door_is(warehouse: ChdbWarehouse) -> None:
    door = open_door(warehouse, slots=1, queue_limit=1)
    try:
        running = asyncio.create_task(door.answer(SLOW, 1))
        await asyncio.sleep(0.2)
        queued = asyncio.create_task(door.answer(SLOW, 1))
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        with pytest.raises(Busy, match=r"busy: 1 of 1 query slots running, 1 queued \(the queue holds 1\)"):
            await door.answer("SELECT 1", 1)
        assert time.monotonic() - t0 < 0.5  # refused at once, not after waiting
        assert (await running).rows == [[0]] and (await queued).rows == [[0]]
        assert (await door.answer("SELECT 1", 1)).rows == [[1]]  # the slots are free again
    finally:
        door.close()


async def test_a_query_that_waits_too_long_for_a_slot_is_refused_busy(warehouse: ChdbWarehouse) -> None:
    door = open_door(warehouse, slots=1, queue_limit=4, queue_wait_s=0.3)
    try:
        running = asyncio.create_task(door.answer(SLOW, 1))
        await asyncio.sleep(0.2)
        with pytest.raises(Busy, match=r"busy: 1 of 1 query slots running, 1 queued; waited 0.3 s for a slot"):
            await door.answer("SELECT 1", 1)
        await running
    finally:
        door.close()


async def test_two_slots_run_two_queries_at_once(warehouse: ChdbWarehouse) -> None:
    door = open_door(warehouse, slots=2)
    try:
        # each session reads the engine's catalog on its first check: not timed (its threads run
        # SCHED_IDLE, slow on a loaded machine)
        await asyncio.gather(door.answer("SELECT sleep(0.1)", 1), door.answer("SELECT sleep(0.1)", 1))
        t0 = time.monotonic()
        await asyncio.gather(door.answer(SLOW, 1), door.answer(SLOW, 1))
        assert time.monotonic() - t0 < 3.8  # one after the other would be 4 s
    finally:
        door.close()


async def test_ingest_goes_on_while_a_query_holds_its_slot(warehouse: ChdbWarehouse) -> None:
    """The writer's thread and session are not the door's: inserts land while a query runs."""
    writer = Writer(warehouse)
    door = open_door(warehouse)
    try:
        query = asyncio.create_task(door.answer("SELECT sleep(3)", 1))
        await asyncio.sleep(0.2)
        for i in range(3):
            row = pa.table({"team": [f"t{i}"], "amount": [1.0]})
            await writer.call(lambda row=row: warehouse.insert("budgets", row))
        assert not query.done()  # all three stored while the query still ran
        assert await writer.call(lambda: warehouse.count("budgets")) == 3
        await query
    finally:
        door.close()
        writer.close()


async def test_a_query_pauses_while_the_writer_runs_one_and_only_when_it_yields(warehouse: ChdbWarehouse) -> None:
    """The engine holds an analytics query at its next block while a query of the writer's session
    runs (`priority`); without `yield_to_ingest` the two run side by side."""
    writer = Writer(warehouse)
    yielding = open_door(warehouse)
    plain = open_door(warehouse, limits=Limits(yield_to_ingest=False))
    reads = "SELECT sum(number) FROM numbers(10000000)"  # many blocks, none of them slow
    try:
        for door in (yielding, plain):
            await door.answer(reads, 1)  # each session reads the engine's catalog on its first check
        done_first = []
        for door in (yielding, plain):
            started = threading.Event()

            def slow_insert(started: threading.Event) -> object:
                started.set()
                return warehouse.query("SELECT sleep(1.5)")

            ingest = asyncio.create_task(writer.call(slow_insert, started))
            # the writer's query runs before the read starts (on a loaded machine the writer's thread
            # could start after the read: then there is nothing to yield to)
            assert await asyncio.to_thread(started.wait, 10)
            await asyncio.sleep(0.3)
            assert (await door.answer(reads, 1)).rows == [[49999995000000]]
            done_first.append(ingest.done())
            await ingest
        assert done_first == [True, False]  # the yielding query waited for the writer's; the other did not
    finally:
        yielding.close()
        plain.close()
        writer.close()


async def test_a_recorder_that_never_answers_gets_the_limit_named_not_a_fallback(
    nats_server: NatsServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Limits().max_execution_time_s + QUEUE_WAIT_S < access.REQUEST_TIMEOUT_S
    nc = await connect(nats_server.url, name="a stuck recorder")

    async def take_and_never_answer(msg: object) -> None:
        pass

    await nc.subscribe("chamber.cmd.recorder.sql", cb=take_and_never_answer)
    await nc.flush()
    monkeypatch.setattr(access, "REQUEST_TIMEOUT_S", 1.0)
    (tmp_path / "warehouse").mkdir()
    args = argparse.Namespace(nats=nats_server.url, clickhouse_url=None, data_dir=tmp_path)
    try:
        with pytest.raises(UsageError) as failed:
            await asyncio.to_thread(access.read_query, args, "SELECT 1")
    finally:
        await nc.close()
    message = str(failed.value)
    assert "did not answer within 1 s" in message and "time limit, 30 s" in message, message
    assert "held by another process" not in message


def _python_threads() -> set[int]:
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}


def _sched_idle_threads() -> dict[int, int]:
    """This process's threads under SCHED_IDLE: thread id -> nice."""
    return {tid: nice for tid, nice, policy in idle_threads.threads() if policy == idle_threads.SCHED_IDLE}


async def _sched_idle_within(within_s: float) -> dict[int, int]:
    """The SCHED_IDLE threads, once there are any (the door's watcher scans every so often)."""
    deadline = time.monotonic() + within_s
    while True:
        found = _sched_idle_threads()
        if found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


async def _reniced_threads(within_s: float = 1.5) -> set[int]:
    """The engine threads at nice 19, once a query's are (a loaded machine may take a while to start it)."""
    deadline = time.monotonic() + within_s
    while True:
        found = {tid for tid, nice, _ in idle_threads.threads() if nice == 19} - _python_threads()
        if found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


@pytest.mark.skipif(not idle_threads.can_make_normal(), reason="needs CAP_SYS_NICE, as the engine does")
async def test_a_query_runs_its_engine_threads_under_sched_idle_and_gives_them_back(warehouse: ChdbWarehouse) -> None:
    door = open_door(warehouse, limits=Limits(nice=19, idle=True))
    plain = open_door(warehouse, limits=Limits(nice=19))
    try:
        assert _sched_idle_threads() == {}
        query = asyncio.create_task(door.answer("SELECT sleep(2)", 1))
        assert await _reniced_threads()
        during = await _sched_idle_within(1.5)  # the watcher's first scans (later on a loaded machine)
        assert during and set(during.values()) == {19}, during  # the threads the engine reniced, only those
        assert not _python_threads() & set(during)  # never a Python thread
        await query
        assert _sched_idle_threads() == {}  # back in the engine's pool, which ingest uses too: normal again
        query = asyncio.create_task(plain.answer("SELECT sleep(2)", 1))
        assert await _reniced_threads()
        await asyncio.sleep(0.2)
        assert _sched_idle_threads() == {}  # the default: reniced only
        await query
        # A query on several threads: the pool threads its threads start inherit nice 19 from them
        wide = open_door(warehouse, limits=Limits(nice=19, max_threads=4, max_execution_time_s=1))
        try:
            with pytest.raises(WarehouseError, match="time limit"):
                await wide.answer("SELECT count() FROM numbers_mt(1e12) WHERE cityHash64(number) % 7 = 3", 1)
        finally:
            wide.close()
        engine = [(n, p) for tid, n, p in idle_threads.threads() if tid not in _python_threads()]
        assert all(n <= 0 and p != idle_threads.SCHED_IDLE for n, p in engine), engine  # all normal for ingest
    finally:
        door.close()
        plain.close()
