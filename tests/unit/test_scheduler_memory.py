"""Finished jobs leave the scheduler's memory as they finish (retention 0): nothing in a cycle needs
them. A Kubernetes workload's job stays a while (the reconcile tells a cancelled workload from a new
one by it); the queue log incremental cycles read stays bounded."""

from __future__ import annotations

import msgspec
import pytest

from events import JobCancelled
from services.scheduler.core import SchedulerState
from services.scheduler.core import state as state_module
from services.scheduler.core.state import KUBERNETES_KEEP_S
from tests.scheduler_builders import Driver, a_job, a_node, done


def test_a_finished_job_leaves_memory_at_once_and_cycles_go_on() -> None:
    d = Driver(state=SchedulerState(retention_s=0.0)).given(a_node("n1"), a_job("a", gpus=8), a_job("b", gpus=8, at=2))
    d.cycle(now=5)
    d.given(done("a", at=10))
    assert "a" not in d.state.jobs and d.state.forgotten == 1
    d.cycle(now=11)
    assert d.state_of("b") == "running"
    # joined and cancelled between two cycles: the incremental one skips what has left memory
    d.given(a_job("c", gpus=8, at=12), JobCancelled(job_id="c", at=13))
    d.given(a_job("e", gpus=1, at=14))
    cycle = d.cycle(now=15)
    assert "c" not in d.state.jobs and "e" in cycle.waiting
    d.given(done("a", at=16))  # a late duplicate of a forgotten job's end changes nothing
    assert d.state.forgotten == 2


def test_a_kubernetes_workloads_job_is_kept_for_the_reconcile() -> None:
    event = a_job("k", gpus=1)
    event = msgspec.structs.replace(event, spec=msgspec.structs.replace(event.spec, namespace="ml"))
    d = Driver(state=SchedulerState(retention_s=0.0)).given(a_node("n1"), event)
    d.cycle(now=5)
    d.given(JobCancelled(job_id="k", at=10))
    assert d.state_of("k") == "cancelled"
    d.given(a_job("later", gpus=1, at=10 + KUBERNETES_KEEP_S + 1))
    assert "k" not in d.state.jobs


def test_the_queue_log_is_trimmed_and_the_next_cycle_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_module, "PENDING_LOG_KEPT", 3)
    d = Driver(state=SchedulerState(retention_s=0.0)).given(a_node("n1", gpus=1))
    d.given(*(a_job(f"j{i}", gpus=1, at=float(i)) for i in range(3)))
    d.cycle(now=5)
    d.given(a_job("j3", gpus=1, at=6))  # the fourth entry: a trim
    assert len(d.state.pending_log.items) == 1
    cycle = d.cycle(now=7)
    assert cycle.full and {"j1", "j2", "j3"} <= set(cycle.waiting)


def test_explain_of_an_unknown_name_after_jobs_left_memory_says_how_to_find_a_finished_one() -> None:
    """A name or id prefix finds only the jobs in memory: the refusal, if the log has no such id
    either, says where a finished job's full id is (the warehouse), as a command to copy."""
    import argparse

    from services.runtime.commands import FromLog
    from services.scheduler import service

    parser = argparse.ArgumentParser()
    service.add_arguments(parser)
    state = SchedulerState()
    state.forgotten = 1
    with pytest.raises(FromLog) as raised:
        service.Scheduler(parser.parse_args([])).answer_explain(state, service.ExplainRequest(job="from-curl'"), 1.0)
    assert raised.value.unknown.endswith(
        "chamber sql \"SELECT DISTINCT job_id FROM events WHERE job_id LIKE 'from-curl%'\""
    )
