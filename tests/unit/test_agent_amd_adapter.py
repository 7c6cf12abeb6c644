"""The AMD adapter on recorded sysfs trees and on a fake of amdsmi 7.x: the NVML adapter's contract."""

from __future__ import annotations

import builtins
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from events.faults import FaultKind, Severity
from node_agent.amd_adapter import REREAD_INVENTORY, AmdSampler, AmdUnavailable, import_amdsmi
from node_agent.amd_sysfs import parse_bad_pages, parse_err_count, parse_gpu_metrics
from node_agent.detectors import DetectorState, detect
from node_agent.nvml_adapter import NvmlSampler
from tests.amd_sysfs_tree import gpu_metrics_v1_5, write_amd_node
from tests.unit import fake_amdsmi
from tests.unit.fake_pynvml import FakeNvml


def sysfs_sampler(root: Path) -> AmdSampler:
    return AmdSampler.open(root, use_amdsmi=False, node="mi300-1")


def test_the_kernels_formats_parse() -> None:
    assert parse_err_count("ue: 2\nce: 17\nde: 1\n") is not None
    count = parse_err_count("ue: 2\nce: 17\n")
    assert count is not None and (count.ue, count.ce, count.de) == (2, 17, None)
    assert parse_err_count("Query currently inaccessible\n") is None
    pages = parse_bad_pages("0x00000001 : 0x00001000 : R\n0x00000002 : 0x00001000 : P\n0x00000003 : 0x00001000 : F\n")
    assert (pages.total, pages.reserved, pages.pending, pages.failed) == (3, 1, 1, 1)
    m = parse_gpu_metrics(gpu_metrics_v1_5(hotspot=71, power=655, gfx=99, gfxclk=2000, uclk=1300, replays=4))
    assert m is not None and (m.revision, m.hotspot_c, m.power_w, m.gfx_pct, m.gfxclk_mhz, m.pcie_replays) == (
        (1, 5),
        71.0,
        655.0,
        99.0,
        2000.0,
        4,
    )
    assert parse_gpu_metrics(b"\x10\x00\x09\x09" + bytes(12)) is None  # a revision we do not know


def test_an_mi300x_node_from_sysfs(tmp_path: Path) -> None:
    write_amd_node(tmp_path)
    s = sysfs_sampler(tmp_path)
    inv = s.inventory_gpus()
    assert len(inv) == 8
    g = inv[0]
    assert (g.vendor, g.model, g.name, g.pci_bus_id) == ("amd", "MI300X-192GB", "AMD Instinct MI300X", "0000:0c:00.0")
    assert g.uuid == "GPU-5a3e7c19d0b24000" and g.serial == "692335000000"
    assert (g.memory_total_mib, g.power_limit_w) == (196608, 750)
    assert (g.compute_partition, g.memory_partition) == ("SPX", "NPS1")
    assert s.driver_version == "6.12.12" and s.limits()[0].slowdown_temp_c == 100.0
    assert s.limits()[0].pcie_replays_per_window == 31  # Gen5 x16
    sample = s.read("c", 1, 1000.0, 1.0).sample
    x = sample.gpus[3]
    assert (x.utilization_pct, x.memory_utilization_pct, x.power_w, x.temperature_c) == (87, 41, 312, 54)
    assert (x.sm_clock_mhz, x.mem_clock_mhz, x.memory_used_mib, x.memory_total_mib) == (2100, 1300, 63 * 1024, 196608)
    assert (x.ecc_sbe_volatile, x.ecc_dbe_volatile, x.retired_pages_dbe, x.retired_pages_pending) == (0, 0, 0, False)
    assert x.pcie_replay_count == 0 and x.amd is not None
    assert [b.block for b in x.amd.ras] == ["umc", "gfx", "sdma", "mmhub", "pcie_bif", "hdp", "xgmi_wafl"]
    assert x.amd.bad_page_threshold == 192 * 1024 // 100  # bad_page_threshold=-2: one page per 100 MB


