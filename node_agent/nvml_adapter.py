"""Every NVML call of the agent, and nothing else: the `pynvml` module of NVIDIA's nvidia-ml-py.

A field the GPU does not support (NOT_SUPPORTED, NO_PERMISSION, a function missing from an older
driver, an absent NVLink) is None, never a crash. A GPU that answers GPU_IS_LOST is reported lost
(the detectors turn that into a critical fault) until it answers again. XID events are read in a
thread with nvmlEventSetCreate / nvmlDeviceRegisterEvents / nvmlEventSetWait.

The module is passed in (`NvmlSampler.open(nvml=...)`), so tests drive this adapter with a recorded
fake of pynvml's functions; the agent passes the real `pynvml`.
"""

from __future__ import annotations

import contextlib
import math
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from events.telemetry import GpuInfo, GpuSample, NodeSample, NvLinkCounters, PodMemory, ProcessInfo, RowRemapState
from node_agent.detectors import DEFAULT_SLOWDOWN_TEMP_C, GpuLimits, Reading, XidEvent, pcie_replay_limit
from node_agent.pods import PodRef, dmem_current, pod_of_pid
from services.runtime.logs import get_logger

log = get_logger("chamber.agent.nvml")
T = TypeVar("T")
MIB = 1024 * 1024

# nvmlClocksEventReason* bits (NVML API reference; identical to DCGM's clock-event reasons).
THROTTLE_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
# Marketed memory sizes (GB); NVML's total (MiB, less what the driver reserves) is matched to the nearest.
_MARKETED_GB = (8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 144, 180, 192, 288)


class NvmlUnavailable(RuntimeError):
    """No usable NVIDIA driver: the message says what is missing and what to do."""


class GpuLost(Exception):
    pass


_NO_INSTANCE = 0xFFFFFFFF  # NVML's "not in a MIG instance"


def _instance_id(value: Any) -> int | None:
    return None if value is None or int(value) == _NO_INSTANCE else int(value)


