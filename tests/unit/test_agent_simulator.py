"""The simulated fleet: deterministic, load follows jobs, injected faults reach the detectors, and
the executor starts and completes placed jobs from the JOBS events alone."""

from __future__ import annotations

import msgspec
import pytest

from events import (
    FaultKind,
    JobCancelled,
    JobCompleted,
    JobPreempted,
    JobResumed,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    Placement,
    PreemptionReason,
)
from node_agent.detectors import DetectorState, detect
from node_agent.sim import executor as ex
from node_agent.sim.fleet import JobProfile, SimError, SimFaultKind, SimFleet
from node_agent.sim.models import gpu_model

H100 = gpu_model("H100-80GB")


def a_fleet(seed: int = 7, nodes: int = 4, gpus: int = 8) -> SimFleet:
    return SimFleet(seed=seed, nodes=nodes, gpus_per_node=gpus, model=H100)


def run_fleet(fleet: SimFleet, seconds: int, start: float = 1000.0) -> list[bytes]:
    out = []
    for s in range(seconds):
        for node in fleet.nodes.values():
            out.append(msgspec.json.encode(node.read("c1", s, start + s, 1.0).sample))
    return out


def test_the_same_seed_gives_the_same_samples_and_another_seed_does_not() -> None:
    a, b = a_fleet(seed=7), a_fleet(seed=7)
    for f in (a, b):
        f.assign({"sim-000": {0: "j1", 1: "j1"}, "sim-002": {3: "j2"}})
    assert run_fleet(a, 30) == run_fleet(b, 30)
    c = a_fleet(seed=8)
    c.assign({"sim-000": {0: "j1", 1: "j1"}, "sim-002": {3: "j2"}})
    assert run_fleet(c, 30) != run_fleet(a_fleet(seed=7), 30)


def test_a_node_samples_the_same_whatever_other_nodes_the_fleet_has() -> None:
    small, big = a_fleet(nodes=2), a_fleet(nodes=50)
    for f in (small, big):
        f.assign({"sim-001": {0: "j1"}})
    s = [small.nodes["sim-001"].read("c1", i, 1000.0 + i, 1.0).sample for i in range(10)]
    b = [big.nodes["sim-001"].read("c1", i, 1000.0 + i, 1.0).sample for i in range(10)]
    assert s == b


def test_busy_gpus_draw_power_and_memory_idle_ones_do_not() -> None:
    fleet = a_fleet(nodes=1)
    busy_job = next(f"j{i}" for i in range(100) if not JobProfile.of(7, f"j{i}").idle)
    fleet.assign({"sim-000": {0: busy_job, 1: busy_job}})
    node = fleet.nodes["sim-000"]
    for s in range(60):  # let temperatures settle
        sample = node.read("c1", s, 1000.0 + s, 1.0).sample
    busy, free = sample.gpus[0], sample.gpus[5]
    assert busy.utilization_pct and busy.utilization_pct >= 60 and free.utilization_pct == 0
    assert busy.memory_used_mib and busy.memory_used_mib > 0.4 * H100.memory_mib and free.memory_used_mib == 0
    assert busy.power_w and free.power_w and busy.power_w > 3 * free.power_w
    assert busy.temperature_c and free.temperature_c and busy.temperature_c > free.temperature_c
    assert busy.processes and busy.processes[0].used_memory_mib and not free.processes
    assert free.throttle_reasons == ["gpu_idle"]


def test_some_jobs_hold_gpus_without_computing() -> None:
    profiles = [JobProfile.of(7, f"job-{i}") for i in range(1000)]
    idle = [p for p in profiles if p.idle]
    assert 0.10 < len(idle) / len(profiles) < 0.20
    assert all(p.utilization_pct < 3 and p.memory_fraction > 0 for p in idle)


def detected(fleet: SimFleet, node: str, seconds: int, start: float = 1000.0, seq0: int = 0) -> list[str]:
    state, kinds = DetectorState(), []
    n = fleet.nodes[node]
    for s in range(seconds):
        state, faults = detect(state, n.read("c1", seq0 + s, start + s, 1.0), n.limits())
        kinds += [f"{f.kind}:{f.gpu_index}" for f in faults]
    return kinds


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (SimFaultKind.ECC_DBE, FaultKind.ECC_DBE),
        (SimFaultKind.SBE_STORM, FaultKind.ECC_SBE_STORM),
        (SimFaultKind.ROW_REMAP_FAILURE, FaultKind.ROW_REMAP_FAILURE),
        (SimFaultKind.ROW_REMAP_PENDING, FaultKind.ROW_REMAP_PENDING),
        (SimFaultKind.THERMAL, FaultKind.THERMAL),
        (SimFaultKind.POWER_BRAKE, FaultKind.POWER),
        (SimFaultKind.NVLINK, FaultKind.NVLINK),
        (SimFaultKind.PCIE_REPLAY, FaultKind.PCIE),
        (SimFaultKind.GPU_LOST, FaultKind.GPU_LOST),
    ],
)
def test_each_injected_fault_is_detected_once_on_its_gpu(kind: SimFaultKind, expected: FaultKind) -> None:
    fleet = a_fleet(nodes=1)
    assert detected(fleet, "sim-000", 5) == []
    fleet.inject("sim-000", kind.value, 3, None, now=1005.0)
    assert detected(fleet, "sim-000", 60, start=1005.0, seq0=5) == [f"{expected}:3"]


