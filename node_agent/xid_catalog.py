"""XID classification: what an XID means, what to do about it, and how severe it is.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, Ampere and later), read as the
table NVIDIA publishes in Xid-Catalog.xlsx (catalog as of 2025-10-29; our copy came through
leptonai/gpud `components/accelerator/nvidia/xid/catalog_generated.go`, which is generated from that
sheet). Mnemonics and the "immediate action" bucket are NVIDIA's; see /work/shared/reference/gpu-faults.md.

Severity is derived from NVIDIA's immediate action, by one rule (`severity_of_action`):
- the GPU must be reset, the machine restarted, NVIDIA contacted, or hardware inspected -> CRITICAL
  (the health service drains and isolates);
- the application must be restarted (the GPU stays in service) -> WARNING;
- no action ("IGNORE", informational) -> INFO.
"""

from __future__ import annotations

from dataclasses import dataclass

from events.faults import Severity

SOURCE = "NVIDIA Xid Catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, 2025-10-29)"
NAME = "NVIDIA Xid Catalog of 2025-10-29"  # in each fault's detail: short, for reasons read in a table

# NVIDIA's immediate-action buckets.
RESET_GPU = "RESET_GPU"
RESTART_BM = "RESTART_BM"
RESTART_VM = "RESTART_VM"
RESTART_APP = "RESTART_APP"
IGNORE = "IGNORE"
CONTACT_SUPPORT = "CONTACT_SUPPORT"
CHECK_MECHANICALS = "CHECK_MECHANICALS"
CHECK_UVM = "CHECK_UVM"
WORKFLOW_XID_45 = "WORKFLOW_XID_45"
WORKFLOW_XID_48 = "WORKFLOW_XID_48"
WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"
WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"
XID_154 = "XID_154"
NO_BUCKET = "NO_BUCKET"  # listed in the catalog without an action yet

_CRITICAL_ACTIONS = {
    RESET_GPU,
    RESTART_BM,
    RESTART_VM,
    CONTACT_SUPPORT,
    CHECK_MECHANICALS,
    WORKFLOW_XID_48,
    WORKFLOW_NVLINK_ERR,
}
_WARNING_ACTIONS = {RESTART_APP, CHECK_UVM, WORKFLOW_NVLINK5_ERR, NO_BUCKET}


def severity_of_action(action: str) -> Severity:
    if action in _CRITICAL_ACTIONS:
        return Severity.CRITICAL
    if action in _WARNING_ACTIONS:
        return Severity.WARNING
    return Severity.INFO


@dataclass(frozen=True)
class XidInfo:
    xid: int
    mnemonic: str
    meaning: str
    action: str  # NVIDIA's immediate action bucket
    severity: Severity
    known: bool = True


def _x(xid: int, mnemonic: str, meaning: str, action: str, severity: Severity | None = None) -> XidInfo:
    return XidInfo(xid, mnemonic, meaning, action, severity or severity_of_action(action))


