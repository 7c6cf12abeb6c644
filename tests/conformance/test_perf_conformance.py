"""The perf core through the conformance suite (tests/conformance/harness.py), on logs of the labelled
slowdown scenarios (services/perf/scenario.py): a gang's samples and fabric samples, its placement,
and perf's own verdicts and straggler reports folded back in the order they were decided.

Perf keeps no snapshot (it folds JOBS, FLEET and FAULTS from the start and only new telemetry), so its
"snapshot" here is a pickle round trip: the check still proves a fold can stop and continue.

Interleavings: telemetry is read live ("new" input), never replayed against JOBS, and a sample folded
before its job's placement cannot count for it, so the suite's "any merge of all streams" does not
apply to it as it does to the other cores. What a restart and a live race can reorder is checked
instead: any merge of the replayed streams (JOBS, FLEET, FAULTS) folds to one state, and perf's own
verdicts coming back any number of messages late (the echo's delay) fold to the same state."""

from __future__ import annotations

import functools
import pickle
import random
from collections.abc import Sequence
from typing import Any

import pytest

from events import Event
from events.fabric import JobSlowdownCleared, JobSlowdownDetected
from events.faults import GpuFaultDetected
from services.perf import core as perf
from services.perf.scenario import Scenario, run
from tests.conformance.harness import (
    CoreSpec,
    canon,
    decide_only_reads,
    fold,
    interleavings_fold_to_one_state,
    no_reference_cycles,
    restart_mid_cycle,
    snapshot_restore_continue,
    stream_of,
)

PERF = CoreSpec[perf.PerfState](
    name="perf",
    initial=perf.PerfState,
    evolve=perf.evolve,  # type: ignore[arg-type]
    snapshot=lambda s: pickle.loads(pickle.dumps(s)),
    decide=perf.decide,
)
KINDS = ["gpu_slow", "nic_degraded", "healthy_noise"]
FAULTY = KINDS[:2]  # verdicts and straggler reports on two streams


@functools.cache
def scenario_log(kind: str, seed: int) -> tuple[tuple[Event, ...], float]:
    sc = Scenario(f"conformance-{kind}", kind, gang_nodes=2, seed=seed, fleet_nodes=3, after_s=90.0, record=True)
    out = run(sc)
    return tuple(out.perf_log), sc.fault_at + sc.after_s


def test_the_logs_hold_verdicts_and_straggler_reports() -> None:
    kinds = {type(e).__name__ for kind in KINDS for e in scenario_log(kind, 1)[0]}
    assert {"JobScheduled", "NodeSample", "FabricSample", "JobSlowdownDetected", "GpuFaultDetected"} <= kinds


@pytest.mark.parametrize("kind", FAULTY)
def test_folding_and_deciding_leave_no_reference_cycles(kind: str) -> None:
    log, now = scenario_log(kind, 1)
    no_reference_cycles(PERF, log, now)


REPLAYED = {"JOBS", "FLEET", "FAULTS"}  # perf's "all" inputs (services/perf/service.py)
VERDICTS = (JobSlowdownDetected, JobSlowdownCleared, GpuFaultDetected)


def echoed_late(log: Sequence[Event], seed: int, most: int) -> list[Event]:
    """`log` with each of perf's own verdicts folded up to `most` messages after it was decided (the
    verdicts keep their order among themselves, as one publisher's do on their streams)."""
    rng = random.Random(seed)
    out: list[Event] = []
    held: list[list[Any]] = []  # [messages still to wait, verdict]
    for event in log:
        if isinstance(event, VERDICTS):
            held.append([rng.randint(0, most), event])
            continue
        out.append(event)
        for h in held:
            h[0] -= 1
        while held and held[0][0] <= 0:
            out.append(held.pop(0)[1])
    return out + [h[1] for h in held]


@pytest.mark.parametrize("kind", FAULTY)
@pytest.mark.parametrize("seed", [1, 2])
def test_random_interleavings_of_the_replayed_streams_fold_to_one_state(kind: str, seed: int) -> None:
    log, _ = scenario_log(kind, seed)
    replayed = [e for e in log if stream_of(e) in REPLAYED]
    assert len({stream_of(e) for e in replayed}) >= 2  # something to interleave: JOBS and FAULTS
    for merge in range(5):
        interleavings_fold_to_one_state(PERF, replayed, seed * 100 + merge)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("most", [1, 5, 30])
def test_verdicts_that_come_back_late_fold_to_the_same_state(kind: str, most: int) -> None:
    log, _ = scenario_log(kind, 1)
    want = canon(fold(PERF, log))
    for seed in range(3):
        assert canon(fold(PERF, echoed_late(log, seed, most))) == want


@pytest.mark.parametrize("kind", KINDS)
def test_snapshot_restore_continue_equals_folding_from_the_start(kind: str) -> None:
    log, _ = scenario_log(kind, 1)
    for cut in (1, len(log) // 3, len(log) // 2, len(log) - 1):
        snapshot_restore_continue(PERF, log, cut)


@pytest.mark.parametrize("kind", KINDS)
def test_decide_does_not_change_the_state(kind: str) -> None:
    log, end = scenario_log(kind, 1)
    decide_only_reads(PERF, log, end + 1.0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_restart_in_the_middle_of_a_cycle_decides_nothing_twice(kind: str) -> None:
    log: Any
    log, end = scenario_log(kind, 1)
    restart_mid_cycle(PERF, log, end + 1.0)
