"""A simulated fleet that mixes AMD and NVIDIA nodes: the AMD nodes sample like the AMD adapter, and
each injected AMD fault class reaches the detectors as the fault the health policy isolates."""

from __future__ import annotations

import pytest

from events.faults import FaultKind
from node_agent.detectors import DetectorState, detect
from node_agent.sim.fleet import SimError, SimFleet
from node_agent.sim.models import gpu_model


def fleet() -> SimFleet:
    return SimFleet(seed=1, nodes=4, gpus_per_node=8, model=gpu_model("H100-80GB"), amd_nodes=2,
                    amd_model=gpu_model("MI300X-192GB"))  # fmt: skip


def test_the_last_nodes_are_amd_nodes_with_every_field() -> None:
    f = fleet()
    vendors = {name: {g.vendor for g in node.inventory_gpus()} for name, node in f.nodes.items()}
    assert vendors == {"sim-000": {"nvidia"}, "sim-001": {"nvidia"}, "sim-002": {"amd"}, "sim-003": {"amd"}}
    amd = f.nodes["sim-003"]
    g = amd.inventory_gpus()[0]
    assert (g.model, g.compute_partition, g.nvlink_links) == ("MI300X-192GB", "SPX", None)
    x = amd.read("c", 1, 1000.0, 1.0).sample.gpus[0]
    assert x.amd is not None and x.amd.xgmi_links == 7 and x.nvlink == [] and x.row_remap is None
    assert amd.read("c", 2, 1001.0, 1.0).sample.gpus[0].amd is x.amd  # unchanged: the same object


@pytest.mark.parametrize(
    ("kind", "fault"),
    [
        ("amd_umc_ue", FaultKind.AMD_RAS_UE),
        ("ecc_dbe", FaultKind.AMD_RAS_UE),
        ("amd_gfx_ue", FaultKind.AMD_RAS_UE),
        ("amd_bad_pages", FaultKind.AMD_BAD_PAGES),
        ("amd_cper_fatal", FaultKind.AMD_CPER),
        ("xgmi_down", FaultKind.XGMI),
    ],
)
def test_each_amd_fault_class_is_detected(kind: str, fault: FaultKind) -> None:
    f = fleet()
    node = f.nodes["sim-002"]
    state, _ = detect(DetectorState(), node.read("c", 1, 1000.0, 1.0))
    f.inject("sim-002", kind, 3, None, 1000.5)
    _, faults = detect(state, node.read("c", 2, 1001.0, 1.0))
    assert [(x.kind, x.gpu_index) for x in faults] == [(fault, 3)]


def test_a_reset_that_hangs_is_stuck_after_60s() -> None:
    f = fleet()
    node = f.nodes["sim-002"]
    state, _ = detect(DetectorState(), node.read("c", 1, 1000.0, 1.0))
    f.inject("sim-002", "amd_reset_hang", 1, None, 1000.5)
    found = []
    for n in range(70):
        state, faults = detect(state, node.read("c", 2 + n, 1001.0 + n, 1.0))
        found += [(x.kind, x.observed_at) for x in faults]
    assert found == [(FaultKind.GPU_RESET_STUCK, 1061.0)]


def test_amd_faults_are_refused_on_nvidia_nodes_and_nvlink_on_amd_nodes() -> None:
    f = fleet()
    with pytest.raises(SimError, match="AMD fault"):
        f.inject("sim-000", "amd_umc_ue", 0, None, 1.0)
    with pytest.raises(SimError, match="AMD node"):
        f.inject("sim-002", "nvlink", 0, None, 1.0)


def test_sim_fault_offers_every_kind_the_simulator_takes() -> None:
    from node_agent.sim.fleet import SimFaultKind
    from services.cli.sim_fault import KINDS

    assert set(KINDS) == {k.value for k in SimFaultKind}
