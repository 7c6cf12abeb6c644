"""On-node fault detectors: pure functions over successive readings of one node.

`detect(state, reading, limits)` returns the next state and the faults found in this reading. It reads
no clock (times come from the reading) and does no I/O, so scripted sample sequences test it.

Each fault is published once per occurrence:
- events (an XID, a DBE count increase) are faults each time they happen;
- conditions (thermal slowdown, pending remap, error rate above a threshold, GPU lost) are faults when
  they start or get worse, and re-arm only after they have cleared.

Detectors and thresholds (sources in /work/shared/reference/gpu-faults.md):

- xid: each XID event, classified by `xid_catalog` (NVIDIA Xid Catalog); severity from the catalog's action.
- ecc_dbe: the volatile DBE count rises, or is > 0 when first seen (DCGM MEM watch: DBE > 0 = FAIL). critical.
- ecc_sbe_storm: >= 100 corrected (SBE) errors within a sliding 60 s window (our choice: DCGM's SBE limit
  is a placeholder). warning.
- retired_pages: the retired-pages-pending flag is set (DCGM MEM: WARN). warning.
- row_remap_pending: the row-remap pending flag is set (the remap applies at the next GPU reset). warning.
- row_remap_failure: the row-remap failure flag is set (DCGM MEM: FAIL). critical.
- thermal: temperature >= the GPU's NVML slowdown threshold (85 C when unknown, DCGM's fallback), or a
  HW slowdown / SW thermal / HW thermal throttle reason. warning.
- power: the HW power-brake slowdown throttle reason. warning.
- nvlink: NVLink counters (all links) rise within 60 s: any CRC or replay error -> warning; CRC >= 100/s
  (DCGM_LIMIT_MAX_NVLINK_CRC_ERROR) or any recovery error -> critical (DCGM NVLINK watch).
- pcie: PCIe replays within 60 s above ceil(per-lane rate x lanes) (DCGM PCIE watch; Gen4 x16 = 16,
  Gen5 x16 = 31, the default when the link is unknown). warning.
- gpu_lost: the GPU cannot be read (NVML_ERROR_GPU_IS_LOST). critical.

AMD Instinct GPUs (`GpuSample.amd` set; sources in docs/amd.md):
- amd_ras_ue: a RAS block's uncorrectable count (`ras/<block>_err_count` "ue:") rises, or is > 0 when
  first seen; `ras_block` names the block and the policy's `amd_ras` table decides. critical. (The
  generic ecc_dbe detector is not run on AMD GPUs: the UMC block is the DBE analogue and has its rule.)
- amd_bad_pages: retired VRAM pages >= the board's threshold (amdgpu flags the board for RMA there)
  -> critical; >= 90 % of it (where amdgpu warns) -> warning. Threshold unknown: one page per 100 MB
  of VRAM (amdgpu's RAS_BAD_PAGE_COVER formula).
- amd_cper: each CPER record the driver logged: fatal -> critical, non-fatal uncorrected -> warning,
  corrected -> info; `afid` carries its AMD Field ID for the policy's `amd_afid` table.
- gpu_reset_stuck: a GPU reset began (amdsmi's GPU_PRE_RESET, or RAS counters answering "Query currently
  inaccessible") and has not completed within 60 s. critical (the policy isolates the node).
- xgmi: an XGMI link reported down. critical.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from events.faults import FaultKind, GpuFaultDetected, Severity
from events.telemetry import GpuSample, NodeSample, NvLinkCounters
from node_agent.xid_catalog import NAME as XID_NAME
from node_agent.xid_catalog import classify

WINDOW_S = 60.0
RESET_TIMEOUT_S = 60.0  # a GPU reset still under way after this long is stuck (AMD: isolate the node)
RAS_BAD_PAGE_COVER_MIB = 100.0  # amdgpu_ras.c: "typical ECC bad page rate is 1 bad page per 100MB VRAM"
BAD_PAGE_WARN_SHARE = 0.9  # amdgpu_ras_eeprom.c warns at 90 % of the threshold
AMD_SCOPE = "amd:"  # condition keys of the AMD detectors (kept apart from the NVML-shaped ones)
_CPER_SEVERITY = {"fatal": Severity.CRITICAL, "non_fatal_uncorrected": Severity.WARNING}
SBE_STORM_PER_WINDOW = 100
NVLINK_CRC_CRITICAL_PER_S = 100.0  # DCGM_LIMIT_MAX_NVLINK_CRC_ERROR: "CRC errors only matter at 100+/s"
DEFAULT_SLOWDOWN_TEMP_C = 85.0  # DCGM's fallback when the device does not report its slowdown temperature
# DCGM PCIE watch: allowed replays per minute per lane, by PCIe generation (1e-12 BER x line rate x 60 s).
PCIE_REPLAYS_PER_LANE_MIN = {1: 0.15, 2: 0.30, 3: 0.48, 4: 0.96, 5: 1.92, 6: 3.84}

THERMAL_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown")
POWER_BRAKE_REASON = "hw_power_brake_slowdown"
_ALARM_REASONS = frozenset((*THERMAL_REASONS, POWER_BRAKE_REASON))

_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


def pcie_replay_limit(generation: int | None, width: int | None) -> int:
    """Replays per minute above which the link is unhealthy; Gen5 x16 when the link is unknown."""
    per_lane = PCIE_REPLAYS_PER_LANE_MIN.get(generation or 5, PCIE_REPLAYS_PER_LANE_MIN[5])
    return math.ceil(per_lane * (width or 16))


@dataclass(frozen=True)
class GpuLimits:
    slowdown_temp_c: float = DEFAULT_SLOWDOWN_TEMP_C
    pcie_replays_per_window: int = 31


@dataclass(frozen=True)
class XidEvent:
    gpu_index: int
    xid: int
    at: float


@dataclass(frozen=True)
class AmdEvent:
    """An AMD driver event since the last reading: a CPER record (`afid` decoded from it, `severity`
    the CPER header's: fatal | non_fatal_uncorrected | non_fatal_corrected), or a GPU reset's
    begin / end (amdsmi's GPU_PRE_RESET / GPU_POST_RESET notifications)."""

    gpu_index: int
    kind: str  # cper | reset_begin | reset_end
    at: float
    afid: int | None = None
    severity: str | None = None


@dataclass(frozen=True)
class Reading:
    """One interval as the sampler saw it: the sample, XID events since the last one, lost GPUs."""

    sample: NodeSample
    xids: tuple[XidEvent, ...] = ()
    lost_gpus: frozenset[int] = frozenset()
    amd_events: tuple[AmdEvent, ...] = ()


@dataclass(frozen=True)
class CounterWindow:
    """A cumulative counter's change points within the window (plus the last one before it).

    A counter that does not move keeps one point, so a quiet GPU costs nothing to track.
    """

    points: tuple[tuple[float, int], ...] = ()

    def observe(self, t: float, value: int | None, window_s: float) -> CounterWindow:
        if value is None:
            return self
        pts = self.points
        if not pts or value < pts[-1][1]:  # first sight, or the counter was reset (GPU reset, driver reload)
            return CounterWindow(((t, value),))
        if value != pts[-1][1]:
            pts = (*pts, (t, value))
        cutoff = t - window_s
        # keep the newest point at or before the cutoff: it is the counter's value when the window began
        drop = 0
        while drop + 1 < len(pts) and pts[drop + 1][0] <= cutoff:
            drop += 1
        return CounterWindow(pts[drop:]) if drop or pts is not self.points else self

    def increase(self) -> int:
        return self.points[-1][1] - self.points[0][1] if self.points else 0

    def span(self, now: float, window_s: float) -> float:
        return min(window_s, now - self.points[0][0]) if self.points else 0.0


@dataclass(frozen=True)
class GpuState:
    sbe: CounterWindow = CounterWindow()
    pcie: CounterWindow = CounterWindow()
    nvlink_crc: CounterWindow = CounterWindow()
    nvlink_replay: CounterWindow = CounterWindow()
    nvlink_recovery: CounterWindow = CounterWindow()
    dbe: int | None = None
    nvlink_seen: object = None  # the last sample's link list, and its totals (crc, replay, recovery)
    nvlink_totals: tuple[int | None, int | None, int | None] = (None, None, None)
    raised: Mapping[str, Severity] = field(default_factory=dict)  # conditions already published
    amd_seen: object = None  # the last AmdGpuHealth seen (the same object while nothing changed)
    amd_ue: Mapping[str, int] = field(default_factory=dict)  # uncorrectable count per RAS block
    reset_since: float | None = None  # when the GPU reset now under way began
    reset_open: bool = False  # a reset-begin notification without its end yet


@dataclass(frozen=True)
class DetectorState:
    gpus: Mapping[int, GpuState] = field(default_factory=dict)


_NEW_GPU = GpuState()  # frozen: one shared "nothing seen yet"
_NO_EVENTS: list[AmdEvent] = []  # a reading without AMD driver events (read only)
_DEFAULT_LIMITS = GpuLimits()


@dataclass(frozen=True)
class _Found:
    kind: FaultKind
    severity: Severity
    gpu: int | None
    detail: str
    xid: int | None = None
    at: float | None = None
    ras_block: str | None = None
    afid: int | None = None


def detect(
    state: DetectorState,
    reading: Reading,
    limits: Mapping[int, GpuLimits] | None = None,
    *,
    window_s: float = WINDOW_S,
) -> tuple[DetectorState, list[GpuFaultDetected]]:
    """Fold one reading into the state; return the new state and the faults that start now."""
    sample = reading.sample
    now = sample.observed_at
    found: list[_Found] = []
    for x in reading.xids:
        info = classify(x.xid)
        found.append(
            _Found(
                FaultKind.XID,
                info.severity,
                x.gpu_index,
                f"XID {x.xid} {info.mnemonic}: {info.meaning}; action {info.action} per the {XID_NAME}",
                xid=x.xid,
                at=x.at,
            )
        )
    gpus: dict[int, GpuState] = {}
    known, lost, amd_events = state.gpus, reading.lost_gpus, reading.amd_events
    changed = len(sample.gpus) != len(known)
    for g in sample.gpus:
        i = g.index
        prev = known.get(i) or _NEW_GPU
        lim = limits.get(i, _DEFAULT_LIMITS) if limits else _DEFAULT_LIMITS
        nxt = _detect_gpu(prev, g, i in lost, lim, now, window_s, found)
        amd = g.amd
        # `_detect_amd` for an AMD GPU (or one that was), except where its quiet path would return the
        # state as it is (the same health as last time, no driver events, no reset, nothing raised)
        if amd_events or (
            (amd is not None or nxt.amd_seen is not None)
            and (amd is not nxt.amd_seen or nxt.reset_since is not None or nxt.raised)
        ):
            events = [e for e in amd_events if e.gpu_index == i] if amd_events else _NO_EVENTS
            nxt = _detect_amd(nxt, g, events, now, found)
        gpus[i] = nxt
        changed = changed or nxt is not prev
    if not found:
        return (DetectorState(gpus) if changed else state), []
    return DetectorState(gpus), [_fault(sample, f, i) for i, f in enumerate(found)]


def _detect_gpu(
    prev: GpuState, g: GpuSample, lost: bool, lim: GpuLimits, now: float, window_s: float, found: list[_Found]
) -> GpuState:
    conditions: dict[str, tuple[FaultKind, Severity, str]] = {}
    if lost:
        conditions["gpu_lost"] = (FaultKind.GPU_LOST, Severity.CRITICAL, "GPU is lost (fallen off the bus)")
        # A lost GPU reads nothing: keep the counters as they were, so its return is compared with before.
        return _raise(replace(prev), conditions, g.index, found)

    if _quiet(prev, g, lim):
        return prev
    dbe = g.ecc_dbe_volatile
    if g.amd is None and dbe is not None and dbe > (prev.dbe if prev.dbe is not None else 0):
        before = prev.dbe if prev.dbe is not None else 0
        found.append(_Found(FaultKind.ECC_DBE, Severity.CRITICAL, g.index, f"volatile DBE count {before} -> {dbe}"))

    sbe = prev.sbe.observe(now, g.ecc_sbe_volatile, window_s)
    pcie = prev.pcie.observe(now, g.pcie_replay_count, window_s)
    # Samples are immutable: the same link list as last time has the same totals (the simulator
    # reuses a GPU's list until a counter moves, which keeps 1,000 nodes x 8 GPUs x 18 links cheap).
    if g.nvlink is prev.nvlink_seen:
        crc_total, replay_total, recovery_total = prev.nvlink_totals
    else:
        crc_total, replay_total, recovery_total = _nvlink_totals(g.nvlink)
    crc = prev.nvlink_crc.observe(now, crc_total, window_s)
    replay = prev.nvlink_replay.observe(now, replay_total, window_s)
    recovery = prev.nvlink_recovery.observe(now, recovery_total, window_s)

    if sbe.increase() >= SBE_STORM_PER_WINDOW:
        conditions["sbe"] = (
            FaultKind.ECC_SBE_STORM,
            Severity.WARNING,
            f"{sbe.increase()} corrected (SBE) ECC errors in {window_s:g} s (limit {SBE_STORM_PER_WINDOW})",
        )
    if g.retired_pages_pending:
        conditions["retired"] = (FaultKind.RETIRED_PAGES, Severity.WARNING, "retired pages pending (reset to apply)")
    if g.row_remap is not None:
        if g.row_remap.failure:
            conditions["remap_failure"] = (FaultKind.ROW_REMAP_FAILURE, Severity.CRITICAL, "row remapping failed")
        if g.row_remap.pending:
            conditions["remap_pending"] = (
                FaultKind.ROW_REMAP_PENDING,
                Severity.WARNING,
                f"row remap pending (uncorrectable remapped rows {g.row_remap.uncorrectable})",
            )
    thermal = [r for r in g.throttle_reasons if r in THERMAL_REASONS]
    power_brake = POWER_BRAKE_REASON in g.throttle_reasons
    if power_brake:
        conditions["power"] = (FaultKind.POWER, Severity.WARNING, "HW power brake slowdown")
        thermal = [r for r in thermal if r != "hw_slowdown"]  # the brake explains the HW slowdown
    hot = g.temperature_c is not None and g.temperature_c >= lim.slowdown_temp_c
    if hot or thermal:
        why = [f"{g.temperature_c:g} C >= slowdown {lim.slowdown_temp_c:g} C"] if hot else []
        conditions["thermal"] = (FaultKind.THERMAL, Severity.WARNING, "; ".join(why + thermal))
    nvlink = _nvlink_condition(crc, replay, recovery, now, window_s)
    if nvlink is not None:
        conditions["nvlink"] = nvlink
    if pcie.increase() > lim.pcie_replays_per_window:
        conditions["pcie"] = (
            FaultKind.PCIE,
            Severity.WARNING,
            f"{pcie.increase()} PCIe replays in {window_s:g} s (limit {lim.pcie_replays_per_window})",
        )
    if (
        sbe is prev.sbe
        and pcie is prev.pcie
        and crc is prev.nvlink_crc
        and replay is prev.nvlink_replay
        and recovery is prev.nvlink_recovery
        and g.nvlink is prev.nvlink_seen
        and (dbe is None or dbe == prev.dbe)
        and not conditions
        and not prev.raised
    ):
        return prev  # the common case: a healthy GPU whose counters did not move
    nxt = GpuState(
        nvlink_seen=g.nvlink,
        nvlink_totals=(crc_total, replay_total, recovery_total),
        sbe=sbe,
        pcie=pcie,
        nvlink_crc=crc,
        nvlink_replay=replay,
        nvlink_recovery=recovery,
        dbe=dbe if dbe is not None else prev.dbe,
        raised=prev.raised,
        amd_seen=prev.amd_seen,
        amd_ue=prev.amd_ue,
        reset_since=prev.reset_since,
        reset_open=prev.reset_open,
    )
    return _raise(nxt, conditions, g.index, found)


def _quiet(prev: GpuState, g: GpuSample, lim: GpuLimits) -> bool:
    """A healthy GPU whose counters did not move: nothing to detect and nothing to update (the fast
    path that keeps a 1,000-node simulated fleet cheap). Anything unusual takes the full path. (One
    test after another, without calls: it runs for every GPU of every sample.)"""
    if prev.raised or g.nvlink is not prev.nvlink_seen:
        return False
    dbe = g.ecc_dbe_volatile
    if (dbe is not None and dbe != prev.dbe) or g.retired_pages_pending:
        return False
    remap = g.row_remap
    if remap is not None and (remap.pending or remap.failure):
        return False
    temp = g.temperature_c
    if temp is not None and not temp < lim.slowdown_temp_c:
        return False
    reasons = g.throttle_reasons
    if reasons and not _ALARM_REASONS.isdisjoint(reasons):
        return False
    # each counter holds one point (nothing moved within the window) and still reads the same
    sbe = g.ecc_sbe_volatile
    if sbe is not None:
        pts = prev.sbe.points
        if len(pts) != 1 or pts[0][1] != sbe:
            return False
    replays = g.pcie_replay_count
    if replays is not None:
        pts = prev.pcie.points
        if len(pts) != 1 or pts[0][1] != replays:
            return False
    return not g.nvlink or (
        len(prev.nvlink_crc.points) <= 1
        and len(prev.nvlink_replay.points) <= 1
        and len(prev.nvlink_recovery.points) <= 1
    )


def _nvlink_condition(
    crc: CounterWindow, replay: CounterWindow, recovery: CounterWindow, now: float, window_s: float
) -> tuple[FaultKind, Severity, str] | None:
    crc_n, replay_n, recovery_n = crc.increase(), replay.increase(), recovery.increase()
    if not (crc_n or replay_n or recovery_n):
        return None
    crc_rate = crc_n / max(crc.span(now, window_s), 1.0)
    severity = Severity.CRITICAL if crc_rate >= NVLINK_CRC_CRITICAL_PER_S or recovery_n else Severity.WARNING
    detail = (
        f"NVLink errors in {window_s:g} s: CRC {crc_n} ({crc_rate:.0f}/s), replay {replay_n}, recovery {recovery_n}"
    )
    return FaultKind.NVLINK, severity, detail


def _detect_amd(st: GpuState, g: GpuSample, events: list[AmdEvent], now: float, found: list[_Found]) -> GpuState:
    """The AMD rules (module docstring) over one GPU's `amd` health and its driver events."""
    a = g.amd
    quiet = a is st.amd_seen and not events and st.reset_since is None
    if quiet and (not st.raised or not any(k.startswith(AMD_SCOPE) for k in st.raised)):
        return st
    conditions: dict[str, tuple[FaultKind, Severity, str]] = {}
    ue = dict(st.amd_ue)
    if a is not None:
        for b in a.ras:
            before = st.amd_ue.get(b.block)
            if b.ue > (before if before is not None else 0):
                found.append(
                    _Found(
                        FaultKind.AMD_RAS_UE,
                        Severity.CRITICAL,
                        g.index,
                        f"RAS {b.block}: uncorrectable errors {before or 0} -> {b.ue}",
                        ras_block=b.block,
                    )
                )
            ue[b.block] = b.ue  # a lower count (driver reload) is the new base
        threshold = a.bad_page_threshold
        if threshold is None and g.memory_total_mib:
            threshold = int(g.memory_total_mib // RAS_BAD_PAGE_COVER_MIB)
        if a.bad_pages is not None and threshold:
            if a.bad_pages >= threshold:
                conditions["amd:bad_pages"] = (
                    FaultKind.AMD_BAD_PAGES,
                    Severity.CRITICAL,
                    f"{a.bad_pages} retired VRAM pages >= the board's threshold {threshold} (RMA)",
                )
            elif a.bad_pages >= BAD_PAGE_WARN_SHARE * threshold:
                conditions["amd:bad_pages"] = (
                    FaultKind.AMD_BAD_PAGES,
                    Severity.WARNING,
                    f"{a.bad_pages} retired VRAM pages, 90 % of the threshold {threshold}",
                )
        if a.xgmi_down:
            links = f" of {a.xgmi_links}" if a.xgmi_links else ""
            conditions["amd:xgmi"] = (
                FaultKind.XGMI,
                Severity.CRITICAL,
                f"XGMI link(s) {', '.join(map(str, a.xgmi_down))}{links} down",
            )
    since, open_event = st.reset_since, st.reset_open
    for e in events:
        if e.kind == "reset_begin":
            open_event = True
            since = e.at if since is None else since
        elif e.kind == "reset_end":
            open_event, since = False, None
        elif e.kind == "cper":
            severity = _CPER_SEVERITY.get(e.severity or "", Severity.INFO)
            afid = f"AFID {e.afid}" if e.afid is not None else "no AFID decoded"
            detail = f"CPER {e.severity or '?'} record, {afid}"
            found.append(_Found(FaultKind.AMD_CPER, severity, g.index, detail, afid=e.afid, at=e.at))
    if a is not None and a.ras_inaccessible:
        since = now if since is None else since
    elif not open_event:
        since = None
    if since is not None and now - since >= RESET_TIMEOUT_S:
        conditions["amd:reset"] = (
            FaultKind.GPU_RESET_STUCK,
            Severity.CRITICAL,
            f"GPU reset begun {now - since:.0f} s ago has not completed (limit {RESET_TIMEOUT_S:g} s)",
        )
    nxt = replace(st, amd_seen=a, amd_ue=ue, reset_since=since, reset_open=open_event)
    return _raise(nxt, conditions, g.index, found, scope=AMD_SCOPE)


def _raise(
    st: GpuState,
    conditions: dict[str, tuple[FaultKind, Severity, str]],
    gpu: int,
    found: list[_Found],
    *,
    scope: str = "",
) -> GpuState:
    """Publish conditions that are new or got worse; forget the ones that cleared (they re-arm).
    Only the conditions of `scope` are weighed (the NVML-shaped ones, or the AMD ones)."""
    raised: dict[str, Severity] = {k: v for k, v in st.raised.items() if _scope(k) != scope}
    for key, (kind, severity, detail) in conditions.items():
        before = st.raised.get(key)
        if before is None or _RANK[severity] > _RANK[before]:
            found.append(_Found(kind, severity, gpu, detail))
            raised[key] = severity
        else:
            raised[key] = before
    if raised == st.raised:
        return st
    return replace(st, raised=raised)


def _scope(key: str) -> str:
    return AMD_SCOPE if key.startswith(AMD_SCOPE) else ""


def _nvlink_totals(links: list[NvLinkCounters]) -> tuple[int | None, int | None, int | None]:
    crc = replay = recovery = 0
    has_crc = has_replay = has_recovery = False
    for link in links:
        if link.crc_flit_errors is not None:
            crc += link.crc_flit_errors
            has_crc = True
        if link.crc_data_errors is not None:
            crc += link.crc_data_errors
            has_crc = True
        if link.replay_errors is not None:
            replay += link.replay_errors
            has_replay = True
        if link.recovery_errors is not None:
            recovery += link.recovery_errors
            has_recovery = True
    return (crc if has_crc else None, replay if has_replay else None, recovery if has_recovery else None)


def fault_id(cluster: str, node: str, seq: int, n: int) -> str:
    """Node + sequence: the n-th fault found in sample `seq` (also its message id)."""
    return f"{cluster}/{node}/{seq}/fault/{n}"


def _fault(sample: NodeSample, f: _Found, n: int) -> GpuFaultDetected:
    uuid = next((g.uuid for g in sample.gpus if g.index == f.gpu), None) if f.gpu is not None else None
    return GpuFaultDetected(
        fault_id=fault_id(sample.cluster, sample.node, sample.seq, n),
        cluster=sample.cluster,
        node=sample.node,
        kind=f.kind,
        severity=f.severity,
        observed_at=f.at if f.at is not None else sample.observed_at,
        gpu_index=f.gpu,
        gpu_uuid=uuid,
        xid=f.xid,
        detail=f.detail,
        ras_block=f.ras_block,
        afid=f.afid,
    )
