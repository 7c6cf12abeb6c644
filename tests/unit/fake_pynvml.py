"""A fake of pynvml's functions (the one stand-in allowed: this machine has no GPU).

Same function names and argument lists as `pynvml` (nvidia-ml-py 13.x), returning the same types
(pynvml's own ctypes structs where it returns structs) with values written down from an 8 x H100
SXM5 node's `nvidia-smi -q` (not captured through NVML here: there is no GPU on this machine). Constants
and error classes are the real `pynvml` ones; a function the fake does not define raises
AttributeError, so the adapter cannot call anything this fake has not reproduced.

Knobs: `unsupported` (function names that answer NVML_ERROR_NOT_SUPPORTED), `lost` (GPU indices that
answer NVML_ERROR_GPU_IS_LOST), `counters` (per GPU error counters to move), `push_xid(gpu, xid)`.
"""

from __future__ import annotations

import queue
import types
from dataclasses import dataclass, field
from typing import Any

import pynvml

MIB = 1024 * 1024


@dataclass
class FakeGpu:
    index: int
    uuid: str
    serial: str
    bus_id: str
    name: str = "NVIDIA H100 80GB HBM3"
    total_mib: int = 81_559
    used_mib: int = 61_440
    util_gpu: int = 87
    util_mem: int = 41
    power_mw: int = 612_500
    limit_mw: int = 700_000
    temp_c: int = 64
    slowdown_c: int = 87
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    reasons: int = 0x0
    sbe: int = 0
    dbe: int = 0
    remap: tuple[int, int, int, int] = (0, 0, 0, 0)
    pending_pages: int = 0
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_replays: int = 0
    nvlinks: int = 18
    link_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (link, counter) -> count
    processes: list[tuple[int, int | None, str]] = field(default_factory=list)  # pid, used bytes, name
    mig_ids: dict[int, tuple[int, int]] = field(default_factory=dict)  # pid -> (GPU, compute instance id)
    sm_samples: list[tuple[int, int, int]] = field(default_factory=list)  # pid, timestamp (us), SM %


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml:
    def __init__(self, gpus: int = 8, *, driver: bool = True) -> None:
        self.driver = driver
        self.gpus = [
            FakeGpu(
                index=i,
                uuid=f"GPU-5d1e7a3c-0c2b-4f1e-9a7d-3b2c1d0e{i:04x}",
                serial=f"165322301{i:04d}",
                bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                processes=[(4242 + i, 61_000 * MIB, "python3")] if i < 4 else [],
            )
            for i in range(gpus)
        ]
        self.unsupported: set[str] = set()
        self.lost: set[int] = set()
        self.calls: list[str] = []
        self.events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.registered: list[tuple[int, int]] = []
        self.initialised = False

    # --- constants and error classes are pynvml's own -----------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML", "nvmlEventType", "nvmlFeature")):
            return getattr(pynvml, name)
        raise AttributeError(f"the fake does not reproduce pynvml.{name}")

    def _check(self, fn: str, h: _Handle | None = None) -> FakeGpu | None:
        self.calls.append(fn)
        if not self.initialised and fn != "nvmlInit":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if fn in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if h is None:
            return None
        if h.index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.gpus[h.index]

    def push_xid(self, gpu: int, xid: int) -> None:
        self.events.put(
            types.SimpleNamespace(
                device=_Handle(gpu), eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid,
                gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF,
            )
        )  # fmt: skip

    # --- system ---------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if not self.driver:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return "550.90.07"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion")
        return 12040

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._check("nvmlSystemGetProcessName")
        for g in self.gpus:
            for p, _, name in g.processes:
                if p == pid:
                    return name
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check("nvmlDeviceGetHandleByIndex")
        return _Handle(index)

    def nvmlDeviceGetIndex(self, h: _Handle) -> int:
        self._check("nvmlDeviceGetIndex")
        return h.index

    # --- identity -------------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        return self._g("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        return self._g("nvmlDeviceGetName", h).name

    def nvmlDeviceGetSerial(self, h: _Handle) -> str:
        return self._g("nvmlDeviceGetSerial", h).serial

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._g("nvmlDeviceGetPciInfo", h).bus_id.encode()
        return info

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        self._g("nvmlDeviceGetMigMode", h)
        return [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE]

    # --- state ----------------------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, h: _Handle) -> Any:
        g = self._g("nvmlDeviceGetMemoryInfo", h)
        mem = pynvml.c_nvmlMemory_t()
        mem.total, mem.used, mem.free = g.total_mib * MIB, g.used_mib * MIB, (g.total_mib - g.used_mib) * MIB
        return mem

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> Any:
        g = self._g("nvmlDeviceGetUtilizationRates", h)
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = g.util_gpu, g.util_mem
        return util

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return self._g("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:
        return self._g("nvmlDeviceGetEnforcedPowerLimit", h).limit_mw

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._g("nvmlDeviceGetTemperature", h).temp_c

    def nvmlDeviceGetTemperatureThreshold(self, h: _Handle, kind: int) -> int:
        assert kind == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return self._g("nvmlDeviceGetTemperatureThreshold", h).slowdown_c

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock: int) -> int:
        g = self._g("nvmlDeviceGetClockInfo", h)
        return {pynvml.NVML_CLOCK_SM: g.sm_mhz, pynvml.NVML_CLOCK_MEM: g.mem_mhz}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        return self._g("nvmlDeviceGetCurrentClocksEventReasons", h).reasons

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter_type: int) -> int:
        g = self._g("nvmlDeviceGetTotalEccErrors", h)
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        return g.sbe if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.dbe

    def nvmlDeviceGetRetiredPages(self, h: _Handle, cause: int) -> list[int]:
        self._g("nvmlDeviceGetRetiredPages", h)
        return []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: _Handle) -> int:
        return self._g("nvmlDeviceGetRetiredPagesPendingStatus", h).pending_pages

    def nvmlDeviceGetRemappedRows(self, h: _Handle) -> tuple[int, int, int, int]:
        return self._g("nvmlDeviceGetRemappedRows", h).remap

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: _Handle) -> int:
        return self._g("nvmlDeviceGetCurrPcieLinkGeneration", h).pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: _Handle) -> int:
        return self._g("nvmlDeviceGetCurrPcieLinkWidth", h).pcie_width

    def nvmlDeviceGetPcieReplayCounter(self, h: _Handle) -> int:
        return self._g("nvmlDeviceGetPcieReplayCounter", h).pcie_replays

    def nvmlDeviceGetNvLinkState(self, h: _Handle, link: int) -> int:
        g = self._g("nvmlDeviceGetNvLinkState", h)
        if link >= g.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, h: _Handle, link: int, counter: int) -> int:
        g = self._g("nvmlDeviceGetNvLinkErrorCounter", h)
        if link >= g.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g.link_errors.get((link, counter), 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[Any]:
        g = self._g("nvmlDeviceGetComputeRunningProcesses", h)
        none = (0xFFFFFFFF, 0xFFFFFFFF)  # NVML's ids for a process outside MIG instances
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": used,
                    "gpuInstanceId": g.mig_ids.get(pid, none)[0],
                    "computeInstanceId": g.mig_ids.get(pid, none)[1],
                }
            )
            for pid, used, _ in g.processes
        ]

    def nvmlDeviceGetProcessUtilization(self, h: _Handle, timeStamp: int) -> list[Any]:
        """pynvml's own structs, the samples newer than `timeStamp` (NVML_ERROR_NOT_FOUND when none)."""
        g = self._g("nvmlDeviceGetProcessUtilization", h)
        fresh = [(pid, ts, sm) for pid, ts, sm in g.sm_samples if ts > timeStamp]
        if not fresh:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        out = []
        for pid, ts, sm in fresh:
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp, sample.smUtil = pid, ts, sm
            out.append(sample)
        return out

    # --- events ---------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> object:
        self._check("nvmlEventSetCreate")
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, h: _Handle) -> int:
        self._g("nvmlDeviceGetSupportedEventTypes", h)
        return (
            pynvml.nvmlEventTypeSingleBitEccError
            | pynvml.nvmlEventTypeDoubleBitEccError
            | pynvml.nvmlEventTypeXidCriticalError
            | pynvml.nvmlEventTypePState
        )

    def nvmlDeviceRegisterEvents(self, h: _Handle, mask: int, event_set: object) -> None:
        self._g("nvmlDeviceRegisterEvents", h)
        self.registered.append((h.index, mask))

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> Any:
        self._check("nvmlEventSetWait")
        try:
            return self.events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._check("nvmlEventSetFree")

    def _g(self, fn: str, h: _Handle) -> FakeGpu:
        g = self._check(fn, h)
        assert g is not None
        return g
