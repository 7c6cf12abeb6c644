"""Faults detected on a node by the agent's detectors (XID, ECC, row remap, thermal, links, NICs...)."""

from __future__ import annotations

from enum import StrEnum

from events.base import Event, Name, event_type


class FaultKind(StrEnum):
    XID = "xid"
    ECC_DBE = "ecc_dbe"
    ECC_SBE_STORM = "ecc_sbe_storm"
    RETIRED_PAGES = "retired_pages"
    ROW_REMAP_PENDING = "row_remap_pending"
    ROW_REMAP_FAILURE = "row_remap_failure"
    THERMAL = "thermal"
    POWER = "power"
    NVLINK = "nvlink"
    PCIE = "pcie"
    GPU_LOST = "gpu_lost"
    AGENT_SILENT = "agent_silent"
    # NIC faults (fabric detectors, node_agent/fabric_detectors.py); gpu_index names the GPU the NIC serves
    NIC_DOWN = "nic_down"
    NIC_FLAP = "nic_flap"
    NIC_DOWNSHIFT = "nic_downshift"
    NIC_ERRORS = "nic_errors"
    # A job-performance culprit (services/perf): a GPU or NIC that slows its gang's collectives
    STRAGGLER = "straggler"
    # AMD Instinct faults (node_agent/detectors.py, rules in services/health/default_policy.yaml)
    AMD_RAS_UE = "amd_ras_ue"  # an uncorrectable error in a RAS block (`ras_block` names it)
    AMD_BAD_PAGES = "amd_bad_pages"  # retired VRAM pages near or past the board's threshold
    AMD_CPER = "amd_cper"  # a CPER record from the driver (`afid` names its AMD Field ID, when decoded)
    GPU_RESET_STUCK = "gpu_reset_stuck"  # a GPU reset began and did not complete in time
    XGMI = "xgmi"  # an XGMI (Infinity Fabric) link down or erroring: a fabric fault
    # An NCCL process of a job that NCCL's RAS declared dead (services/perf: PEER_DEAD): its node goes
    # out of service and the scheduler requeues the job
    NCCL_PEER_DEAD = "nccl_peer_dead"
    OTHER = "other"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class GpuFaultDetected(Event, frozen=True, tag=event_type("faults", "gpu_fault_detected")):
    """A fault on one GPU (gpu_index set) or on the node as a whole (gpu_index None)."""

    fault_id: Name
    cluster: Name
    node: Name
    kind: FaultKind
    severity: Severity
    observed_at: float
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    xid: int | None = None
    detail: str = ""
    ras_block: str | None = None  # AMD RAS block of an `amd_ras_ue` fault (umc, gfx, ...)
    afid: int | None = None  # AMD Field ID of an `amd_cper` fault
