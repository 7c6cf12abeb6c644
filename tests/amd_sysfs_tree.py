"""Writes AMD Instinct sysfs trees in amdgpu's exact layout, for the adapter's tests and the bench.

Layout and formats as the kernel documents and prints them (sources in node_agent/amd_sysfs.py):
`sys/class/drm/cardN/device` is a link to the PCI device directory (its name is the bus id);
`vendor` "0x1002"; `device` "0x74a1" (MI300X); `unique_id` 16 hex digits; `mem_info_vram_*` bytes;
`gpu_busy_percent`; `hwmon/hwmonN/power1_average|power1_cap` microwatts and `temp2_input|temp2_crit`
millidegrees with `temp2_label` "junction" (MI300 has no edge sensor); `pp_dpm_sclk` with the current
level starred; `ras/features` "feature mask: 0x..."; `ras/<block>_err_count` "ue: N\\nce: N\\n" (UMC adds
"de: N"); `ras/gpu_vram_bad_pages` "0x%08x : 0x%08x : R"; `gpu_metrics` a v1.5 table (the revision MI300X
firmware reports) filled with 0xFF first, as smu_cmn_init_soft_gpu_metrics does; KFD topology nodes with
"name value" properties. Values: an 8 x MI300X platform (192 GB HBM3, 750 W, 304 CUs = 1216 SIMDs,
gfx942 = gfx_target_version 90402) as AMD's data sheet and `amd-smi static` describe it, not captured here.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

MI300X_DEVICE_ID = 0x74A1
MI300X_VRAM = 192 * 1024**3
UMC = "umc"
BLOCKS = ("umc", "gfx", "sdma", "mmhub", "pcie_bif", "hdp", "xgmi_wafl")
COMPUTE_PARTITIONS = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}


@dataclass
class Card:
    root: Path
    index: int
    device: Path  # the PCI device directory (what cardN/device points to)
    bus_id: str

    def write(self, name: str, value: str | bytes) -> None:
        path = self.device / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(value, bytes):
            path.write_bytes(value)
        else:
            path.write_text(value)

    @property
    def hwmon(self) -> Path:
        return self.device / "hwmon" / f"hwmon{self.index + 2}"

    def set_ras(self, block: str, ue: int = 0, ce: int = 0, de: int | None = 0) -> None:
        text = f"ue: {ue}\nce: {ce}\n" + (f"de: {de}\n" if block == UMC and de is not None else "")
        self.write(f"ras/{block}_err_count", text)

    def set_ras_inaccessible(self) -> None:
        """What every `_err_count` answers while a GPU reset runs (amdgpu_ras_sysfs_read)."""
        for block in BLOCKS:
            self.write(f"ras/{block}_err_count", "Query currently inaccessible\n")

    def set_bad_pages(self, reserved: int = 0, pending: int = 0, failed: int = 0) -> None:
        lines = [f"0x{pfn:08x} : 0x00001000 : R\n" for pfn in range(reserved)]
        lines += [f"0x{0x10000 + pfn:08x} : 0x00001000 : P\n" for pfn in range(pending)]
        lines += [f"0x{0x20000 + pfn:08x} : 0x00001000 : F\n" for pfn in range(failed)]
        self.write("ras/gpu_vram_bad_pages", "".join(lines))

    def set_metrics(self, **fields: int) -> None:
        self.write("gpu_metrics", gpu_metrics_v1_5(**fields))

    def set_metrics_v1_7(self, xgmi_status: tuple[int, ...] = (1,) * 7, **fields: int) -> None:
        self.write("gpu_metrics", gpu_metrics_v1_7(xgmi_status=xgmi_status, **fields))

    def remove(self) -> None:
        """The GPU fell off the bus: its files answer nothing."""
        for p in sorted(self.device.rglob("*"), key=lambda p: -len(p.parts)):
            if p.is_file():
                p.unlink()


def gpu_metrics_v1_5(
    *, hotspot: int = 54, mem: int = 48, power: int = 312, gfx: int = 87, umc: int = 41, gfxclk: int = 2100,
    uclk: int = 1300, replays: int = 0,
) -> bytes:  # fmt: skip
    """struct gpu_metrics_v1_5 (328 bytes, kgd_pp_interface.h offsets), 0xFF where not set."""
    buf = bytearray(b"\xff" * 328)
    struct.pack_into("<HBB", buf, 0, 328, 1, 5)
    struct.pack_into("<HHH", buf, 4, hotspot, mem, 40)
    struct.pack_into("<HHH", buf, 10, power, gfx, umc)
    struct.pack_into("<Q", buf, 120, replays)
    struct.pack_into("<8H", buf, 280, *([gfxclk] * 8))
    struct.pack_into("<H", buf, 320, uclk)
    return bytes(buf)


def gpu_metrics_v1_7(*, xgmi_status: tuple[int, ...], hotspot: int = 54, power: int = 312, gfx: int = 87) -> bytes:
    """struct gpu_metrics_v1_7 (2,208 bytes): adds xgmi_link_status[8] at offset 264 (1 up, 0 down)."""
    buf = bytearray(b"\xff" * 2208)
    struct.pack_into("<HBB", buf, 0, 2208, 1, 7)
    struct.pack_into("<H", buf, 4, hotspot)
    struct.pack_into("<HHH", buf, 10, power, gfx, 40)
    links = list(xgmi_status) + [0xFFFF] * (8 - len(xgmi_status))
    struct.pack_into("<8H", buf, 264, *links)
    struct.pack_into("<Q", buf, 112, 0)
    return bytes(buf)


def write_amd_node(
    root: Path,
    gpus: int = 8,
    *,
    compute_partition: str = "SPX",
    memory_partition: str = "NPS1",
    bad_page_threshold: int = -2,
    with_metrics: bool = True,
    nvidia_cards: int = 0,
) -> list[Card]:
    """An 8 x MI300X node under `root` (and `nvidia_cards` NVIDIA cards after them, vendor 0x10de)."""
    drm = root / "sys/class/drm"
    drm.mkdir(parents=True, exist_ok=True)
    kfd = root / "sys/class/kfd/kfd/topology/nodes"
    for cpu in range(2):  # two CPU sockets: KFD lists them first, with no SIMDs
        _write(kfd / str(cpu) / "properties", "cpu_cores_count 96\nsimd_count 0\nvendor_id 0\ndevice_id 0\n")
    module = root / "sys/module/amdgpu"
    _write(module / "version", "6.12.12\n")
    _write(module / "parameters/bad_page_threshold", f"{bad_page_threshold}\n")
    cards = []
    kfd_node = 2
    for i in range(gpus):
        bus = 0x0C + 0x10 * i
        bus_id = f"0000:{bus:02x}:00.0"
        device = root / "sys/devices/pci0000:00" / bus_id
        device.mkdir(parents=True, exist_ok=True)
        card = Card(root, i, device, bus_id)
        (drm / f"card{i}").mkdir(exist_ok=True)
        os.symlink(os.path.relpath(device, drm / f"card{i}"), drm / f"card{i}" / "device")
        card.write("vendor", "0x1002\n")
        card.write("device", f"0x{MI300X_DEVICE_ID:04x}\n")
        card.write("unique_id", f"{0x5A3E7C19D0B24000 + i:016x}\n")
        card.write("serial_number", f"692335{i:06d}\n")
        card.write("mem_info_vram_total", f"{MI300X_VRAM}\n")
        card.write("mem_info_vram_used", f"{(60 + i) * 1024**3}\n")
        card.write("gpu_busy_percent", "87\n")
        card.write("mem_busy_percent", "41\n")
        card.write("pp_dpm_sclk", "0: 500Mhz\n1: 1900Mhz\n2: 2100Mhz *\n")
        card.write("pp_dpm_mclk", "0: 900Mhz\n1: 1300Mhz *\n")
        card.write("pcie_replay_count", "0\n")
        card.write("current_link_speed", "32.0 GT/s PCIe\n")
        card.write("current_link_width", "16\n")
        card.write("current_compute_partition", f"{compute_partition}\n")
        card.write("current_memory_partition", f"{memory_partition}\n")
        hw = card.hwmon
        hw.mkdir(parents=True, exist_ok=True)
        for name, value in (
            ("name", "amdgpu"), ("power1_average", "312000000"), ("power1_cap", "750000000"),
            ("temp2_label", "junction"), ("temp2_input", "54000"), ("temp2_crit", "100000"),
            ("temp3_label", "mem"), ("temp3_input", "48000"),
        ):  # fmt: skip
            (hw / name).write_text(value + "\n")
        card.write("ras/features", "feature mask: 0x3fbff\n")
        for block in BLOCKS:
            card.set_ras(block)
        card.set_bad_pages()
        if with_metrics:
            card.set_metrics()
        parts = COMPUTE_PARTITIONS[compute_partition]
        location = bus << 8
        for _part in range(parts):
            props = (
                f"cpu_cores_count 0\nsimd_count {1216 // parts}\nvendor_id 4098\ndevice_id {MI300X_DEVICE_ID}\n"
                f"location_id {location}\ndomain 0\ngfx_target_version 90402\nnum_xcc {8 // parts}\n"
                f"drm_render_minor {128 + kfd_node - 2}\nunique_id {0x5A3E7C19D0B24000 + i}\n"
            )
            _write(kfd / str(kfd_node) / "properties", props)
            kfd_node += 1
        cards.append(card)
    for j in range(nvidia_cards):
        n = gpus + j
        device = root / "sys/devices/pci0000:80" / f"0000:{0x81 + j:02x}:00.0"
        device.mkdir(parents=True, exist_ok=True)
        (device / "vendor").write_text("0x10de\n")
        (drm / f"card{n}").mkdir(exist_ok=True)
        os.symlink(os.path.relpath(device, drm / f"card{n}"), drm / f"card{n}" / "device")
    return cards


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