def test_without_gpu_metrics_the_plain_files_give_the_same_figures(tmp_path: Path) -> None:
    write_amd_node(tmp_path / "without", gpus=1, with_metrics=False)
    x = sysfs_sampler(tmp_path / "without").read("c", 1, 1000.0, 1.0).sample.gpus[0]
    assert (x.utilization_pct, x.power_w, x.temperature_c, x.sm_clock_mhz, x.mem_clock_mhz) == (87, 312, 54, 2100, 1300)
    write_amd_node(tmp_path / "with", gpus=1)
    # every field, not only those: the table and the plain files say the same in the recorded trees
    assert x == sysfs_sampler(tmp_path / "with").read("c", 1, 1000.0, 1.0).sample.gpus[0]


def test_figures_that_move_seldom_show_in_the_sample_they_change_in(tmp_path: Path) -> None:
    # A card's seldom-moving figures are kept between samples; each change must still show at once.
    cards = write_amd_node(tmp_path, gpus=1)
    s = sysfs_sampler(tmp_path)
    s.read("c", 1, 1000.0, 1.0)
    cards[0].set_metrics(gfx=50, replays=5)
    x = s.read("c", 2, 1001.0, 1.0).sample.gpus[0]
    assert (x.utilization_pct, x.pcie_replay_count, x.ecc_sbe_volatile) == (50, 5, 0)
    cards[0].set_ras("gfx", ce=2)
    x = s.read("c", 3, 1002.0, 1.0).sample.gpus[0]
    assert (x.utilization_pct, x.pcie_replay_count, x.ecc_sbe_volatile) == (50, 5, 2)
    assert x.amd is not None and [(b.block, b.ce) for b in x.amd.ras][1] == ("gfx", 2)
    (cards[0].hwmon / "power1_cap").write_text("650000000\n")
    [s.inventory_gpus() for _ in range(REREAD_INVENTORY)]
    x = s.read("c", 4, 1003.0, 1.0).sample.gpus[0]
    assert (x.power_limit_w, x.pcie_replay_count, x.ecc_sbe_volatile) == (650, 5, 2)


def test_ras_blocks_are_those_features_enables_asked_again_each_inventory_pass(tmp_path: Path) -> None:
    cards = write_amd_node(tmp_path, gpus=1)
    (cards[0].device / "ras/hdp_err_count").unlink()  # not made yet when the agent starts
    cards[0].write("ras/features", "feature mask: 0x3fb7f\n")  # xgmi_wafl's bit (7) clear
    s = sysfs_sampler(tmp_path)
    state, _ = detect(DetectorState(), s.read("c", 1, 1000.0, 1.0))
    blocks = ["umc", "gfx", "sdma", "mmhub", "pcie_bif"]
    assert [b.block for b in state_ras(s, 2)] == blocks
    cards[0].set_ras("hdp", ue=1)  # the block appears, with an uncorrectable error
    cards[0].write("ras/features", "feature mask: 0x3fbff\n")
    assert [b.block for b in state_ras(s, 3)] == blocks  # until the next inventory pass
    [s.inventory_gpus() for _ in range(REREAD_INVENTORY)]
    _, faults = detect(state, s.read("c", 4, 1003.0, 1.0))
    assert [(f.kind, f.ras_block) for f in faults] == [(FaultKind.AMD_RAS_UE, "hdp")]
    assert [b.block for b in state_ras(s, 5)] == [*blocks, "hdp", "xgmi_wafl"]


def state_ras(s: AmdSampler, seq: int) -> list[Any]:
    x = s.read("c", seq, 1000.0 + seq, 1.0).sample.gpus[0]
    assert x.amd is not None
    return x.amd.ras


