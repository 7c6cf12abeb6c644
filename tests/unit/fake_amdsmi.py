"""A fake of the `amdsmi` 7.x Python package (the one stand-in allowed: this machine has no AMD GPU).

Same function names, arguments and return shapes as amdsmi_interface.py of amdsmi 7.x (ROCm 7):
dicts with the same keys, "N/A" where the library says so, `amdsmi_get_gpu_vram_usage` in MB,
`amdsmi_get_power_info` in W, `amdsmi_get_gpu_cper_entries` -> (entries by index, new cursor,
[{"bytes", "size"}], status), `amdsmi_get_afids_from_cper` -> (afids, count),
`amdsmi_get_gpu_xgmi_link_status` -> {"status": ["U" | "D" | "X" | "N/A"], "total_links"}, errors as
AmdSmiLibraryException. Values are an 8 x MI300X node as `amd-smi metric` describes one, written
down here, not captured. A function the fake does not define raises AttributeError, so the adapter
cannot call anything this fake has not reproduced.

The CPER bytes are a stand-in: a 128-byte header starting "CPER" with its record_length, and the
AFIDs the test chose after it, which only this fake's `amdsmi_get_afids_from_cper` decodes (the real
one parses AMD's CPER sections). Knobs: `unsupported` (function names that raise NOT_SUPPORTED),
`lost` (GPU indices whose calls fail), `push_cper`, `push_event`, and each FakeAmdGpu's fields.
"""

from __future__ import annotations

import struct
import time
import types
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_NO_DATA = 40  # a stand-in code; the adapter only reads "an AmdSmiException"


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, code: int) -> None:
        super().__init__(f"amdsmi error {code}")
        self.err_code = code

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1
    MIN = 2
    MAX_HYST = 3
    MIN_HYST = 4
    CRITICAL = 5


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4


class AmdSmiGpuBlock(IntEnum):  # amdsmi_gpu_block_t: one bit per block
    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    ATHUB = 16
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128


class AmdSmiMemoryPageStatus(IntEnum):
    RESERVED = 0
    PENDING = 1
    UNRESERVABLE = 2


class AmdSmiEvtNotificationType(IntEnum):
    NONE = 0
    VMFAULT = 1
    THERMAL_THROTTLE = 2
    GPU_PRE_RESET = 3
    GPU_POST_RESET = 4


class AmdSmiInitFlags(IntEnum):
    INIT_AMD_GPUS = 2


