"""The NVML adapter's field mapping, against a fake of pynvml's functions (no GPU on this machine)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pynvml
import pytest

from events import NvLinkCounters, ProcessInfo, RowRemapState
from node_agent import selfcheck
from node_agent.detectors import DetectorState, detect
from node_agent.nvml_adapter import NvmlSampler, NvmlUnavailable, normalized_model
from tests.unit.fake_pynvml import FakeNvml


def open_fake(nvml: FakeNvml | None = None, *, watch_xids: bool = False) -> tuple[NvmlSampler, FakeNvml]:
    fake = nvml or FakeNvml()
    return NvmlSampler.open(fake, node="gpu-node-1", watch_xids=watch_xids), fake


def test_the_inventory_maps_nvml_identity_and_capabilities() -> None:
    sampler, _ = open_fake()
    gpus = sampler.inventory_gpus()
    assert len(gpus) == 8
    g = gpus[3]
    assert g.index == 3 and g.uuid == "GPU-5d1e7a3c-0c2b-4f1e-9a7d-3b2c1d0e0003"
    assert (g.model, g.name, g.serial) == ("H100-80GB", "NVIDIA H100 80GB HBM3", "1653223010003")
    assert g.pci_bus_id == "00000000:48:00.0"
    assert (g.memory_total_mib, g.mig_mode, g.power_limit_w, g.nvlink_links) == (81_559, False, 700.0, 18)
    assert (sampler.driver_version, sampler.cuda_version) == ("550.90.07", "12.4")
    assert sampler.limits()[3].slowdown_temp_c == 87.0 and sampler.limits()[3].pcie_replays_per_window == 31


def test_a_sample_maps_every_field_with_nvmls_units() -> None:
    sampler, fake = open_fake()
    fake.gpus[1].reasons = 0x8 | 0x20 | 0x4  # HW slowdown, SW thermal slowdown, SW power cap
    fake.gpus[1].sbe, fake.gpus[1].dbe = 12, 1
    fake.gpus[1].remap = (3, 1, 1, 0)
    fake.gpus[1].pcie_replays = 5
    fake.gpus[1].link_errors = {
        (2, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT): 7,
        (2, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 2,
    }
    reading = sampler.read("c1", 42, 1000.0, 1.0)
    assert (reading.sample.node, reading.sample.seq, reading.sample.cluster) == ("gpu-node-1", 42, "c1")
    g = reading.sample.gpus[1]
    assert (g.utilization_pct, g.memory_utilization_pct) == (87.0, 41.0)
    assert (g.memory_used_mib, g.memory_total_mib) == (61_440.0, 81_559.0)
    assert (g.power_w, g.power_limit_w) == (612.5, 700.0)  # NVML reports milliwatts
    assert (g.temperature_c, g.sm_clock_mhz, g.mem_clock_mhz) == (64.0, 1980.0, 2619.0)
    assert g.throttle_reasons == ["sw_power_cap", "hw_slowdown", "sw_thermal_slowdown"]
    assert (g.ecc_sbe_volatile, g.ecc_dbe_volatile) == (12, 1)
    assert (g.retired_pages_sbe, g.retired_pages_dbe, g.retired_pages_pending) == (0, 0, False)
    assert g.row_remap == RowRemapState(correctable=3, uncorrectable=1, pending=True, failure=False)
    assert g.pcie_replay_count == 5
    assert len(g.nvlink) == 18
    assert g.nvlink[2] == NvLinkCounters(
        link=2, crc_flit_errors=7, crc_data_errors=0, replay_errors=2, recovery_errors=0
    )
    assert g.processes == [ProcessInfo(pid=4243, name="python3", used_memory_mib=61_000.0)]
    assert reading.sample.gpus[6].processes == []


def test_fields_the_gpu_does_not_support_are_empty_and_never_crash_the_agent() -> None:
    fake = FakeNvml(gpus=2)
    fake.unsupported = {
        "nvmlDeviceGetSerial", "nvmlDeviceGetMigMode", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetTemperatureThreshold", "nvmlSystemGetProcessName",
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlSystemGetCudaDriverVersion",
    }  # fmt: skip
    sampler, _ = open_fake(fake)
    info = sampler.inventory_gpus()[0]
    assert (info.serial, info.mig_mode, info.nvlink_links) == (None, None, None)
    assert sampler.cuda_version is None and sampler.limits()[0].slowdown_temp_c == 85.0
    g = sampler.read("c1", 0, 1000.0, 1.0).sample.gpus[0]
    assert (g.row_remap, g.ecc_sbe_volatile, g.ecc_dbe_volatile, g.power_w) == (None, None, None, None)
    assert (g.retired_pages_sbe, g.retired_pages_pending, g.nvlink, g.throttle_reasons) == (None, None, [], [])
    assert g.utilization_pct == 87.0 and g.processes[0].name == ""


def test_a_gpu_that_falls_off_the_bus_is_lost_then_a_critical_fault_once() -> None:
    sampler, fake = open_fake()
    state = DetectorState()
    found = []
    for seq in range(6):
        if seq == 2:
            fake.lost.add(5)
        if seq == 5:
            fake.lost.clear()
        reading = sampler.read("c1", seq, 1000.0 + seq, 1.0)
        state, faults = detect(state, reading, sampler.limits())
        found.append([(f.kind.value, f.severity.value, f.gpu_index, f.gpu_uuid) for f in faults])
        if seq in (2, 3, 4):
            assert reading.lost_gpus == {5} and reading.sample.gpus[5].utilization_pct is None
            assert sampler.inventory_gpus()[5].model == "H100-80GB"  # still what it was: no inventory churn
    uuid = "GPU-5d1e7a3c-0c2b-4f1e-9a7d-3b2c1d0e0005"
    assert found == [[], [], [("gpu_lost", "critical", 5, uuid)], [], [], []]


def test_xid_events_are_read_in_a_thread_and_reach_the_next_reading() -> None:
    sampler, fake = open_fake(watch_xids=True)
    try:
        assert {mask for _, mask in fake.registered} == {pynvml.nvmlEventTypeXidCriticalError}
        assert len(fake.registered) == 8
        fake.push_xid(5, 79)
        fake.push_xid(2, 13)
        deadline = time.monotonic() + 5
        xids: list[tuple[int, int]] = []
        while len(xids) < 2 and time.monotonic() < deadline:
            xids += [(x.gpu_index, x.xid) for x in sampler.read("c1", 0, 1000.0, 1.0).xids]
            time.sleep(0.02)
        assert xids == [(5, 79), (2, 13)]
    finally:
        sampler.close()
    assert "nvmlEventSetFree" in fake.calls and "nvmlShutdown" in fake.calls


def test_no_driver_is_a_clear_error() -> None:
    with pytest.raises(NvmlUnavailable, match=r"no NVIDIA driver here.*--simulate"):
        NvmlSampler.open(FakeNvml(driver=False))


def test_selfcheck_prints_inventory_and_one_sample_as_json() -> None:
    out = io.StringIO()
    assert selfcheck.main(FakeNvml(gpus=2), out) == 0
    report = json.loads(out.getvalue())
    assert [g["model"] for g in report["inventory"]] == ["H100-80GB", "H100-80GB"]
    assert report["sample"]["gpus"][0]["power_w"] == 612.5 and report["driver_version"] == "550.90.07"
    # this machine's firmware identity ({} where it has no readable DMI, as in most containers)
    assert set(report["host"]) <= {"provider", "instance_type", "instance_id", "sys_vendor", "product_name",
                                   "product_uuid", "board_asset_tag", "chassis_asset_tag"}  # fmt: skip


def test_selfcheck_without_a_driver_exits_non_zero_with_a_clear_message() -> None:
    result = subprocess.run([sys.executable, "-m", "node_agent.selfcheck"], capture_output=True, text=True, timeout=60)
    if result.returncode == 0:
        pytest.skip("this machine has an NVIDIA driver")  # then the selfcheck printed real NVML data
    assert result.returncode == selfcheck.EXIT_NO_DRIVER
    assert "no NVIDIA driver here" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("name", "mib", "model"),
    [
        ("NVIDIA H100 80GB HBM3", 81_559, "H100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40_960, "A100-40GB"),
        ("NVIDIA H200", 143_771, "H200-141GB"),
        ("NVIDIA L40S", 46_068, "L40S-48GB"),
        ("NVIDIA B200", 183_359, "B200-180GB"),
        ("Tesla V100-SXM2-16GB", 16_384, "V100-16GB"),
    ],
)
def test_model_names_are_normalized(name: str, mib: int, model: str) -> None:
    assert normalized_model(name, mib) == model
