"""What node agents report: the node's inventory, and one sample of all its GPUs per interval.

A field that the GPU or driver does not support is None (not zero): "unknown" and "none happened"
are different facts to a health policy.
"""

from __future__ import annotations

import msgspec

from events.base import Event, Name, event_type


class ProcessInfo(msgspec.Struct, frozen=True, kw_only=True):
    pid: int
    name: str = ""
    used_memory_mib: float | None = None


class NvLinkCounters(msgspec.Struct, frozen=True, kw_only=True):
    """Cumulative NVLink error counters of one link (DCGM's NVLink health watch reads these)."""

    link: int
    crc_flit_errors: int | None = None
    crc_data_errors: int | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None


class RowRemapState(msgspec.Struct, frozen=True, kw_only=True):
    """HBM row remapping (A100 and later): remapped rows and whether a remap is pending or failed."""

    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU as the inventory sees it; `model` is the normalized product name (e.g. H100-80GB)."""

    index: int
    uuid: str
    model: str
    name: str = ""
    serial: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: float | None = None
    mig_mode: bool | None = None
    power_limit_w: float | None = None
    nvlink_links: int | None = None


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str
    utilization_pct: float | None = None
    memory_utilization_pct: float | None = None
    sm_activity_pct: float | None = None  # DCGM profiling metric; known only where DCGM runs
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle_reasons: list[str] = []
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    row_remap: RowRemapState | None = None
    pcie_replay_count: int | None = None
    nvlink: list[NvLinkCounters] = []
    processes: list[ProcessInfo] = []


class NodeInventory(Event, frozen=True, tag=event_type("telemetry", "node_inventory")):
    """Announced by an agent at start, on change, and periodically."""

    cluster: Name
    node: Name
    observed_at: float
    gpus: list[GpuInfo]
    driver_version: str | None = None
    cuda_version: str | None = None
    agent_version: str = ""
    simulated: bool = False
    labels: dict[str, str] = {}


class NodeSample(Event, frozen=True, tag=event_type("telemetry", "node_sample")):
    """One sample of every GPU on a node; `seq` increases by one per interval (gaps mean loss)."""

    cluster: Name
    node: Name
    seq: int
    observed_at: float
    interval_s: float
    gpus: list[GpuSample]
