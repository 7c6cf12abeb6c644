"""The decider host's collector policy (services/runtime/collector.py), and what makes freezing safe:
the scheduler core's state and a cycle's output hold no reference cycles, so everything it makes is
freed by reference counting alone, frozen or not."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from events import GpuInfo, JobCompleted, JobSpec, JobSubmitted, NodeDiscovered, PriorityClass, TeamQuotaSet
from services.runtime.collector import paused_collector
from services.scheduler.core import SchedulerState, events_for, evolve, schedule


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    gc.collect()
    yield
    gc.enable()
    gc.unfreeze()  # what a test froze goes back to the collector


def test_off_inside_on_after_and_small_growth_not_frozen() -> None:
    frozen = gc.get_freeze_count()
    with paused_collector(freeze_after=10_000):
        assert not gc.isenabled()
        kept = [[i] for i in range(100)]
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
    assert len(kept) == 100


def test_large_growth_collected_and_frozen() -> None:
    frozen = gc.get_freeze_count()
    with paused_collector(freeze_after=1_000):
        kept = [[i] for i in range(5_000)]
        a: list[object] = []
        a.append(a)  # a cycle made in the section and dropped in it: collected before the freeze
        del a
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + 5_000
    assert gc.get_count()[0] < 1_000
    assert not any(type(o) is list and len(o) == 1 and o[0] is o for o in gc.get_objects())
    assert len(kept) == 5_000


def test_nested_or_disabled_is_left_alone() -> None:
    gc.disable()
    with paused_collector(freeze_after=0):
        [[i] for i in range(100)]
    assert not gc.isenabled()  # the caller's choice stands, and nothing was frozen behind its back
    gc.enable()
    frozen = gc.get_freeze_count()
    with paused_collector(freeze_after=1_000), paused_collector(freeze_after=0):
        assert not gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_an_exception_reenables_and_freezes_nothing() -> None:
    frozen = gc.get_freeze_count()
    with pytest.raises(ValueError), paused_collector(freeze_after=0):
        [[i] for i in range(5_000)]
        raise ValueError("boom")
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def _fleet_and_cycles() -> int:
    """A small fleet with quotas and mixed jobs (gangs included), two cycles folded back, some
    completions, everything dropped on return. Returns the admissions (so the run is not empty)."""
    state = SchedulerState()
    for n in range(40):
        gpus = [GpuInfo(index=i, uuid=f"GPU-{n}-{i}", model="H100") for i in range(8)]
        evolve(state, NodeDiscovered(cluster="c1", node=f"n{n:03d}", at=0.0, gpus=gpus, labels={"rack": f"r{n // 8}"}))
    for t in range(3):
        evolve(state, TeamQuotaSet(team=f"t{t}", pool="default", at=0.0, guaranteed_gpus=80, borrow_limit=80))
    shapes = [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4)]
    priorities = [PriorityClass.HIGH, PriorityClass.NORMAL, PriorityClass.LOW]
    for i in range(150):
        per, replicas = shapes[i % len(shapes)]
        spec = JobSpec(
            team=f"t{i % 3}",
            gpus_per_replica=per,
            replicas=replicas,
            priority=priorities[i % 3],
            expected_duration_s=[None, 600.0][i % 2],
        )
        evolve(state, JobSubmitted(job_id=f"j{i}", at=float(i), spec=spec))
    admitted = 0
    now = 200.0
    mark = None
    for _ in range(3):
        cycle = schedule(state, now, mark)
        for event, _ in events_for(cycle.decisions, now):
            evolve(state, event)
        admitted += sum(1 for d in cycle.decisions if type(d).__name__ == "Admit")
        mark = cycle.mark
        running = sorted(j.id for j in state.jobs.values() if j.state.value == "running")
        for job_id in running[:10]:
            now += 1.0
            evolve(state, JobCompleted(job_id=job_id, at=now))
    return admitted


def test_the_scheduler_core_makes_no_reference_cycles() -> None:
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage
    try:
        assert _fleet_and_cycles() > 50
        gc.collect()
        cyclic = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cyclic == []
