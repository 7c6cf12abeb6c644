"""The perf core on labelled scenarios of the simulated fleet (the real simulator, agent detectors and
health core around it): who is to blame, how fast, and that healthy jobs flag nothing."""

from __future__ import annotations

import pytest

from events.fabric import CulpritKind, JobSlowdownCleared
from events.jobs import JobCompleted, JobScheduled, Placement
from services.perf import core as perf
from services.perf.scenario import Scenario, run


def scenario(kind: str, **kw: object) -> Scenario:
    fields: dict = {"gang_nodes": 4, "seed": 3, "fault_at": 40.0, "after_s": 80.0, **kw}
    return Scenario(kind, kind, **fields)


@pytest.mark.parametrize(
    ("kind", "culprit"),
    [
        ("gpu_slow", CulpritKind.GPU),
        ("nic_down", CulpritKind.NIC),
        ("nic_flap", CulpritKind.NIC),
        ("nic_degraded", CulpritKind.NIC),
        ("nic_errors", CulpritKind.NIC),
        ("pfc_storm", CulpritKind.FABRIC),
    ],
)
def test_each_fault_kind_is_detected_within_30s_and_blamed_on_the_right_part(kind: str, culprit: CulpritKind) -> None:
    out = run(scenario(kind))
    assert out.detected is not None, f"{kind} not detected"
    assert out.detected.culprit is culprit
    assert out.attributed, (out.detected, out.target)
    assert out.detection_s is not None and out.detection_s <= 30
    assert out.early == []
    assert out.speed_during < 0.9  # the slowdown follows from the fault in the simulator


def test_a_straggler_confirmed_twice_is_isolated_but_shared_congestion_isolates_nothing() -> None:
    slow = run(scenario("gpu_slow"))
    assert slow.perf_state is not None
    lines = perf.explain_lines(slow.perf_state, slow.detected.job_id)  # type: ignore[union-attr]
    assert "culprit gpu" in lines[0] and "reported to health (2x" in " ".join(lines)
    moved = [d for d in slow.isolations if d.action == "isolate_gpu"]
    assert [(d.node, d.gpu_index) for d in moved] == [(slow.target["node"], slow.target["gpu"])]
    assert "straggler" in moved[0].reason and "seen 2 times" in moved[0].reason
    assert run(scenario("pfc_storm")).isolations == []


@pytest.mark.parametrize("kind", ["healthy_noise", "healthy_phase", "healthy_imbalance"])
def test_healthy_controls_flag_nothing_and_isolate_nothing(kind: str) -> None:
    out = run(scenario(kind))
    assert out.detected is None and out.early == [] and out.isolations == []


def test_a_phase_change_slows_the_job_without_a_verdict() -> None:
    out = run(scenario("healthy_phase"))
    assert out.speed_during < 0.85 and out.early == []


def test_a_repaired_fault_clears_the_episode() -> None:
    out = run(scenario("nic_degraded", clear_after_s=30.0))
    assert out.detected is not None
    assert [(c.episode, c.reason) for c in out.cleared] == [(1, "recovered")]
    assert out.cleared[0].at >= out.scenario.fault_at + 30


def test_the_same_scenario_gives_the_same_verdict_twice() -> None:
    a, b = run(scenario("nic_errors", seed=5)), run(scenario("nic_errors", seed=5))
    assert a.detected == b.detected


def test_a_job_that_stops_during_an_episode_is_cleared_as_stopped() -> None:
    state = perf.PerfState()
    placements = [Placement(cluster="c", node=f"n{i}", gpu_indices=[0]) for i in range(2)]
    perf.evolve(state, JobScheduled(job_id="j", at=0.0, team="t", placements=placements, pool="default"))
    state.episodes["j"] = perf.Episode(number=1, since=5.0)
    perf.evolve(state, JobCompleted(job_id="j", at=9.0))
    decided = perf.decide(state, 10.0)
    assert [(type(e), e.reason, e.at) for e, _ in decided] == [(JobSlowdownCleared, "stopped", 9.0)]  # type: ignore[attr-defined]
    perf.evolve(state, decided[0][0])
    assert perf.decide(state, 11.0) == []