_TABLE: dict[int, XidInfo] = {
    i.xid: i
    for i in (
        _x(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", RESTART_APP),
        _x(13, "ROBUST_CHANNEL_GR_EXCEPTION", "graphics engine exception (usually the application)", RESTART_APP),
        _x(31, "FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault (illegal address)", RESTART_APP),
        _x(32, "PBDMA_ERROR", "invalid or corrupted push buffer stream", RESTART_APP),
        _x(38, "FECS_ERR_WATCHDOG_TIMEOUT", "driver firmware error", IGNORE),
        _x(43, "RESETCHANNEL_VERIF_ERROR", "GPU stopped processing (application fault)", IGNORE),
        _x(
            45,
            "PREEMPTIVE_REMOVAL",
            "preemptive cleanup after earlier errors (act on the companion XID)",
            WORKFLOW_XID_45,
            Severity.INFO,
        ),
        _x(46, "GPU_TIMEOUT_ERROR", "GPU stopped processing", RESET_GPU),
        _x(48, "GPU_ECC_DBE", "double-bit ECC error", WORKFLOW_XID_48),
        _x(54, "PWR_REDUCED_CLOCKING", "auxiliary power not connected", CHECK_MECHANICALS),
        _x(60, "SEC2_ERROR", "video processor exception", RESTART_APP),
        _x(61, "PMU_BREAKPOINT", "internal micro-controller breakpoint/warning", CONTACT_SUPPORT),
        _x(62, "PMU_HALT_ERROR", "internal micro-controller halt", RESET_GPU),
        _x(
            63, "INFOROM_DRAM_RETIREMENT_EVENT", "page retirement or row remap recorded (reset GPU to activate)", IGNORE
        ),
        _x(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "page retirement or row remap failed", RESET_GPU),
        _x(68, "NVDEC0_ERROR", "video decoder exception", RESTART_APP),
        _x(69, "GR_CLASS_ERROR", "graphics engine class error", RESTART_APP),
        _x(74, "NVLINK_ERROR", "NVLink error", WORKFLOW_NVLINK_ERR),
        _x(79, "GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", RESTART_BM),
        _x(92, "EXCESSIVE_SBE_INTERRUPTS", "high single-bit ECC error rate", IGNORE),
        _x(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "InfoROM erase limit exceeded", IGNORE),
        _x(94, "CONTAINED_ERROR", "contained memory (ECC) error; GPU reset can be deferred", RESTART_APP),
        _x(95, "UNCONTAINED_ERROR", "uncontained memory error", RESET_GPU),
        _x(109, "CTXSW_TIMEOUT_ERROR", "context switch timeout", RESET_GPU),
        _x(110, "SEC_FAULT_ERROR", "security fault", RESET_GPU),
        _x(119, "GSP_RPC_TIMEOUT", "GSP RPC timeout", RESET_GPU),
        _x(120, "GSP_ERROR", "GSP error", RESET_GPU),
        _x(121, "C2C_ERROR", "corrected C2C (Grace-GPU) link errors", IGNORE),
        _x(136, "ALI_TRAINING_FAIL", "link training failed", RESET_GPU),
        _x(137, "NVLINK_PRIV_ERR", "NVLink FLA privilege error", IGNORE),
        _x(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "unrecovered ECC error", RESET_GPU),
        _x(143, "GPU_INIT_ERROR", "GPU initialization failure", RESET_GPU),
        # NVLink5 (144-149): the action depends on the sub-code, which the event does not carry; NVIDIA's
        # decode sheet maps BER events to IGNORE and link-down/fatal units to RESET_GPU, so WARNING
        # until decoded. 150 (MSE watchdog) always decodes to Fatal / RESET_GPU.
        _x(144, "NVLINK_SAW_ERROR", "NVLink5 SAW error (decode sub-code)", WORKFLOW_NVLINK5_ERR),
        _x(145, "NVLINK_RLW_ERROR", "NVLink5 RLW error (decode sub-code)", WORKFLOW_NVLINK5_ERR),
        _x(146, "NVLINK_TLW_ERROR", "NVLink5 TLW error (decode sub-code)", WORKFLOW_NVLINK5_ERR),
        _x(147, "NVLINK_TREX_ERROR", "NVLink5 TREX error (decode sub-code)", WORKFLOW_NVLINK5_ERR),
        _x(148, "NVLINK_NVLPW_CTRL_ERROR", "NVLink5 NVLPW control error (decode sub-code)", WORKFLOW_NVLINK5_ERR),
        _x(149, "NVLINK_NETIR_ERROR", "NVLink5 NETIR error (decode sub-code)", WORKFLOW_NVLINK5_ERR),
        _x(150, "NVLINK_MSE_ERROR", "NVLink5 MSE watchdog", WORKFLOW_NVLINK5_ERR, Severity.CRITICAL),
        _x(151, "KEY_ROTATION_ERROR", "confidential computing key rotation error", RESTART_VM),
        _x(154, "GPU_RECOVERY_ACTION_CHANGED", "recovery action changed (follow the companion XID)", XID_154),
        _x(155, "NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error", RESET_GPU),
        _x(156, "RESOURCE_RETIREMENT_EVENT", "resource retirement event", RESET_GPU),
        _x(157, "RESOURCE_RETIREMENT_FAILURE", "resource retirement failure", IGNORE),
        _x(158, "GPU_FATAL_TIMEOUT", "GPU fatal timeout", RESET_GPU),
        _x(159, "CHI_NON_DATA_ERROR", "CHI non-data error", CHECK_UVM),
        _x(160, "CHANNEL_RETIREMENT_EVENT", "channel retirement event", IGNORE),
        _x(161, "CHANNEL_RETIREMENT_FAILURE", "channel retirement failure", IGNORE),
        _x(162, "POWER_SMOOTHING_REENGAGED", "power smoothing circuitry re-engaged", NO_BUCKET),
        _x(163, "POWER_SMOOTHING_DISENGAGED", "power smoothing circuitry disengaged", NO_BUCKET),
        _x(164, "POWER_SMOOTHING_LOW_LIFETIME", "power smoothing circuitry low lifetime", NO_BUCKET),
        _x(165, "POWER_SMOOTHING_EXHAUSTED", "power smoothing circuitry exhausted", NO_BUCKET),
        _x(166, "NVLINK_CC_ERROR", "NVLink confidential computing error", NO_BUCKET),
        # 167/169/171/172 have no bucket yet; they are fatal-class errors (171/172 accompany Xid 48).
        _x(167, "PCIE_FATAL_TIMEOUT", "PCIe fatal timeout", NO_BUCKET, Severity.CRITICAL),
        _x(168, "REDUCED_GPU_MEMORY_CAPACITY", "reduced GPU memory capacity (WPR errors)", NO_BUCKET),
        _x(169, "SEC2_HALT_ERROR", "SEC2 halt error", NO_BUCKET, Severity.CRITICAL),
        _x(170, "NVLINK_CC_ERROR", "NVLink confidential computing error", NO_BUCKET),
        _x(
            171, "UNCORRECTABLE_DRAM_ERROR", "uncorrectable DRAM error (detail of Xid 48)", NO_BUCKET, Severity.CRITICAL
        ),
        _x(
            172, "UNCORRECTABLE_SRAM_ERROR", "uncorrectable SRAM error (detail of Xid 48)", NO_BUCKET, Severity.CRITICAL
        ),
    )
}

# "Unused" codes on Ampere+: the catalog says CONTACT_SUPPORT (seeing one means something is badly wrong).
_UNUSED = {
    *range(1, 8), 9, 10, 12, *range(15, 25), *range(26, 31), *range(33, 37), 42, 47, *range(49, 54),
    *range(55, 60), 65, 73, 81, 87, 90, 91, *range(111, 119), *range(122, 126), 138, 142,
}  # fmt: skip
# Copy engine, NVDEC and NVJPG exceptions: RESTART_APP.
_ENGINE_EXCEPTIONS = {
    39, 40, 41, 70, 71, 72, 75, 76, 77, *range(82, 87), 88, 89, *range(96, 106), *range(126, 136), 139,
}  # fmt: skip


def classify(xid: int) -> XidInfo:
    """The catalog entry for an XID; a code the catalog does not list is a WARNING marked unknown."""
    info = _TABLE.get(xid)
    if info is not None:
        return info
    if xid in _UNUSED:
        return _x(xid, "UNUSED", "code unused on this architecture: unexpected", CONTACT_SUPPORT)
    if xid in _ENGINE_EXCEPTIONS:
        return _x(xid, "ENGINE_EXCEPTION", "copy engine / video engine exception", RESTART_APP)
    return XidInfo(xid, "UNKNOWN", "not in the XID catalog this agent knows", NO_BUCKET, Severity.WARNING, False)
