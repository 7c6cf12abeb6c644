"""Node faults with and without a precursor: moving jobs on the warning versus waiting for the failure
(services/tracesim/faults.py), worked out by hand on one node."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.cli.errors import UsageError
from services.tracesim.engine import FAIL, WARN, FleetSpec, Simulation
from services.tracesim.faults import FaultModel
from services.tracesim.quotas import equal_shares
from services.tracesim.run import make_policy
from services.tracesim.trace import TraceJob

GPUS, RUNS, CKPT, REPAIR = 8, 20_000.0, 1_000.0, 50.0
JOB = TraceJob(id="train", submit_s=0.0, duration_s=RUNS, gpus=GPUS, team="a", checkpoint_interval_s=CKPT)


def simulation(model: FaultModel | None, seed: int, jobs: list[TraceJob] | None = None) -> Simulation:
    return Simulation(
        jobs or [JOB], FleetSpec(gpus=GPUS), equal_shares(["a"], GPUS), make_policy("chamber"),
        fault_rate_per_node_day=0.5, repair_s=REPAIR, seed=seed, fault_model=model,
    )  # fmt: skip


def planned(sim: Simulation, kind: int) -> list[float]:
    return sorted(t for t, k, *_ in sim.heap if k == kind)


def one_fault_seed() -> tuple[int, float]:
    """The first seed whose plan has exactly one node fault, late enough for a warning while the job runs."""
    for seed in range(200):
        fails = planned(simulation(None, seed), FAIL)
        if len(fails) == 1 and 1_000.0 < fails[0] < RUNS:
            return seed, fails[0]
    raise AssertionError("no seed with one fault")


def since_checkpoint(t: float) -> float:
    return t - math.floor(t / CKPT) * CKPT


def test_waiting_for_the_failure_loses_the_work_since_the_checkpoint_and_the_hang() -> None:
    seed, fail_at = one_fault_seed()
    out = simulation(FaultModel(precursor_share=1.0, proactive=False), seed).run()
    job = out.jobs["train"]
    assert job.fault_moves == 0 and job.requeues == 1
    assert job.hang_gpu_s == pytest.approx(1800.0 * GPUS)
    assert job.lost_to_faults_gpu_s == pytest.approx((since_checkpoint(fail_at) + 1800.0) * GPUS)
    assert job.waiting_cost_gpu_s == pytest.approx(job.lost_to_faults_gpu_s)  # it did wait


def test_a_precursor_moves_the_job_before_the_failure_without_a_hang() -> None:
    seed, fail_at = one_fault_seed()
    sim = simulation(FaultModel(precursor_share=1.0, lead_s=600.0, detection_s=10.0), seed)
    assert planned(sim, WARN) == [pytest.approx(fail_at - 590.0)]
    job = sim.run().jobs["train"]
    assert job.fault_moves == 1 and job.requeues == 1 and job.hang_gpu_s == 0.0
    assert job.lost_to_faults_gpu_s == pytest.approx(since_checkpoint(fail_at - 590.0) * GPUS)
    assert job.end is not None
    # paired: the same fault on the same job, had the scheduler waited
    assert job.waiting_cost_gpu_s == pytest.approx((since_checkpoint(fail_at) + 1800.0) * GPUS)


def test_a_job_that_would_have_ended_before_the_failure_loses_by_the_move() -> None:
    seed, fail_at = one_fault_seed()
    short = replace(JOB, duration_s=fail_at - 590.0 + 300.0)  # 300 s left at the warning, 590 s to the failure
    later = TraceJob(id="later", submit_s=fail_at + 1_000.0, duration_s=RUNS, gpus=GPUS, team="a")
    job = simulation(FaultModel(precursor_share=1.0), seed, [short, later]).run().jobs["train"]
    assert job.fault_moves == 1 and job.waiting_cost_gpu_s == 0.0  # waiting, it would just have finished
    assert job.lost_to_faults_gpu_s == pytest.approx(since_checkpoint(fail_at - 590.0) * GPUS)


def test_without_precursors_or_with_a_lead_shorter_than_detection_moving_saves_nothing() -> None:
    seed, _ = one_fault_seed()
    waiting = simulation(FaultModel(precursor_share=1.0, proactive=False), seed).run().jobs["train"]
    for model in (FaultModel(precursor_share=0.0), FaultModel(precursor_share=1.0, lead_s=5.0, detection_s=10.0)):
        job = simulation(model, seed).run().jobs["train"]
        assert job.fault_moves == 0
        assert job.lost_to_faults_gpu_s == pytest.approx(waiting.lost_to_faults_gpu_s)


def test_the_model_does_not_move_the_faults_and_a_job_without_checkpoints_gets_the_default() -> None:
    seed, fail_at = one_fault_seed()
    assert planned(simulation(FaultModel(), seed), FAIL) == [fail_at]
    bare = replace(JOB, checkpoint_interval_s=None)
    job = simulation(FaultModel(precursor_share=0.0, checkpoint_s=CKPT), seed, [bare]).run().jobs["train"]
    assert job.lost_to_faults_gpu_s == pytest.approx((since_checkpoint(fail_at) + 1800.0) * GPUS)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 1.0), st.booleans())
def test_work_is_conserved_with_the_fault_model(seed: int, share: float, proactive: bool) -> None:
    jobs = [
        TraceJob(id=f"j{i}", submit_s=300.0 * i, duration_s=8_000.0, gpus=4 * (1 + i % 2), team="a") for i in range(6)
    ]
    fleet = FleetSpec(gpus=16)
    model = FaultModel(precursor_share=share, proactive=proactive)
    sim = Simulation(jobs, fleet, equal_shares(["a"], 16), make_policy("chamber"), fault_rate_per_node_day=3.0,
                     repair_s=100.0, seed=seed, fault_model=model)  # fmt: skip
    out = sim.run()
    assert out.unfinished == 0 and out.precursors <= out.faults
    for job in out.jobs.values():
        assert job.run_gpu_s == pytest.approx(job.t.duration_s * job.t.gpus + job.lost_gpu_s)
        assert job.hang_gpu_s <= job.lost_to_faults_gpu_s + 1e-6
        if proactive is False:
            assert job.fault_moves == 0
            assert job.waiting_cost_gpu_s == pytest.approx(job.lost_to_faults_gpu_s)


def test_a_bad_fault_model_is_refused_at_the_door() -> None:
    from services.cli.sim import _fault_model

    class Args:
        precursor_share, precursor_lead, detection_delay, hang_timeout, checkpoint_default = 1.5, 600, 10, 1800, 3600

    with pytest.raises(UsageError, match="--precursor-share must be between 0 and 1"):
        _fault_model(Args())  # type: ignore[arg-type]
