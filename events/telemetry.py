"""What node agents report: the node's inventory, and one sample of all its GPUs per interval.

A field that the GPU or driver does not support is None (not zero): "unknown" and "none happened"
are different facts to a health policy.

The wire form of a sample is compact (see "Telemetry on the wire" in the README): a field at its
default (None, [], False) is left out of the JSON rather than sent as null, NVLink links are listed
only when one of their counters is non-zero and only once a minute (`nvlink_omitted` in between;
`nvlink_total` always carries the current sums), and the slow fields (`SLOW_FIELDS`) are left out of a
sample that says `slow_omitted`: they are then as in the node's last sample that carried them. A
decoder fills left-out fields with their defaults, so a sample in the old, full form (every field,
nulls included) decodes to the same value.
"""

from __future__ import annotations

import msgspec

from events.base import Event, Name, event_type


class ProcessInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One process on a GPU (NVML's running compute processes, v3), with the pod it belongs to where
    the agent could tell (its cgroup) and its share of the GPU's SMs in the last interval."""

    pid: int
    name: str = ""
    used_memory_mib: float | None = None
    gpu_instance_id: int | None = None  # MIG: the GPU and compute instance it runs in
    compute_instance_id: int | None = None
    sm_util_pct: float | None = None
    pod_uid: str | None = None
    container_id: str | None = None


class PodMemory(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Device memory a pod's cgroup holds on one GPU, as the kernel's cgroup v2 `dmem` controller counts
    it (`dmem.current`, Linux 6.14+): what the pod holds, whichever process allocated it."""

    pod_uid: str
    dmem_mib: float


class NvLinkCounters(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Cumulative NVLink error counters of one link (DCGM's NVLink health watch reads these).

    On the wire a sample lists only the links with a non-zero counter; the others are all zero. A
    counter at 0 (the default) is left out of the JSON; null means the link does not report it."""

    link: int
    crc_flit_errors: int | None = 0
    crc_data_errors: int | None = 0
    replay_errors: int | None = 0
    recovery_errors: int | None = 0


class NvLinkTotals(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One GPU's NVLink error counters summed over its links (`nvlink_total`, sent with every sample).

    Here 0 is the default, so an error-free GPU sends `{}`; null means no link reports the counter.
    """

    crc_flit_errors: int | None = 0
    crc_data_errors: int | None = 0
    replay_errors: int | None = 0
    recovery_errors: int | None = 0


class RowRemapState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """HBM row remapping (A100 and later): remapped rows and whether a remap is pending or failed.

    0 and false are the defaults, left out of the JSON (a healthy GPU sends `{}`); null is unknown.
    The whole state is null (`row_remap`) where the GPU has no row remapping."""

    correctable: int | None = 0
    uncorrectable: int | None = 0
    pending: bool | None = False
    failure: bool | None = False


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
    # "nvidia" | "amd": an inventory from before vendors were recorded is NVML's, so NVIDIA is the default.
    vendor: str = "nvidia"
    # AMD Instinct (MI300-class) partition modes, e.g. "CPX" / "NPS4"; None where the GPU has none.
    compute_partition: str | None = None
    memory_partition: str | None = None


class RasBlockCount(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One amdgpu RAS block's cumulative error counts (`ras/<block>_err_count`: `ue:`, `ce:`, `de:` lines)."""

    block: str  # umc | gfx | sdma | mmhub | pcie_bif | hdp | xgmi_wafl | ...
    ue: int = 0  # uncorrectable
    ce: int = 0  # corrected
    de: int | None = None  # deferred (newer kernels; None where the file has no `de:` line)


class AmdGpuHealth(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What an AMD Instinct GPU says about its health beyond the NVML-shaped fields (`GpuSample.amd`).

    `ras_inaccessible`: the RAS counters answered "Query currently inaccessible", which amdgpu does while a
    GPU reset is under way; `reset_pending_since` is set by the adapter from the reset events it saw."""

    ras: list[RasBlockCount] = []
    bad_pages: int | None = None  # lines of ras/gpu_vram_bad_pages (retired R + pending P + failed F)
    bad_pages_pending: int | None = None
    bad_page_threshold: int | None = None  # the driver's RMA threshold; None when it cannot be known
    xgmi_links: int | None = None
    xgmi_down: list[int] = []  # XGMI links reported down
    ras_inaccessible: bool = False


class GpuSample(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
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
    # On the wire: only links with a non-zero counter (see `compact_links`); read locally: every link.
    nvlink: list[NvLinkCounters] = []
    processes: list[ProcessInfo] = []
    pod_memory: list[PodMemory] = []  # per pod on this GPU, where the kernel has the dmem controller
    nvlink_total: NvLinkTotals | None = None  # None: no NVLink counters known (no links, or old form)
    amd: AmdGpuHealth | None = None  # AMD GPUs only (RAS blocks, bad pages, XGMI); None on NVIDIA


# Inventory-like fields: they change seldom, so a sample may leave them out while they stay the same
# (`NodeSample.slow_omitted`). Everything that makes the health service call a GPU dirty is here, so
# a change that matters always travels in a sample that carries these fields.
SLOW_FIELDS = (
    "memory_total_mib",
    "power_limit_w",
    "mem_clock_mhz",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "retired_pages_pending",
    "row_remap",
    "pcie_replay_count",
    "amd",  # an AMD GPU's health (RAS counts, bad pages, XGMI): a change travels at once, like the others
)


class HostInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the machine's firmware (DMI/SMBIOS, /sys/class/dmi/id) says, read by the agent without root.

    `provider`: aws | gcp | azure | oci | on-prem ('' when nothing was readable), mapped from the vendor strings
    (`node_agent.dmi_adapter.identify`); `instance_type`: only where the firmware names it (EC2's
    product_name); `instance_id`: EC2 Nitro's board asset tag. The raw strings travel too, so a
    mapping that misses a vendor can be fixed without a new agent; '' where unreadable.
    """

    provider: str = ""
    instance_type: str = ""
    instance_id: str = ""
    sys_vendor: str = ""
    product_name: str = ""
    product_uuid: str = ""
    board_asset_tag: str = ""
    chassis_asset_tag: str = ""


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
    host: HostInfo | None = None  # the machine as its firmware names it (None: not read, e.g. simulated)
    cpu_milli: int | None = None  # the node's CPU capacity in milli-CPUs (None: unknown)
    memory_mib: int | None = None  # the node's host memory in MiB (None: unknown)


class NodeSample(Event, frozen=True, omit_defaults=True, tag=event_type("telemetry", "node_sample")):
    """One sample of every GPU on a node; `seq` increases by one per interval (gaps mean loss).

    `slow_omitted`: this sample leaves out the slow fields (`SLOW_FIELDS`) of every GPU because none
    changed since the node's last sample that carried them (one comes at least once a minute, and at
    once when any of them changes). False (the default, and every sample in the old form): each field
    is what the GPU reported, None when unknown.

    `nvlink_omitted`: the per-link counters (`gpus[].nvlink`) are left out; they are as in the node's
    last sample that carried them (at most a minute ago). `gpus[].nvlink_total` is always current.
    """

    cluster: Name
    node: Name
    seq: int
    observed_at: float
    interval_s: float
    gpus: list[GpuSample]
    slow_omitted: bool = False
    nvlink_omitted: bool = False


def nvlink_totals(links: list[NvLinkCounters]) -> NvLinkTotals | None:
    """Each counter summed over the links that report it (None when none does); None without links."""
    if not links:
        return None
    sums: list[int | None] = [None, None, None, None]
    for link in links:
        for i, value in enumerate(
            (link.crc_flit_errors, link.crc_data_errors, link.replay_errors, link.recovery_errors)
        ):
            if value is not None:
                prev = sums[i]
                sums[i] = value if prev is None else prev + value
    return NvLinkTotals(
        crc_flit_errors=sums[0], crc_data_errors=sums[1], replay_errors=sums[2], recovery_errors=sums[3]
    )


def _link_has_errors(link: NvLinkCounters) -> bool:
    return bool(link.crc_flit_errors or link.crc_data_errors or link.replay_errors or link.recovery_errors)


def compact_links(gpu: GpuSample) -> GpuSample:
    """The wire form of a GPU's NVLink counters: the totals, and only the links with an error counted.

    Also upcasts a GPU of the old form (every link, no totals): the result is what a new agent sends.
    """
    links = gpu.nvlink
    if not links:
        return gpu
    total = gpu.nvlink_total if gpu.nvlink_total is not None else nvlink_totals(links)
    kept = [link for link in links if _link_has_errors(link)]
    return msgspec.structs.replace(gpu, nvlink=kept, nvlink_total=total)
