"""What makes long queues and large fleets fast decides as the plain way did: the chunked sorted list
behind the capacity buckets and the estimated ends reads like a sorted list through any adds and
removes (chunks split and empty), a snapshot written before it (plain lists) restores into it and
decides as the history folded afresh, and a full cycle answers a job behind a reservation as an
earlier job of its shape was answered only when its runtime estimate is the same, and a full cycle
read from the queue's numpy columns decides as one that sorts the queued entries."""

from __future__ import annotations

import pickle
import random
from bisect import bisect_right, insort

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.runtime.snapshots import Snapshot
from services.scheduler.core import cycle as cycle_module
from services.scheduler.core import schedule
from services.scheduler.core import sortedlist as sl
from services.scheduler.core.decisions import Admit
from services.scheduler.core.policy import CHAMBER
from services.scheduler.core.sortedlist import SortedList
from services.scheduler.core.state import derived
from tests.conformance.harness import fold
from tests.scheduler_builders import Driver, a_job, a_node, a_quota, done
from tests.snapshot_fixtures import FIXTURES, NOW, codecs, history

OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 60)), max_size=400)


@settings(max_examples=60, deadline=None)
@given(start=st.lists(st.integers(0, 60), max_size=50), ops=OPS)
def test_reads_as_a_sorted_list_through_adds_and_removes(start: list[int], ops: list[tuple[bool, int]]) -> None:
    chunk, sl.CHUNK = sl.CHUNK, 4  # small chunks: splits and empty chunks happen often
    try:
        items, model = SortedList(start), sorted(start)
        for add, x in ops:
            if add:
                items.add(x)
                insort(model, x)
            else:
                assert items.discard(x) == (x in model)
                if x in model:
                    model.remove(x)
            assert list(items) == model and len(items) == len(model) and bool(items) == bool(model)
            assert [items.bisect_right(p) for p in (-1, x, 61)] == [bisect_right(model, p) for p in (-1, x, 61)]
            assert list(items.iter_from(len(model) // 2)) == model[len(model) // 2 :]
            if model:
                assert items.first() == model[0]
            assert all(len(c) <= 2 * sl.CHUNK for c in items.chunks) and items.maxes == [c[-1] for c in items.chunks]
        assert pickle.loads(pickle.dumps(items)) == items
    finally:
        sl.CHUNK = chunk


def test_a_snapshot_with_plain_lists_restores_into_chunked_ones_and_decides_alike() -> None:
    spec, codec = codecs()["scheduler"]
    snap = msgspec.msgpack.decode((FIXTURES / "scheduler.snapshot").read_bytes(), type=Snapshot)
    restored = codec.decode(snap.state)
    buckets = [b for per_class in restored.capacity.buckets for b in per_class]
    assert buckets and all(isinstance(b, SortedList) for b in buckets)
    fresh = fold(spec, history())
    for now in (NOW + 300.0, NOW + 400.0):
        assert schedule(restored, now).decisions == schedule(fresh, now).decisions
        assert restored.running_ends("default") == fresh.running_ends("default")


def test_a_full_cycle_answers_jobs_behind_a_reservation_by_shape_and_estimate() -> None:
    d = Driver().given(a_node("n1", gpus=4), a_job("running", gpus=3, estimate=100, at=0))
    d.cycle(now=0)
    d.given(
        a_job("wide", gpus=4, at=1),
        a_job("long", gpus=1, at=2, estimate=500),
        a_job("short", gpus=1, at=3, estimate=50),  # the same shape as long's: ends before the reservation
        a_job("long-too", gpus=1, at=4, estimate=500),
    )
    cycle = schedule(d.state, 10.0)  # full: every queued job's turn
    assert cycle.full and [x.job_id for x in cycle.decisions if isinstance(x, Admit)] == ["short"]
    assert "backfill: would delay wide" in cycle.waiting["long"]
    assert cycle.waiting["long-too"] == cycle.waiting["long"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_full_cycle_from_the_queues_columns_decides_as_the_sorted_entries(seed: int) -> None:
    """A full cycle over a long queue orders it and answers jobs whose shape failed from numpy columns
    the fold keeps (rows freed and reused as jobs start, end and are preempted, the columns grown):
    the same decisions, waits (in the same order) and mark as sorting the queued entries and giving
    each job its turn."""
    rng = random.Random(seed)
    d = Driver().given(
        *(a_node(f"n{i}", gpus=8, rack=f"r{i % 2}") for i in range(4)),
        *(a_quota(t, 8, critical=True) for t in "abc"),
    )
    submitted = 0
    for step in range(30):
        for _ in range({0: 70, 1: 150}.get(step, rng.randrange(8))):  # step 1: more than the table's first rows
            prio = rng.choice(["critical", "high", "normal", "normal", "low"])
            gpus, replicas = rng.choice([1, 2, 4, 8]), rng.choice([1, 1, 2])
            at, team = step + rng.random(), rng.choice("abc")
            d.given(a_job(f"j{submitted}", team=team, gpus=gpus, replicas=replicas, priority=prio, at=at))
            submitted += 1
        running = sorted(j.id for j in d.state.jobs.values() if j.state.value == "running")
        for jid in rng.sample(running, min(len(running), rng.randrange(3))):
            d.given(done(jid, at=step + 0.5))
        now = step + 0.75
        plain_from, cycle_module._COLUMNS_FROM = cycle_module._COLUMNS_FROM, 10**9
        try:
            plain = schedule(d.state, now)
        finally:
            cycle_module._COLUMNS_FROM = plain_from
        columns = d.cycle(now=now, policy=CHAMBER)  # full (no mark): from the columns
        assert (columns.decisions, columns.waiting, columns.mark) == (plain.decisions, plain.waiting, plain.mark)
        assert list(columns.waiting) == list(plain.waiting)
    table, entries = derived(d.state).table, d.state.queued_entries()
    assert table is not None and len(table.live) > 140  # built for 70 jobs, and grown since
    rows = table.rows().tolist()
    assert sorted(table.ids[r] for r in rows) == sorted(entries)  # it holds exactly the queued entries
    assert all((table.keys[r], int(table.shape[r]), table.since[r]) == entries[table.ids[r]] for r in rows)
