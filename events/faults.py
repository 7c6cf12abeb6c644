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
