"""What makes long queues and large fleets fast decides as the plain way did: the chunked sorted list
behind the capacity buckets and the estimated ends reads like a sorted list through any adds and
removes (chunks split and empty), a snapshot written before it (plain lists) restores into it and
decides as the history folded afresh, and a full cycle answers a job behind a reservation as an
earlier job of its shape was answered only when its runtime estimate is the same."""

from __future__ import annotations

import pickle
from bisect import bisect_right, insort

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from services.runtime.snapshots import Snapshot
from services.scheduler.core import schedule
from services.scheduler.core import sortedlist as sl
from services.scheduler.core.decisions import Admit
from services.scheduler.core.sortedlist import SortedList
from tests.conformance.harness import fold
from tests.scheduler_builders import Driver, a_job, a_node
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