def test_an_injected_xid_is_one_xid_fault_and_clear_ends_the_nodes_faults() -> None:
    fleet = a_fleet(nodes=1)
    fleet.inject("sim-000", "xid", 2, 79, now=1000.5)
    fleet.inject("sim-000", "thermal", 1, None, now=1000.5)
    fleet.inject("sim-000", "agent_silent", None, None, now=1000.5)
    node = fleet.nodes["sim-000"]
    assert node.silent
    reading = node.read("c1", 0, 1001.0, 1.0)
    assert [(x.gpu_index, x.xid) for x in reading.xids] == [(2, 79)]
    assert node.read("c1", 1, 1002.0, 1.0).xids == ()
    fleet.inject("sim-000", "clear", None, None, now=1003.0)
    assert not node.silent
    assert node.read("c1", 2, 1004.0, 1.0).sample.gpus[1].throttle_reasons == ["gpu_idle"]


def test_bad_injections_are_refused_naming_the_field() -> None:
    fleet = a_fleet(nodes=1)
    cases = [("nope", "ecc_dbe", 0, None, "node"), ("sim-000", "melt", 0, None, "kind"),
             ("sim-000", "xid", 0, None, "xid"), ("sim-000", "ecc_dbe", 8, None, "gpu")]  # fmt: skip
    for node, kind, gpu, xid, field in cases:
        with pytest.raises(SimError) as err:
            fleet.inject(node, kind, gpu, xid, now=0.0)
        assert err.value.field == field


# --- the executor -------------------------------------------------------------------------------


def placed(job: str, at: float, *nodes: str, cluster: str = "c1") -> JobScheduled:
    return JobScheduled(
        job_id=job,
        at=at,
        team="vision",
        placements=[Placement(cluster=cluster, node=n, gpu_indices=[0, 1]) for n in nodes],
        pool="default",
    )


def submitted(job: str, duration: float | None) -> JobSubmitted:
    return JobSubmitted(job_id=job, at=0.0, spec=JobSpec(team="vision", gpus_per_replica=2, sim_duration_s=duration))


def an_executor() -> ex.ExecutorState:
    return ex.ExecutorState(cluster="c1", nodes=frozenset({"sim-000", "sim-001"}))


def publish_decisions(state: ex.ExecutorState, now: float) -> list[str]:
    """What the shell does: decide, publish, fold the published events back in."""
    out = ex.decide(state, now)
    ex.evolve_all(state, [e for e, _ in out])
    return [f"{type(e).__name__}@{e.at:g}" for e, _ in out]  # type: ignore[attr-defined]


def test_a_placed_job_starts_and_completes_after_its_simulated_duration() -> None:
    state = ex.evolve_all(an_executor(), [submitted("j1", 30.0), placed("j1", 100.0, "sim-000", "sim-001")])
    assert ex.allocations(state) == {"sim-000": {0: "j1", 1: "j1"}, "sim-001": {0: "j1", 1: "j1"}}
    assert publish_decisions(state, 101.0) == ["JobStarted@100"]
    assert publish_decisions(state, 129.0) == []
    assert publish_decisions(state, 131.0) == ["JobCompleted@130"]
    assert publish_decisions(state, 200.0) == [] and ex.allocations(state) == {}


def test_running_time_adds_up_across_a_preemption() -> None:
    state = ex.evolve_all(an_executor(), [submitted("j1", 30.0), placed("j1", 100.0, "sim-000")])
    publish_decisions(state, 100.0)
    ex.evolve(state, JobPreempted(job_id="j1", at=110.0, team="vision", reason=PreemptionReason.PRIORITY))
    assert ex.allocations(state) == {}
    assert publish_decisions(state, 500.0) == []
    ex.evolve(
        state,
        JobResumed(
            job_id="j1", at=600.0, placements=[Placement(cluster="c1", node="sim-001", gpu_indices=[3])], pool="default"
        ),
    )
    assert ex.allocations(state) == {"sim-001": {3: "j1"}}
    assert publish_decisions(state, 600.0) == ["JobStarted@600"]
    assert publish_decisions(state, 625.0) == ["JobCompleted@620"]


def test_a_job_without_a_duration_runs_until_cancelled() -> None:
    state = ex.evolve_all(an_executor(), [submitted("j1", None), placed("j1", 100.0, "sim-000")])
    publish_decisions(state, 100.0)
    assert publish_decisions(state, 1e9) == []
    ex.evolve(state, JobCancelled(job_id="j1", at=2000.0))
    assert ex.allocations(state) == {} and publish_decisions(state, 1e9) == []


def test_placements_on_other_clusters_or_nodes_are_not_ours() -> None:
    state = ex.evolve_all(
        an_executor(),
        [submitted("j1", 10.0), placed("j1", 1.0, "sim-000", cluster="other"), placed("j2", 1.0, "gpu-node-9")],
    )
    assert ex.allocations(state) == {} and ex.decide(state, 100.0) == []


def test_replaying_the_log_with_our_own_outputs_decides_nothing_new() -> None:
    log = [
        submitted("j1", 30.0),
        placed("j1", 100.0, "sim-000"),
        submitted("j2", 1000.0),
        placed("j2", 105.0, "sim-001"),
    ]
    live = ex.evolve_all(an_executor(), log)
    outputs = ex.decide(live, 140.0)
    ids = [i for _, i in outputs]
    assert [type(e) for e, _ in outputs] == [JobStarted, JobCompleted, JobStarted]
    replayed = ex.evolve_all(an_executor(), log + [e for e, _ in outputs])
    assert ex.decide(replayed, 140.0) == []
    again = ex.decide(ex.evolve_all(an_executor(), log), 140.0)
    assert [i for _, i in again] == ids  # the same ids: JetStream drops what was already published
    assert ex.allocations(replayed) == {"sim-001": {0: "j2", 1: "j2"}}
    assert isinstance(outputs[1][0], JobCompleted) and outputs[1][0].at == 130.0