def test_fields_a_board_leaves_unfilled_in_gpu_metrics_come_from_the_plain_files(tmp_path: Path) -> None:
    na16, na64 = 0xFFFF, 0xFFFFFFFFFFFFFFFF
    cards = write_amd_node(tmp_path, gpus=1)
    cards[0].write("pcie_replay_count", "3\n")
    cards[0].set_metrics(hotspot=71, power=655, gfx=99, umc=na16, gfxclk=2000, uclk=na16, replays=na64)
    s = sysfs_sampler(tmp_path)
    x = s.read("c", 1, 1000.0, 1.0).sample.gpus[0]
    # the table's figures where it has them; no UMC activity is unknown (not the busy file's figure)
    assert (x.utilization_pct, x.memory_utilization_pct, x.power_w, x.temperature_c) == (99, None, 655, 71)
    assert (x.sm_clock_mhz, x.mem_clock_mhz, x.pcie_replay_count) == (2000, 1300, 3)  # pp_dpm_mclk's starred level
    cards[0].set_metrics(hotspot=71, power=655, gfx=na16, umc=40)
    x = s.read("c", 2, 1001.0, 1.0).sample.gpus[0]
    assert (x.utilization_pct, x.memory_utilization_pct, x.power_w, x.temperature_c) == (87, 40, 655, 71)
    assert (x.sm_clock_mhz, x.mem_clock_mhz, x.pcie_replay_count) == (2100, 1300, 0)


def test_an_amd_sample_fills_every_field_its_nvidia_neighbour_fills(tmp_path: Path) -> None:
    write_amd_node(tmp_path, gpus=1)
    amd = sysfs_sampler(tmp_path).read("c", 1, 1000.0, 1.0).sample.gpus[0]
    smi = AmdSampler.open(tmp_path, amdsmi=fake_amdsmi.make(1)).read("c", 1, 1000.0, 1.0).sample.gpus[0]
    nvml = NvmlSampler.open(FakeNvml(1), watch_xids=False)
    nv = nvml.read("c", 1, 1000.0, 1.0).sample.gpus[0]
    nvml.close()
    # Not on AMD: per-cause page retirement (AMD retires pages without a cause), row remapping (AMD retires
    # pages instead), NVLink (XGMI is reported in `amd`). Processes: amdsmi only (sysfs has no process list).
    not_on_amd = {"retired_pages_sbe", "row_remap", "nvlink", "nvlink_total", "sm_activity_pct"}
    filled = {f for f in nv.__struct_fields__ if getattr(nv, f) not in (None, [])} - not_on_amd
    assert filled - {f for f in amd.__struct_fields__ if getattr(amd, f) not in (None, [])} == {"processes"}
    assert filled - {f for f in smi.__struct_fields__ if getattr(smi, f) not in (None, [])} == {"pcie_replay_count"}


def test_the_vendor_is_told_per_device(tmp_path: Path) -> None:
    write_amd_node(tmp_path, gpus=2, nvidia_cards=2)
    assert [g.pci_bus_id for g in sysfs_sampler(tmp_path).inventory_gpus()] == ["0000:0c:00.0", "0000:1c:00.0"]


def test_no_amd_gpu_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AmdUnavailable, match=r"no AMD GPU here: none under .* with vendor 0x1002"):
        sysfs_sampler(tmp_path)


