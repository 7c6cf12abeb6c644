"""The simulated fabric: a gang's rhythm follows the faults injected into its GPUs and links."""

from __future__ import annotations

import pytest

from events.fabric import LinkState
from node_agent.sim.fleet import SimError, SimFleet
from node_agent.sim.models import gpu_model


def a_fleet(nodes: int = 4) -> SimFleet:
    return SimFleet(seed=7, nodes=nodes, gpus_per_node=8, model=gpu_model("H100-80GB"))


def busy_job(fleet: SimFleet) -> str:
    """A job id whose profile computes (not one of the idle ones)."""
    for i in range(100):
        job = f"train-{i}"
        fleet.assign({"sim-000": {0: job}})
        if not fleet.nodes["sim-000"].gpus[0].profile.idle:  # type: ignore[union-attr]
            return job
    raise AssertionError("no busy job found")


def run(fleet: SimFleet, job: str, nodes: list[str], seconds: int, start: float = 0.0) -> dict[str, list]:
    fleet.assign({n: dict.fromkeys(range(8), job) for n in nodes})
    readers = {n: fleet.nodes[n].fabric_reader() for n in nodes}
    out: dict[str, list] = {n: [] for n in nodes}
    for t in range(seconds):
        now = start + t
        fleet.step(now)
        for n in nodes:
            gpus = fleet.nodes[n].read("c", t, now, 1.0).sample.gpus
            out[n].append((gpus, readers[n].read("c", n, t, now, 1.0)))
    return out


def test_a_healthy_gang_keeps_its_ranks_equally_busy_and_its_nics_busy() -> None:
    fleet = a_fleet()
    job = busy_job(fleet)
    out = run(fleet, job, ["sim-000", "sim-001"], 5)
    gpus, fabric = out["sim-001"][-1]
    utils = [g.utilization_pct for g in gpus]
    assert max(utils) - min(utils) < 10
    assert all(n.tx_bytes_per_s and n.tx_bytes_per_s > 1e9 for n in fabric.nics)
    assert fabric.labels["leaf"] == "leaf-0" and fabric.comms[0].job == job


def test_a_slow_gpu_makes_its_peers_wait_and_slows_the_whole_gang() -> None:
    fleet = a_fleet()
    job = busy_job(fleet)
    before = run(fleet, job, ["sim-000", "sim-001"], 5)
    rate_before = fleet.fabric.rhythms[job].iteration_s
    fleet.inject("sim-001", "gpu_slow", 3, None, 5.0)
    after = run(fleet, job, ["sim-000", "sim-001"], 5, start=5.0)
    assert fleet.fabric.rhythms[job].iteration_s > 1.5 * rate_before  # type: ignore[operator]
    gpus = after["sim-001"][-1][0]
    assert gpus[3].sm_clock_mhz < 0.6 * gpus[2].sm_clock_mhz
    assert gpus[3].utilization_pct > gpus[2].utilization_pct + 25  # the straggler is busy, its peers wait
    assert before["sim-000"][-1][0][0].utilization_pct > after["sim-000"][-1][0][0].utilization_pct + 20


def test_a_nic_down_hangs_the_gang_and_shows_in_the_fabric_sample() -> None:
    fleet = a_fleet()
    job = busy_job(fleet)
    run(fleet, job, ["sim-000", "sim-001"], 3)
    fleet.inject("sim-000", "nic_down", None, None, 3.0, nic=5)
    before = fleet.fabric.rhythms[job].iterations
    out = run(fleet, job, ["sim-000", "sim-001"], 3, start=3.0)
    assert fleet.fabric.rhythms[job].iterations == before
    nics = out["sim-000"][-1][1].nics
    assert nics[5].state is LinkState.DOWN and nics[4].state is LinkState.UP
    assert all(n.tx_bytes_per_s == 0 for n in out["sim-001"][-1][1].nics)


def test_a_degraded_link_slows_every_rank_of_the_gangs_that_cross_it() -> None:
    fleet = a_fleet()
    job = busy_job(fleet)
    run(fleet, job, ["sim-000", "sim-001"], 3)
    healthy = fleet.fabric.rhythms[job].iteration_s
    fleet.inject("sim-001", "nic_degraded", None, None, 3.0, nic=2)
    out = run(fleet, job, ["sim-000", "sim-001"], 3, start=3.0)
    assert fleet.fabric.rhythms[job].iteration_s > 1.15 * healthy  # type: ignore[operator]
    assert out["sim-001"][-1][1].nics[2].rate_gbps == 200.0


def test_a_pfc_storm_pauses_every_node_under_the_leaf_and_clear_ends_it() -> None:
    fleet = a_fleet(nodes=10)  # 8 nodes per leaf: sim-008 is under another leaf
    job = busy_job(fleet)
    fleet.inject("sim-001", "pfc_storm", None, None, 0.0)
    out = run(fleet, job, ["sim-000", "sim-001", "sim-008"], 3)
    assert min(n.pause for n in out["sim-000"][-1][1].nics) > 1000  # type: ignore[operator]
    assert max(n.pause for n in out["sim-008"][-1][1].nics) < 100  # type: ignore[operator]
    fleet.inject("sim-005", "clear", None, None, 3.0)
    out = run(fleet, job, ["sim-000"], 3, start=3.0)
    assert max(n.pause for n in out["sim-000"][-1][1].nics) < 100  # type: ignore[operator]


def test_a_nic_that_does_not_exist_is_refused_with_the_valid_indices() -> None:
    fleet = a_fleet()
    with pytest.raises(SimError, match=r"NICs 0\.\.7; --nic 8") as err:
        fleet.inject("sim-000", "nic_down", None, None, 0.0, nic=8)
    assert err.value.field == "nic"
    with pytest.raises(SimError, match=r"GPUs 0\.\.7"):
        fleet.inject("sim-000", "gpu_slow", 9, None, 0.0)