@dataclass
class FakeAmdGpu:
    index: int
    uuid: str
    bdf: str
    market_name: str = "AMD Instinct MI300X"
    serial: str = "692335000000"
    vram_total_mb: int = 196_608
    vram_used_mb: int = 61_440
    gfx: int = 87
    umc: int = 41
    power_w: int = 612
    limit_w: int = 750
    hotspot_c: int = 64
    crit_c: int = 100
    gfx_mhz: int = 2100
    mem_mhz: int = 1300
    ecc: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # block -> (ce, ue, de)
    bad_pages: list[int] = field(default_factory=list)  # AmdSmiMemoryPageStatus per page
    xgmi: list[str] = field(default_factory=lambda: ["U"] * 7)
    compute_partition: str = "SPX"
    memory_partition: str = "NPS1"
    cper: list[tuple[str, list[int]]] = field(default_factory=list)  # (severity, afids), in arrival order
    events: list[str] = field(default_factory=list)


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def make(gpus: int = 8) -> types.SimpleNamespace:
    """A fresh fake module (a namespace with amdsmi's names) for `gpus` MI300X GPUs."""
    state = [
        FakeAmdGpu(index=i, uuid=f"a1ff74a1-0000-1000-80{i:02x}-5a3e7c19d0b2", bdf=f"0000:{0x0C + 0x10 * i:02x}:00.0")
        for i in range(gpus)
    ]
    handles = [_Handle(i) for i in range(gpus)]
    unsupported: set[str] = set()
    lost: set[int] = set()
    calls: list[str] = []

    def gpu(h: _Handle, name: str) -> FakeAmdGpu:
        calls.append(name)
        if name in unsupported:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        if h.index in lost:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NO_DATA)
        return state[h.index]

    def amdsmi_init(flag: int = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        calls.append("amdsmi_init")

    def amdsmi_shut_down() -> None:
        calls.append("amdsmi_shut_down")

    def amdsmi_get_processor_handles() -> list[_Handle]:
        return list(handles)

    def amdsmi_get_gpu_asic_info(h: _Handle) -> dict[str, Any]:
        g = gpu(h, "amdsmi_get_gpu_asic_info")
        return {
            "market_name": g.market_name, "vendor_id": "0x1002", "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002", "device_id": "0x74a1", "rev_id": "0x00", "asic_serial": g.serial,
            "oam_id": g.index, "num_compute_units": 304, "target_graphics_version": "gfx942",
        }  # fmt: skip

    def amdsmi_get_gpu_device_uuid(h: _Handle) -> str:
        return gpu(h, "amdsmi_get_gpu_device_uuid").uuid

    def amdsmi_get_gpu_device_bdf(h: _Handle) -> str:
        return gpu(h, "amdsmi_get_gpu_device_bdf").bdf

    def amdsmi_get_gpu_driver_info(h: _Handle) -> dict[str, str]:
        gpu(h, "amdsmi_get_gpu_driver_info")
        return {"driver_name": "amdgpu", "driver_version": "6.12.12", "driver_date": "2015/01/01 00:00"}

    def amdsmi_get_gpu_vram_usage(h: _Handle) -> dict[str, int]:
        g = gpu(h, "amdsmi_get_gpu_vram_usage")
        return {"vram_total": g.vram_total_mb, "vram_used": g.vram_used_mb}

    def amdsmi_get_power_info(h: _Handle, sensor_ind: int = 0) -> dict[str, Any]:
        g = gpu(h, "amdsmi_get_power_info")
        return {
            "current_socket_power": g.power_w, "average_socket_power": "N/A", "gfx_voltage": "N/A",
            "soc_voltage": "N/A", "mem_voltage": "N/A", "power_limit": g.limit_w,
        }  # fmt: skip

    def amdsmi_get_temp_metric(h: _Handle, sensor: AmdSmiTemperatureType, metric: AmdSmiTemperatureMetric) -> int:
        g = gpu(h, "amdsmi_get_temp_metric")
        if sensor == AmdSmiTemperatureType.EDGE:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)  # MI300 has no edge sensor
        return g.crit_c if metric == AmdSmiTemperatureMetric.CRITICAL else g.hotspot_c

    def amdsmi_get_clock_info(h: _Handle, clock_type: AmdSmiClkType) -> dict[str, Any]:
        g = gpu(h, "amdsmi_get_clock_info")
        clk = g.mem_mhz if clock_type == AmdSmiClkType.MEM else g.gfx_mhz
        return {"clk": clk, "min_clk": 500, "max_clk": clk, "clk_locked": False, "clk_deep_sleep": False}

    def amdsmi_get_gpu_activity(h: _Handle) -> dict[str, Any]:
        g = gpu(h, "amdsmi_get_gpu_activity")
        return {"gfx_activity": g.gfx, "umc_activity": g.umc, "mm_activity": "N/A"}

    def amdsmi_get_gpu_total_ecc_count(h: _Handle) -> dict[str, int]:
        g = gpu(h, "amdsmi_get_gpu_total_ecc_count")
        ce = sum(c for c, _, _ in g.ecc.values())
        ue = sum(u for _, u, _ in g.ecc.values())
        de = sum(d for _, _, d in g.ecc.values())
        return {"correctable_count": ce, "uncorrectable_count": ue, "deferred_count": de}

    def amdsmi_get_gpu_ecc_count(h: _Handle, block: AmdSmiGpuBlock) -> dict[str, int]:
        g = gpu(h, "amdsmi_get_gpu_ecc_count")
        ce, ue, de = g.ecc.get(AmdSmiGpuBlock(block).name.lower(), (0, 0, 0))
        return {"correctable_count": ce, "uncorrectable_count": ue, "deferred_count": de}

    def amdsmi_get_gpu_bad_page_info(h: _Handle) -> list[dict[str, Any]]:
        g = gpu(h, "amdsmi_get_gpu_bad_page_info")
        return [
            {"value": n, "page_address": 0x1000 * (n + 1), "page_size": 4096, "status": AmdSmiMemoryPageStatus(s)}
            for n, s in enumerate(g.bad_pages)
        ]

    def amdsmi_get_gpu_xgmi_link_status(h: _Handle) -> dict[str, Any]:
        g = gpu(h, "amdsmi_get_gpu_xgmi_link_status")
        return {"status": list(g.xgmi), "total_links": len(g.xgmi)}

    def amdsmi_get_gpu_compute_partition(h: _Handle) -> str:
        return gpu(h, "amdsmi_get_gpu_compute_partition").compute_partition

    def amdsmi_get_gpu_memory_partition(h: _Handle) -> str:
        return gpu(h, "amdsmi_get_gpu_memory_partition").memory_partition

    def amdsmi_get_gpu_process_list(h: _Handle) -> list[dict[str, Any]]:
        g = gpu(h, "amdsmi_get_gpu_process_list")
        return [
            {
                "name": "python3", "pid": 4100 + g.index, "mem": 61 * 1024**3,
                "engine_usage": {"gfx": 0, "enc": 0},
                "memory_usage": {"gtt_mem": 2 * 1024**2, "cpu_mem": 0, "vram_mem": 60 * 1024**3},
                "cu_occupancy": "N/A",
            }
        ]  # fmt: skip

    def amdsmi_get_gpu_cper_entries(
        h: _Handle, severity_mask: int, buffer_size: int = 4 * 1048576, cursor: int = 0
    ) -> tuple[dict[int, dict[str, Any]], int, list[dict[str, Any]], int]:
        g = gpu(h, "amdsmi_get_gpu_cper_entries")
        entries: dict[int, dict[str, Any]] = {}
        data = []
        for n, (severity, afids) in enumerate(g.cper[cursor:]):
            record = _cper_record(afids)
            data.append({"bytes": list(record), "size": len(record)})
            entries[n] = {
                "error_severity": severity, "notify_type": "MCE", "timestamp": "2026/12/01 21:00:00",
                "signature": b"CPER", "revision": 256, "signature_end": "0xffffffff", "sec_cnt": 1,
                "record_length": len(record), "platform_id": b"0x1002:0x74A1", "creator_id": b"amdgpu",
                "record_id": b"%08d" % (cursor + n), "flags": 0, "persistence_info": 0,
            }  # fmt: skip
        return entries, len(g.cper), data, 0

    def amdsmi_get_afids_from_cper(cper_afid_data: Any) -> tuple[list[int], int]:
        records = cper_afid_data if isinstance(cper_afid_data, list) else [{"bytes": list(cper_afid_data)}]
        afids: list[int] = []
        for r in records:
            raw = bytes(r["bytes"])
            count = struct.unpack_from("<I", raw, 128)[0]
            afids.extend(struct.unpack_from(f"<{count}Q", raw, 132))
        return afids, len(afids)

    class AmdSmiEventReader:
        def __init__(self, processor_handle: _Handle, event_types: list[AmdSmiEvtNotificationType]) -> None:
            self.handle = processor_handle

        def read(self, timeout_ms: int, num_elem: int = 10) -> list[dict[str, Any]]:
            g = state[self.handle.index]
            if not g.events:
                time.sleep(min(timeout_ms, 10) / 1000)  # the real reader blocks up to timeout_ms
            out = [{"processor_handle": self.handle, "event": e, "message": ""} for e in g.events]
            g.events.clear()
            return out

        def stop(self) -> None:
            pass

    ns = types.SimpleNamespace(**{k: v for k, v in locals().items() if k.startswith("amdsmi_")})
    for cls in (
        AmdSmiException, AmdSmiLibraryException, AmdSmiTemperatureType, AmdSmiTemperatureMetric, AmdSmiClkType,
        AmdSmiGpuBlock, AmdSmiMemoryPageStatus, AmdSmiEvtNotificationType, AmdSmiInitFlags,
    ):  # fmt: skip
        setattr(ns, cls.__name__, cls)
    ns.AmdSmiEventReader = AmdSmiEventReader
    ns.gpus = state
    ns.unsupported = unsupported
    ns.lost = lost
    ns.calls = calls

    def push_cper(index: int, severity: str, afids: list[int]) -> None:
        state[index].cper.append((severity, afids))

    def push_event(index: int, event: str) -> None:
        state[index].events.append(event)

    ns.push_cper = push_cper
    ns.push_event = push_event
    return ns


def _cper_record(afids: list[int]) -> bytes:
    header = bytearray(128)
    header[0:4] = b"CPER"
    body = struct.pack(f"<I{len(afids)}Q", len(afids), *afids)
    struct.pack_into("<I", header, 20, 128 + len(body))  # record_length (amdsmi_cper_hdr_t)
    return bytes(header) + body