def normalized_model(name: str, memory_mib: float | None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100-80GB'; 'NVIDIA A100-SXM4-40GB' -> 'A100-40GB'."""
    bare = re.sub(r"^(NVIDIA|Tesla|GeForce|Quadro)\s+", "", name.strip(), flags=re.I)
    base = re.split(r"[\s-]", bare)[0].upper() or "GPU"
    size = re.search(r"(\d+)\s*GB", bare, flags=re.I)
    if size:
        gib = int(size.group(1))
    elif memory_mib:
        gib = min(_MARKETED_GB, key=lambda gb: abs(gb - memory_mib / 1024))
    else:
        return base
    return f"{base}-{gib}GB"


class NvmlSampler:
    """One node's GPUs through NVML (the `Sampler` of `node_agent.runner`)."""

    def __init__(
        self,
        nvml: Any,
        *,
        node: str = "localhost",
        xid_timeout_ms: int = 500,
        proc_root: Path | None = Path("/proc"),
        cgroup_root: Path | None = Path("/sys/fs/cgroup"),
    ) -> None:
        self.nvml = nvml
        self.node = node
        self.proc_root = proc_root  # where to read a GPU process's cgroup (None: do not attribute to pods)
        self.cgroup_root = cgroup_root  # the cgroup v2 mount, for pods' dmem.current (None: not read)
        self._pods: dict[str, PodRef] = {}  # pod uid -> its cgroup, as last read from a GPU process
        self._bus: dict[int, str] = {}  # GPU index -> its PCI address as dmem regions name it ("0000:18:00.0")
        self._util_seen: dict[int, int] = {}  # per GPU index: the newest process-utilisation timestamp read
        n = nvml
        self._soft_errors = {
            getattr(n, name)
            for name in (
                "NVML_ERROR_NOT_SUPPORTED",
                "NVML_ERROR_NO_PERMISSION",
                "NVML_ERROR_FUNCTION_NOT_FOUND",
                "NVML_ERROR_INVALID_ARGUMENT",
                "NVML_ERROR_NOT_FOUND",
                "NVML_ERROR_NO_DATA",
                "NVML_ERROR_UNKNOWN",
            )
            if hasattr(n, name)
        }
        self.driver_version: str | None = self._soft(n.nvmlSystemGetDriverVersion)
        cuda = self._soft(n.nvmlSystemGetCudaDriverVersion)
        self.cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        self.handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
        self.lost: set[int] = set()
        self._uuids: dict[int, str] = {}
        self._links: dict[int, list[int]] = {}
        self._limits: dict[int, GpuLimits] = {}
        self._xids: queue.SimpleQueue[XidEvent] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._xid_timeout_ms = xid_timeout_ms
        self._thread: threading.Thread | None = None
        self._inventory = self._read_inventory()

    @classmethod
    def open(
        cls,
        nvml: Any = None,
        *,
        node: str = "localhost",
        watch_xids: bool = True,
        proc_root: Path | None = Path("/proc"),
        cgroup_root: Path | None = Path("/sys/fs/cgroup"),
    ) -> NvmlSampler:
        """Initialise NVML; raises NvmlUnavailable with a clear message when there is no driver."""
        if nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise NvmlUnavailable(f"the pynvml module is missing ({exc}): pip install nvidia-ml-py") from None
            nvml = pynvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"no NVIDIA driver here: NVML could not start ({exc}). Install the NVIDIA driver on this "
                "node (or, in a container, use the NVIDIA container runtime); to run without GPUs use "
                "`chamber agent --simulate`."
            ) from None
        sampler = cls(nvml, node=node, proc_root=proc_root, cgroup_root=cgroup_root)
        if watch_xids:
            sampler.start_xid_watch()
        return sampler

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._soft(self.nvml.nvmlShutdown)

    # --- guarded calls --------------------------------------------------------------------------

    def _soft(self, fn: Callable[..., T], *args: Any) -> T | None:
        """Call NVML; a field this GPU/driver/user cannot read is None. GPU_IS_LOST raises GpuLost."""
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == self.nvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost() from None
            if code not in self._soft_errors:
                log.warning("nvml call failed", call=getattr(fn, "__name__", "?"), error=str(exc))
            return None

    # --- inventory ------------------------------------------------------------------------------

    def inventory_gpus(self) -> list[GpuInfo]:
        """Read afresh (the runner calls this every few seconds to announce changes)."""
        self._inventory = self._read_inventory()
        return self._inventory

    def limits(self) -> Mapping[int, GpuLimits]:
        return self._limits

    def _read_inventory(self) -> list[GpuInfo]:
        out = []
        for i, h in enumerate(self.handles):
            try:
                out.append(self._gpu_info(i, h))
            except GpuLost:
                # Announce what the GPU was (a lost GPU is a fault, not a different inventory).
                self.lost.add(i)
                known = next((g for g in getattr(self, "_inventory", []) if g.index == i), None)
                out.append(known or GpuInfo(index=i, uuid=self._uuids.get(i, f"unknown-{i}"), model="unknown"))
        return out

    def _gpu_info(self, i: int, h: Any) -> GpuInfo:
        n = self.nvml
        uuid = self._soft(n.nvmlDeviceGetUUID, h) or f"unknown-{i}"
        self._uuids[i] = uuid
        name = self._soft(n.nvmlDeviceGetName, h) or ""
        mem = self._soft(n.nvmlDeviceGetMemoryInfo, h)
        total_mib = mem.total / MIB if mem is not None else None
        pci = self._soft(n.nvmlDeviceGetPciInfo, h)
        if pci is not None:  # NVML says 00000000:18:00.0, the kernel's dmem regions 0000:18:00.0
            self._bus[i] = _text(pci.busId)[-12:].lower()
        mig = self._soft(n.nvmlDeviceGetMigMode, h)
        limit_mw = self._soft(n.nvmlDeviceGetEnforcedPowerLimit, h)
        self._links[i] = self._active_links(h)
        slowdown = self._soft(n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        gen = self._soft(n.nvmlDeviceGetCurrPcieLinkGeneration, h)
        width = self._soft(n.nvmlDeviceGetCurrPcieLinkWidth, h)
        self._limits[i] = GpuLimits(
            slowdown_temp_c=float(slowdown) if slowdown else DEFAULT_SLOWDOWN_TEMP_C,
            pcie_replays_per_window=pcie_replay_limit(gen, width),
        )
        return GpuInfo(
            index=i,
            uuid=uuid,
            model=normalized_model(name, total_mib),
            name=name,
            serial=self._soft(n.nvmlDeviceGetSerial, h),
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            memory_total_mib=total_mib,
            mig_mode=(mig[0] == n.NVML_DEVICE_MIG_ENABLE) if mig is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
            nvlink_links=len(self._links[i]) if self._links[i] else None,
        )

    def _active_links(self, h: Any) -> list[int]:
        n = self.nvml
        links = []
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            state = self._soft(n.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                break  # NOT_SUPPORTED / INVALID_ARGUMENT: no NVLink, or no more links
            if state == n.NVML_FEATURE_ENABLED:
                links.append(link)
        return links

    # --- samples --------------------------------------------------------------------------------

    def read(self, cluster: str, seq: int, now: float, interval_s: float) -> Reading:
        gpus = []
        for i, h in enumerate(self.handles):
            try:
                gpus.append(self._gpu_sample(i, h))
                self.lost.discard(i)
            except GpuLost:
                if i not in self.lost:
                    log.error("GPU lost", gpu=i, uuid=self._uuids.get(i))
                self.lost.add(i)
                gpus.append(GpuSample(index=i, uuid=self._uuids.get(i, f"unknown-{i}")))
        xids = []
        while True:
            try:
                xids.append(self._xids.get_nowait())
            except queue.Empty:
                break
        sample = NodeSample(cluster=cluster, node=self.node, seq=seq, observed_at=now, interval_s=interval_s, gpus=gpus)
        return Reading(sample, tuple(xids), frozenset(self.lost))

    def _gpu_sample(self, i: int, h: Any) -> GpuSample:
        n, soft = self.nvml, self._soft
        mem = soft(n.nvmlDeviceGetMemoryInfo, h)
        util = soft(n.nvmlDeviceGetUtilizationRates, h)
        power_mw = soft(n.nvmlDeviceGetPowerUsage, h)
        limit_mw = soft(n.nvmlDeviceGetEnforcedPowerLimit, h)
        reasons_fn = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        reasons = soft(reasons_fn, h)
        sbe = soft(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)
        dbe = soft(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
        retired_sbe = soft(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        retired_dbe = soft(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = soft(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        remap = soft(n.nvmlDeviceGetRemappedRows, h)
        return GpuSample(
            index=i,
            uuid=self._uuids.get(i) or soft(n.nvmlDeviceGetUUID, h) or f"unknown-{i}",
            utilization_pct=float(util.gpu) if util is not None else None,
            memory_utilization_pct=float(util.memory) if util is not None else None,
            memory_used_mib=mem.used / MIB if mem is not None else None,
            memory_total_mib=mem.total / MIB if mem is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
            temperature_c=_float(soft(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)),
            sm_clock_mhz=_float(soft(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)),
            mem_clock_mhz=_float(soft(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM)),
            throttle_reasons=[name for bit, name in THROTTLE_REASONS if reasons & bit] if reasons is not None else [],
            ecc_sbe_volatile=sbe,
            ecc_dbe_volatile=dbe,
            retired_pages_sbe=len(retired_sbe) if retired_sbe is not None else None,
            retired_pages_dbe=len(retired_dbe) if retired_dbe is not None else None,
            retired_pages_pending=(pending == n.NVML_FEATURE_ENABLED) if pending is not None else None,
            row_remap=RowRemapState(
                correctable=remap[0], uncorrectable=remap[1], pending=bool(remap[2]), failure=bool(remap[3])
            )
            if remap is not None
            else None,
            pcie_replay_count=soft(n.nvmlDeviceGetPcieReplayCounter, h),
            nvlink=[self._link_counters(h, link) for link in self._links.get(i, [])],
            processes=(procs := self._processes(i, h)),
            pod_memory=self._pod_memory(i, procs),
        )

    def _link_counters(self, h: Any, link: int) -> NvLinkCounters:
        n, soft = self.nvml, self._soft
        get = n.nvmlDeviceGetNvLinkErrorCounter
        return NvLinkCounters(
            link=link,
            crc_flit_errors=soft(get, h, link, n.NVML_NVLINK_ERROR_DL_CRC_FLIT),
            crc_data_errors=soft(get, h, link, n.NVML_NVLINK_ERROR_DL_CRC_DATA),
            replay_errors=soft(get, h, link, n.NVML_NVLINK_ERROR_DL_REPLAY),
            recovery_errors=soft(get, h, link, n.NVML_NVLINK_ERROR_DL_RECOVERY),
        )

    def _processes(self, i: int, h: Any) -> list[ProcessInfo]:
        """NVML's running compute processes (v3: pid, memory, MIG GPU and compute instance), each with
        its SM share since the last sample and the pod its cgroup names."""
        procs = self._soft(self.nvml.nvmlDeviceGetComputeRunningProcesses, h) or []
        sm = self._sm_shares(i, h) if procs else {}
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            pod = pod_of_pid(int(p.pid), self.proc_root) if self.proc_root is not None else None
            if pod is not None:
                self._pods[pod.uid] = pod
            out.append(
                ProcessInfo(
                    pid=int(p.pid),
                    name=self._soft(self.nvml.nvmlSystemGetProcessName, p.pid) or "",
                    used_memory_mib=used / MIB if used is not None else None,
                    gpu_instance_id=_instance_id(getattr(p, "gpuInstanceId", None)),
                    compute_instance_id=_instance_id(getattr(p, "computeInstanceId", None)),
                    sm_util_pct=sm.get(int(p.pid)),
                    pod_uid=pod.uid if pod else None,
                    container_id=pod.container_id if pod else None,
                )
            )
        return out

    def _pod_memory(self, i: int, procs: list[ProcessInfo]) -> list[PodMemory]:
        """Per pod with a process on GPU `i`: the device memory its cgroup holds on that GPU
        (`dmem.current`'s regions of this GPU's PCI address), where the kernel has the dmem controller."""
        bus = self._bus.get(i)
        if self.cgroup_root is None or bus is None:
            return []
        out = []
        for uid in sorted({p.pod_uid for p in procs if p.pod_uid}):
            regions = dmem_current(self._pods[uid], self.cgroup_root)
            if regions is None:
                continue  # no dmem controller (or the pod has gone)
            held = [b for region, b in regions.items() if _region_bus(region) == bus]
            if held:
                out.append(PodMemory(pod_uid=uid, dmem_mib=sum(held) / MIB))
        return out

    def _sm_shares(self, i: int, h: Any) -> dict[int, float]:
        """Per pid, the SM utilisation of its latest sample newer than the last read (NVML keeps a
        short buffer of per-process samples; asking from the last timestamp reads each once)."""
        samples = self._soft(self.nvml.nvmlDeviceGetProcessUtilization, h, self._util_seen.get(i, 0)) or []
        out: dict[int, tuple[int, float]] = {}
        for s in samples:
            stamp = int(s.timeStamp)
            if stamp >= out.get(int(s.pid), (-1, 0.0))[0]:
                out[int(s.pid)] = (stamp, float(s.smUtil))
        if out:
            self._util_seen[i] = max(stamp for stamp, _ in out.values())
        return {pid: util for pid, (_, util) in out.items()}

    # --- XID events -----------------------------------------------------------------------------

    def start_xid_watch(self) -> None:
        self._thread = threading.Thread(target=self._watch_xids, name="nvml-xid-events", daemon=True)
        self._thread.start()

    def _watch_xids(self) -> None:
        n = self.nvml
        try:
            events = n.nvmlEventSetCreate()
        except n.NVMLError as exc:
            log.warning("XID events unavailable", error=str(exc))
            return
        for i, h in enumerate(self.handles):
            try:
                supported = n.nvmlDeviceGetSupportedEventTypes(h)
                n.nvmlDeviceRegisterEvents(h, supported & n.nvmlEventTypeXidCriticalError, events)
            except n.NVMLError as exc:
                log.warning("XID events not supported on this GPU", gpu=i, error=str(exc))
        try:
            while not self._stop.is_set():
                try:
                    data = n.nvmlEventSetWait(events, self._xid_timeout_ms)
                except n.NVMLError as exc:
                    if getattr(exc, "value", None) != n.NVML_ERROR_TIMEOUT:
                        log.warning("XID event wait failed", error=str(exc))
                        self._stop.wait(1.0)
                    continue
                if not data.eventType & n.nvmlEventTypeXidCriticalError:
                    continue
                self._xids.put(XidEvent(self._soft_index(data.device), int(data.eventData), time.time()))
        finally:
            with contextlib.suppress(n.NVMLError):
                n.nvmlEventSetFree(events)

    def _soft_index(self, device: Any) -> int:
        try:
            return int(self.nvml.nvmlDeviceGetIndex(device))
        except self.nvml.NVMLError:
            return -1


def _float(v: float | int | None) -> float | None:
    return float(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else None


def _region_bus(region: str) -> str:
    """The PCI address in a dmem region's name ("drm/0000:18:00.0/vram0" -> "0000:18:00.0")."""
    parts = region.split("/")
    return parts[1].lower() if len(parts) > 2 else ""


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v