def test_a_restarted_service_keeps_an_open_episode_while_the_job_stays_slow() -> None:
    """After a restart, the JOBS log gives the open episode (and the job's best speed in its evidence);
    the slow samples that follow must not look like a recovery."""
    from events.fabric import CommProgress, FabricSample, JobSlowdownDetected, NicSample

    state = perf.PerfState()
    nodes = ["n0", "n1"]
    placements = [Placement(cluster="c", node=n, gpu_indices=[0]) for n in nodes]
    perf.evolve(state, JobScheduled(job_id="j", at=0.0, team="t", placements=placements, pool="default"))
    perf.evolve(
        state,
        JobSlowdownDetected(
            job_id="j", episode=1, at=100.0, since=95.0, culprit=CulpritKind.UNKNOWN, score=0.5, confidence=0.4,
            evidence={"best_rate": 100.0},
        ),
    )  # fmt: skip
    decided = []
    for t in range(200, 260):
        for n in nodes:
            comms = [CommProgress(comm="x", job="j", ops=50 * t)]  # half its best speed
            nic = NicSample(name="mlx5_0/1", index=0, gpu_index=0, rate_gbps=400.0)
            sample = FabricSample(
                cluster="c", node=n, seq=t, observed_at=float(t), interval_s=1.0, nics=[nic], comms=comms
            )
            perf.evolve(state, sample)
        decided += perf.decide(state, float(t))
    assert decided == [] and state.jobs["j"].score < 0.6


@pytest.mark.parametrize("kind", ["nic_flap", "gpu_slow", "healthy_phase"])
def test_without_nccl_ras_the_ranks_nic_traffic_stands_in_for_progress(kind: str) -> None:
    out = run(scenario(kind, ras=False))
    if kind.startswith("healthy"):
        assert out.detected is None and out.early == []
    else:
        assert out.attributed and out.detection_s is not None and out.detection_s <= 30


def test_a_job_moved_while_slow_keeps_its_episode_in_view_with_the_outcome() -> None:
    """Two 4-node gangs on 8 nodes; gang-a's rank on n3 has a degraded NIC. When the scheduler moves
    it, `chamber perf` still lists it: moved off n3's NIC, waiting, then resumed on its new nodes."""
    from events.fabric import JobSlowdownDetected
    from events.jobs import JobRequeued, JobResumed

    def on(*nodes: str) -> list[Placement]:
        return [Placement(cluster="c", node=n, gpu_indices=list(range(8))) for n in nodes]

    state = perf.PerfState()
    perf.evolve(
        state, JobScheduled(job_id="gang-a", at=0.0, team="t", placements=on("n0", "n1", "n2", "n3"), pool="default")
    )
    perf.evolve(
        state,
        JobSlowdownDetected(
            job_id="gang-a", episode=1, at=100.0, since=90.0, culprit=CulpritKind.NIC, score=0.78, confidence=0.8,
            cluster="c", node="n3", gpu_index=0, nic="mlx5_0/1", reason="NIC trained below its peers",
        ),
    )  # fmt: skip
    why = "moved off degraded hardware (n3 GPU 0: straggler escalated)"
    perf.evolve(state, JobRequeued(job_id="gang-a", at=200.0, reason=why))
    [row] = perf.verdicts(state)
    assert row["verdict"] == "moved"
    assert row["moved"] == (
        f"episode 1: moved off n3 NIC mlx5_0/1 at 1970-01-01 00:03:20 UTC ({why}); waiting to resume"
    )
    [(cleared, _)] = perf.decide(state, 201.0)  # the episode ends with the move ...
    perf.evolve(state, cleared)
    assert [r["verdict"] for r in perf.verdicts(state)] == ["moved"]  # ... and stays in view
    perf.evolve(state, JobResumed(job_id="gang-a", at=300.0, placements=on("n4", "n5", "n6", "n7"), pool="default"))
    [row] = perf.verdicts(state)
    assert row["verdict"] == "warming" and str(row["moved"]).endswith(
        "; resumed on n4, n5, n6, n7 at 1970-01-01 00:05:00 UTC"
    )
    lines = perf.explain_lines(state, "gang-a")
    assert any("moved off its GPUs" in line for line in lines) and any("resumed on n4" in line for line in lines)
    perf.evolve(state, JobCompleted(job_id="gang-a", at=400.0))
    assert perf.verdicts(state) == []