@pytest.mark.parametrize("error", [KeyError("ROCM_PATH"), OSError("libamd_smi.so: cannot open shared object file")])
def test_a_missing_libamd_smi_says_which_library(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    real_import = builtins.__import__

    def failing(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "amdsmi":
            raise error
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.setattr(builtins, "__import__", failing)
    with pytest.raises(AmdUnavailable, match=r"libamd_smi\.so"):
        import_amdsmi()


def test_cpx_partitions_are_the_nodes_gpus(tmp_path: Path) -> None:
    write_amd_node(tmp_path, gpus=8, compute_partition="CPX", memory_partition="NPS4")
    s = sysfs_sampler(tmp_path)
    inv = s.inventory_gpus()
    assert len(inv) == 64 and {g.memory_total_mib for g in inv} == {196608 / 8}
    assert inv[9].uuid == "GPU-5a3e7c19d0b24001-p1" and inv[9].compute_partition == "CPX"
    x = s.read("c", 1, 1000.0, 1.0).sample.gpus
    assert [(g.index, g.uuid) for g in x[8:10]] == [(8, inv[8].uuid), (9, inv[9].uuid)]
    assert x[9].memory_total_mib == 196608 / 8 and x[9].memory_used_mib == x[8].memory_used_mib
    assert x[9].memory_used_mib == 61 * 1024 / 8  # card 1 has 61 GiB in use (tests/amd_sysfs_tree.py)
    # A UE on card 1 faults each of its 8 partitions.
    (tmp_path / "sys/devices/pci0000:00/0000:1c:00.0/ras/umc_err_count").write_text("ue: 1\nce: 0\nde: 0\n")
    state, _ = detect(DetectorState(), _zero(s, tmp_path))
    _, faults = detect(state, s.read("c", 2, 1001.0, 1.0))
    assert sorted(f.gpu_index for f in faults if f.kind == FaultKind.AMD_RAS_UE) == list(range(8, 16))


def _zero(s: AmdSampler, root: Path) -> Any:
    path = root / "sys/devices/pci0000:00/0000:1c:00.0/ras/umc_err_count"
    text = path.read_text()
    path.write_text("ue: 0\nce: 0\nde: 0\n")
    reading = s.read("c", 1, 1000.0, 1.0)
    path.write_text(text)
    return reading


def faults_after(s: AmdSampler, change: Any, *, at: float = 1001.0, state: DetectorState | None = None) -> list:
    state, _ = detect(state or DetectorState(), s.read("c", 1, 1000.0, 1.0))
    change()
    _, faults = detect(state, s.read("c", 2, at, 1.0))
    return faults


def test_a_umc_uncorrectable_error_is_an_amd_ras_fault_naming_the_block(tmp_path: Path) -> None:
    cards = write_amd_node(tmp_path, gpus=2)
    s = sysfs_sampler(tmp_path)
    faults = faults_after(s, lambda: cards[1].set_ras("umc", ue=1, ce=3))
    assert [(f.kind, f.severity, f.gpu_index, f.ras_block) for f in faults] == [
        (FaultKind.AMD_RAS_UE, Severity.CRITICAL, 1, "umc")
    ]
    assert s.read("c", 3, 1002.0, 1.0).sample.gpus[1].ecc_dbe_volatile == 1  # the DBE analogue


def test_bad_pages_past_one_page_of_sysfs_are_all_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cards = write_amd_node(tmp_path, gpus=1)
    cards[0].set_bad_pages(reserved=300, pending=2)  # 302 lines of 28 bytes: three reads of a binary attribute
    real = os.pread
    # kernfs answers a binary attribute (gpu_vram_bad_pages) at most a page per read, in whole lines
    monkeypatch.setattr(os, "pread", lambda fd, n, at: real(fd, min(n, 4096 // 28 * 28), at))
    x = sysfs_sampler(tmp_path).read("c", 1, 1000.0, 1.0).sample.gpus[0]
    assert x.amd is not None and (x.amd.bad_pages, x.amd.bad_pages_pending) == (302, 2)
    assert (x.retired_pages_dbe, x.retired_pages_pending) == (300, True)


def test_corrected_errors_alone_are_no_fault(tmp_path: Path) -> None:
    cards = write_amd_node(tmp_path, gpus=1)
    assert faults_after(sysfs_sampler(tmp_path), lambda: cards[0].set_ras("gfx", ce=12)) == []


def test_bad_pages_past_the_threshold_are_critical_and_near_it_a_warning(tmp_path: Path) -> None:
    cards = write_amd_node(tmp_path, gpus=1, bad_page_threshold=20)
    s = sysfs_sampler(tmp_path)
    warn = faults_after(s, lambda: cards[0].set_bad_pages(reserved=18))
    assert [(f.kind, f.severity) for f in warn] == [(FaultKind.AMD_BAD_PAGES, Severity.WARNING)]
    crit = faults_after(s, lambda: cards[0].set_bad_pages(reserved=19, pending=1))
    assert (FaultKind.AMD_BAD_PAGES, Severity.CRITICAL) in [(f.kind, f.severity) for f in crit]


def test_a_reset_that_does_not_complete_in_60s_is_stuck(tmp_path: Path) -> None:
    cards = write_amd_node(tmp_path, gpus=1)
    s = sysfs_sampler(tmp_path)
    state, _ = detect(DetectorState(), s.read("c", 1, 1000.0, 1.0))
    cards[0].set_ras_inaccessible()
    kinds = []
    for n, t in enumerate((1001.0, 1030.0, 1060.9, 1061.0, 1062.0)):
        state, faults = detect(state, s.read("c", 2 + n, t, 1.0))
        kinds.append([f.kind for f in faults])
    assert kinds == [[], [], [], [FaultKind.GPU_RESET_STUCK], []]  # once, 60 s after the reset began


def test_a_reset_that_completes_is_no_fault(tmp_path: Path) -> None:
    cards = write_amd_node(tmp_path, gpus=1)
    s = sysfs_sampler(tmp_path)
    state, _ = detect(DetectorState(), s.read("c", 1, 1000.0, 1.0))
    cards[0].set_ras_inaccessible()
    state, _ = detect(state, s.read("c", 2, 1001.0, 1.0))
    for block in ("umc", "gfx", "sdma", "mmhub", "pcie_bif", "hdp", "xgmi_wafl"):
        cards[0].set_ras(block)
    state, faults = detect(state, s.read("c", 3, 1020.0, 1.0))
    _, later = detect(state, s.read("c", 4, 1090.0, 1.0))
    assert faults == [] and later == []


def test_an_xgmi_link_down_is_a_fabric_fault(tmp_path: Path) -> None:
    cards = write_amd_node(tmp_path, gpus=1)
    cards[0].set_metrics_v1_7()
    s = sysfs_sampler(tmp_path)
    faults = faults_after(s, lambda: cards[0].set_metrics_v1_7(xgmi_status=(1, 1, 0, 1, 1, 1, 1)))
    assert [(f.kind, f.severity) for f in faults] == [(FaultKind.XGMI, Severity.CRITICAL)]
    assert "link(s) 2 of 7 down" in faults[0].detail


def test_a_gpu_whose_files_are_gone_is_lost(tmp_path: Path) -> None:
    cards = write_amd_node(tmp_path, gpus=2)
    s = sysfs_sampler(tmp_path)
    faults = faults_after(s, cards[0].remove)
    assert [(f.kind, f.gpu_index) for f in faults] == [(FaultKind.GPU_LOST, 0)]


def test_amdsmi_gives_the_same_figures(tmp_path: Path) -> None:
    smi = fake_amdsmi.make(2)
    s = AmdSampler.open(tmp_path, amdsmi=smi)
    g = s.inventory_gpus()[1]
    assert (g.vendor, g.model, g.uuid, g.pci_bus_id, g.power_limit_w) == (
        "amd",
        "MI300X-192GB",
        smi.gpus[1].uuid,
        "0000:1c:00.0",
        750,
    )
    x = s.read("c", 1, 1000.0, 1.0).sample.gpus[1]
    assert (x.utilization_pct, x.memory_used_mib, x.memory_total_mib, x.power_w, x.temperature_c) == (
        87,
        61_440,
        196_608,
        612,
        64,
    )
    assert (x.sm_clock_mhz, x.mem_clock_mhz, x.ecc_dbe_volatile) == (2100, 1300, 0)
    assert x.processes[0].pid == 4101 and x.processes[0].used_memory_mib == 60 * 1024
    s.close()


def test_amdsmi_faults_umc_cper_reset_and_xgmi(tmp_path: Path) -> None:
    smi = fake_amdsmi.make(2)
    s = AmdSampler.open(tmp_path, amdsmi=smi)
    state, _ = detect(DetectorState(), s.read("c", 1, 1000.0, 1.0))
    smi.gpus[0].ecc["umc"] = (4, 1, 0)
    smi.gpus[1].xgmi[3] = "D"
    smi.push_cper(1, "fatal", [30])
    smi.push_cper(0, "non_fatal_corrected", [])
    state, faults = detect(state, s.read("c", 2, 1001.0, 1.0))
    got = sorted((f.kind, f.gpu_index, f.severity, f.ras_block, f.afid) for f in faults)
    assert got == sorted(
        [
            (FaultKind.AMD_RAS_UE, 0, Severity.CRITICAL, "umc", None),
            (FaultKind.XGMI, 1, Severity.CRITICAL, None, None),
            (FaultKind.AMD_CPER, 1, Severity.CRITICAL, None, 30),
            (FaultKind.AMD_CPER, 0, Severity.INFO, None, None),
        ]
    )
    _, again = detect(state, s.read("c", 3, 1002.0, 1.0))
    assert again == []  # each record once (the CPER cursor moved); conditions once
    s.close()


def test_amdsmi_reset_notifications_start_the_60s_clock(tmp_path: Path) -> None:
    smi = fake_amdsmi.make(1)
    s = AmdSampler.open(tmp_path, amdsmi=smi)
    state, _ = detect(DetectorState(), s.read("c", 1, 1000.0, 1.0))
    smi.push_event(0, "GPU_PRE_RESET")
    import time

    deadline = time.monotonic() + 5
    reading = s.read("c", 2, 1000.0, 1.0)
    while not reading.amd_events and time.monotonic() < deadline:
        time.sleep(0.02)
        reading = s.read("c", 2, 1000.0, 1.0)
    assert [e.kind for e in reading.amd_events] == ["reset_begin"]
    at = reading.amd_events[0].at
    state, _ = detect(state, reading)
    _, faults = detect(state, s.read("c", 3, at + 61, 1.0))
    assert [f.kind for f in faults] == [FaultKind.GPU_RESET_STUCK]
    s.close()


def test_amdsmi_asks_the_block_counts_only_when_the_ecc_total_moves(tmp_path: Path) -> None:
    # The per-block counts are read when the total moves, in that same sample (no added latency), and
    # at each inventory pass; while the total holds, the blocks read last stand.
    smi = fake_amdsmi.make(2)
    s = AmdSampler.open(tmp_path, amdsmi=smi)
    state, _ = detect(DetectorState(), s.read("c", 1, 1000.0, 1.0))
    smi.calls.clear()
    state, _ = detect(state, s.read("c", 2, 1001.0, 1.0))
    assert smi.calls.count("amdsmi_get_gpu_ecc_count") == 0 and smi.calls.count("amdsmi_get_gpu_total_ecc_count") == 2
    smi.gpus[1].ecc["xgmi_wafl"] = (0, 1, 0)
    reading = s.read("c", 3, 1002.0, 1.0)
    assert smi.calls.count("amdsmi_get_gpu_ecc_count") == 7  # GPU 1's seven blocks, not GPU 0's
    _, faults = detect(state, reading)
    assert [(f.kind, f.gpu_index, f.ras_block) for f in faults] == [(FaultKind.AMD_RAS_UE, 1, "xgmi_wafl")]
    health = s.read("c", 4, 1003.0, 1.0).sample.gpus[0].amd
    smi.calls.clear()
    for _ in range(REREAD_INVENTORY):
        s.inventory_gpus()
    assert s.read("c", 5, 1004.0, 1.0).sample.gpus[0].amd is health
    assert smi.calls.count("amdsmi_get_gpu_ecc_count") == 14  # after an inventory pass: every block
    # the blocks read the same: the source keeps handing the same health object (the detectors' fast path)
    assert s.source.sample(0, "x")[1] is health
    s.close()


def test_amdsmi_skips_what_the_gpu_does_not_support_until_the_next_pass(tmp_path: Path) -> None:
    smi = fake_amdsmi.make(1)
    smi.unsupported.add("amdsmi_get_gpu_xgmi_link_status")
    s = AmdSampler.open(tmp_path, amdsmi=smi)
    first = s.read("c", 1, 1000.0, 1.0).sample.gpus[0]
    smi.calls.clear()
    again = s.read("c", 2, 1001.0, 1.0).sample.gpus[0]
    assert "amdsmi_get_gpu_xgmi_link_status" not in smi.calls  # NOT_SUPPORTED: not asked every sample
    assert first.amd is not None and again.amd is not None and again.amd.xgmi_links is None
    assert (again.utilization_pct, again.power_w) == (87, 612)
    smi.unsupported.clear()  # a firmware update: the next inventory pass asks again
    for _ in range(REREAD_INVENTORY):
        s.inventory_gpus()
    x = s.read("c", 3, 1002.0, 1.0).sample.gpus[0]
    assert x.amd is not None and x.amd.xgmi_links == 7
    s.close()


def test_amdsmi_a_failure_that_is_not_unsupported_is_asked_again(tmp_path: Path) -> None:
    # A GPU that answers nothing (NO_DATA) is lost for that sample; its calls are not dropped, so it
    # reads again as soon as it answers.
    smi = fake_amdsmi.make(2)
    s = AmdSampler.open(tmp_path, amdsmi=smi)
    s.read("c", 1, 1000.0, 1.0)
    smi.lost.add(1)
    assert s.read("c", 2, 1001.0, 1.0).lost_gpus == frozenset({1})
    smi.lost.clear()
    smi.gpus[1].ecc["umc"] = (0, 1, 0)
    reading = s.read("c", 3, 1002.0, 1.0)
    x = reading.sample.gpus[1]
    assert reading.lost_gpus == frozenset() and (x.utilization_pct, x.ecc_dbe_volatile) == (87, 1)
    s.close()


def test_amdsmi_a_package_without_a_function_leaves_its_field_empty(tmp_path: Path) -> None:
    smi = fake_amdsmi.make(1)
    s = AmdSampler.open(tmp_path, amdsmi=smi)
    assert s.source.lacking == set()  # type: ignore[union-attr]  # the fake has every function called
    s.close()
    older = fake_amdsmi.make(1)
    del older.amdsmi_get_gpu_cper_entries, older.amdsmi_get_gpu_process_list
    s = AmdSampler.open(tmp_path, amdsmi=older)
    reading = s.read("c", 1, 1000.0, 1.0)
    assert reading.sample.gpus[0].processes == [] and reading.amd_events == ()
    assert s.source.lacking == {"amdsmi_get_gpu_cper_entries", "amdsmi_get_gpu_process_list"}  # type: ignore[union-attr]
    s.close()


def test_a_new_partition_mode_shows_at_the_next_inventory_pass(tmp_path: Path) -> None:
    # Identity is read once; the partition mode (and the KFD topology, when the mode moved) every pass.
    cards = write_amd_node(tmp_path / "node", gpus=8)
    s = sysfs_sampler(tmp_path / "node")
    assert len(s.inventory_gpus()) == 8
    write_amd_node(tmp_path / "cpx", gpus=8, compute_partition="CPX", memory_partition="NPS4")
    kfd = "sys/class/kfd/kfd/topology/nodes"
    shutil.rmtree(tmp_path / "node" / kfd)
    shutil.copytree(tmp_path / "cpx" / kfd, tmp_path / "node" / kfd)
    for card in cards:  # the driver reconfigured: same files, new contents
        card.write("current_compute_partition", "CPX\n")
        card.write("current_memory_partition", "NPS4\n")
    inv = [s.inventory_gpus() for _ in range(REREAD_INVENTORY)][-1]
    assert len(inv) == 64 and inv[9].uuid == "GPU-5a3e7c19d0b24001-p1" and inv[9].compute_partition == "CPX"


def test_a_gpu_whose_metrics_move_is_not_checked_for_removal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A live GPU's gpu_metrics changes every read: the removal check (an fstat) is for a table that did not.
    cards = write_amd_node(tmp_path, gpus=1)
    s = sysfs_sampler(tmp_path)
    s.read("c", 1, 1000.0, 1.0)
    checks = []
    real_fstat = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: checks.append(fd) or real_fstat(fd))
    cards[0].set_metrics(gfx=12)
    s.read("c", 2, 1001.0, 1.0)
    assert checks == []
    s.read("c", 3, 1002.0, 1.0)  # the same table again: checked
    assert len(checks) == 1
