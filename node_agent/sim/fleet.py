"""Simulated nodes: GPUs whose utilization, memory, power and temperature follow the jobs placed on
them, plus faults injected at run time.

Deterministic: every node has its own RNG seeded from (seed, node name), and time is passed in, so
the same seed, calls and times give the same samples (the order of nodes does not matter). A node is
mutable state stepped by `read(seq, now)`; it does no I/O and reads no clock.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from events.telemetry import (
    AmdGpuHealth,
    GpuInfo,
    GpuSample,
    NodeSample,
    NvLinkCounters,
    ProcessInfo,
    RasBlockCount,
    RowRemapState,
)
from node_agent.detectors import AmdEvent, GpuLimits, Reading, XidEvent, pcie_replay_limit
from node_agent.sim.fabric import FabricFault, GpuLoad, SimFabric, SimNicReader, Topology
from node_agent.sim.models import GpuModel

IDLE_JOB_FRACTION = 0.15  # jobs that hold GPUs (and some memory) but compute nothing
AMBIENT_C = 30.0
THERMAL_TAU_S = 8.0  # how fast temperature follows power


class SimFaultKind(StrEnum):
    """What `chamber sim-fault` can inject (the CLI contract)."""

    XID = "xid"
    ECC_DBE = "ecc_dbe"
    SBE_STORM = "sbe_storm"
    ROW_REMAP_FAILURE = "row_remap_failure"
    ROW_REMAP_PENDING = "row_remap_pending"
    THERMAL = "thermal"
    POWER_BRAKE = "power_brake"
    NVLINK = "nvlink"
    PCIE_REPLAY = "pcie_replay"
    GPU_LOST = "gpu_lost"
    AGENT_SILENT = "agent_silent"
    NIC_DOWN = "nic_down"
    NIC_FLAP = "nic_flap"
    NIC_DEGRADED = "nic_degraded"
    NIC_ERRORS = "nic_errors"
    PFC_STORM = "pfc_storm"
    GPU_SLOW = "gpu_slow"
    # AMD Instinct nodes only (a simulated MI300X node, `chamber up --amd-nodes N`)
    AMD_UMC_UE = "amd_umc_ue"  # an HBM uncorrectable error (ras/umc_err_count ue: +1)
    AMD_GFX_UE = "amd_gfx_ue"  # an uncorrectable error in the GFX block
    AMD_BAD_PAGES = "amd_bad_pages"  # retired pages past the board's threshold
    AMD_CPER_FATAL = "amd_cper_fatal"  # a fatal CPER record (AFID from --xid N, when given)
    AMD_RESET_HANG = "amd_reset_hang"  # a GPU reset that begins and never completes
    XGMI_DOWN = "xgmi_down"  # an XGMI link goes down
    CLEAR = "clear"


NODE_LEVEL = {SimFaultKind.AGENT_SILENT, SimFaultKind.CLEAR}
AMD_ONLY = {
    SimFaultKind.AMD_UMC_UE, SimFaultKind.AMD_GFX_UE, SimFaultKind.AMD_BAD_PAGES, SimFaultKind.AMD_CPER_FATAL,
    SimFaultKind.AMD_RESET_HANG, SimFaultKind.XGMI_DOWN,
}  # fmt: skip
_NO_LINKS: list[NvLinkCounters] = []  # AMD: no NVLink; one shared list keeps the detectors' fast path
AMD_RAS_BLOCKS = ("umc", "gfx", "sdma", "mmhub", "pcie_bif", "hdp", "xgmi_wafl")

# Injected error rates (per second) while a fault is on: above the detectors' thresholds, so that a
# fault shows within a few seconds of `chamber sim-fault`.
SBE_STORM_PER_S = 50.0
NVLINK_CRC_PER_S = 250.0
NVLINK_REPLAY_PER_S = 5.0
PCIE_REPLAY_PER_S = 10.0

_THERMAL_REASONS = ["sw_thermal_slowdown", "hw_thermal_slowdown"]
_BRAKE_REASONS = ["hw_slowdown", "hw_power_brake_slowdown"]
_IDLE_REASONS = ["gpu_idle"]
_CAPPED_REASONS = ["sw_power_cap"]  # a straggler's clocks held down (gpu_slow)
_NO_REASONS: list[str] = []


class SimError(ValueError):
    """An injection that cannot apply; `field` names the part of the request to fix."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class JobProfile:
    """How a job uses each of its GPUs; derived from the job id, so replays and nodes agree."""

    idle: bool
    utilization_pct: float
    memory_fraction: float

    @classmethod
    def of(cls, seed: int, job_id: str) -> JobProfile:
        rng = random.Random(f"{seed}:job:{job_id}")
        if rng.random() < IDLE_JOB_FRACTION:
            return cls(idle=True, utilization_pct=rng.uniform(0.0, 2.0), memory_fraction=rng.uniform(0.05, 0.4))
        return cls(idle=False, utilization_pct=rng.uniform(70.0, 99.0), memory_fraction=rng.uniform(0.5, 0.95))


def _tenth(x: float) -> float:
    """x rounded to one decimal (cheaper than round(); values here are never negative)."""
    return int(x * 10.0 + 0.5) / 10.0


def _uuid(node: str, index: int) -> str:
    h = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class SimGpu:
    __slots__ = (
        "_amd",
        "_links",
        "_procs",
        "_remap",
        "_remap_key",
        "amd_bad_pages",
        "amd_events",
        "amd_resetting",
        "amd_ue",
        "crc",
        "crc_rate",
        "dbe",
        "frac",
        "index",
        "job",
        "lost",
        "pcie",
        "pcie_rate",
        "power_brake",
        "profile",
        "recovery",
        "remap_failure",
        "remap_pending",
        "remap_unc",
        "replay",
        "replay_rate",
        "sbe",
        "sbe_rate",
        "temp",
        "thermal",
        "uuid",
        "xgmi_down",
        "xids",
    )

    def __init__(self, node: str, index: int) -> None:
        self.index = index
        self.uuid = _uuid(node, index)
        self.job: str | None = None
        self.profile: JobProfile | None = None
        self.temp = AMBIENT_C + 5.0
        self.xids: list[XidEvent] = []
        self._procs: list[ProcessInfo] = []
        self._links: list[NvLinkCounters] | None = None
        self._remap: RowRemapState | None = None
        self._remap_key: tuple[int, bool, bool] | None = None
        self.frac = 0.0  # fractional error counts carried between steps
        self.sbe = self.dbe = self.pcie = self.crc = self.replay = self.recovery = self.remap_unc = 0
        self._amd: AmdGpuHealth | None = None
        self.amd_ue: dict[str, int] = {}
        self.amd_bad_pages = 0
        self.amd_events: list[AmdEvent] = []
        self.clear()

    def clear(self) -> None:
        """End injected faults. The GPU was reset: volatile ECC counts and remap flags start over;
        the link counters are cumulative and keep their values."""
        self.sbe_rate = self.crc_rate = self.replay_rate = self.pcie_rate = 0.0
        self.thermal = self.power_brake = self.lost = False
        self.remap_pending = self.remap_failure = False
        self.sbe = self.dbe = 0
        self.xids = []
        self._links = None
        self.amd_ue = {}  # the reset cleared amdgpu's counts (they count since the driver loaded)
        self.amd_resetting = False
        self.xgmi_down: list[int] = []
        self._amd = None


class SimNode:
    """One simulated node: its GPUs, their load, and the faults injected into it."""

    def __init__(self, seed: int, name: str, gpus: int, model: GpuModel) -> None:
        self.name = name
        self.seed = seed
        self.model = model
        self.rng = random.Random(f"{seed}:node:{name}")
        self.gpus = [SimGpu(name, i) for i in range(gpus)]
        self.silent = False
        self.fabric: SimFabric | None = None  # set by the fleet: the jobs' rhythm and the NICs
        self._last: float | None = None
        self._inventory: list[GpuInfo] | None = None
        m = model
        self._limits = {
            g.index: GpuLimits(
                slowdown_temp_c=m.slowdown_temp_c, pcie_replays_per_window=pcie_replay_limit(m.pcie_gen, 16)
            )
            for g in self.gpus
        }

    # --- what the agent reads -------------------------------------------------------------------

    def inventory_gpus(self) -> list[GpuInfo]:
        if self._inventory is None:
            self._inventory = self._make_inventory()
        return self._inventory

    def _make_inventory(self) -> list[GpuInfo]:
        m = self.model
        if m.vendor == "amd":
            return [
                GpuInfo(
                    index=g.index,
                    uuid=g.uuid,
                    model=m.model,
                    name=m.product_name,
                    serial=f"SIM{hashlib.sha256(g.uuid.encode()).hexdigest()[:10].upper()}",
                    pci_bus_id=f"0000:{0x0C + 0x10 * g.index:02x}:00.0",
                    memory_total_mib=m.memory_mib,
                    power_limit_w=m.tdp_w,
                    vendor="amd",
                    compute_partition="SPX",
                    memory_partition="NPS1",
                )
                for g in self.gpus
            ]
        return [
            GpuInfo(
                index=g.index,
                uuid=g.uuid,
                model=m.model,
                name=m.product_name,
                serial=f"SIM{hashlib.sha256(g.uuid.encode()).hexdigest()[:10].upper()}",
                pci_bus_id=f"00000000:{0x18 + 0x10 * g.index:02X}:00.0",
                memory_total_mib=m.memory_mib,
                mig_mode=False,
                power_limit_w=m.tdp_w,
                nvlink_links=m.nvlink_links,
            )
            for g in self.gpus
        ]

    def limits(self) -> Mapping[int, GpuLimits]:
        return self._limits

    def read(self, cluster: str, seq: int, now: float, interval_s: float) -> Reading:
        """Step the node to `now` and sample it."""
        dt = interval_s if self._last is None else max(0.0, now - self._last)
        self._last = now
        samples = []
        xids: list[XidEvent] = []
        lost: set[int] = set()
        events: list[AmdEvent] = []
        for g in self.gpus:
            if g.xids:
                xids.extend(g.xids)
                g.xids = []
            if g.amd_events:
                events.extend(g.amd_events)
                g.amd_events = []
            if g.lost:
                lost.add(g.index)
                samples.append(GpuSample(index=g.index, uuid=g.uuid))
                continue
            samples.append(self._sample(g, dt))
        sample = NodeSample(
            cluster=cluster, node=self.name, seq=seq, observed_at=now, interval_s=interval_s, gpus=samples
        )
        return Reading(sample, tuple(xids), frozenset(lost), tuple(events))

    def _sample(self, g: SimGpu, dt: float) -> GpuSample:
        m = self.model
        rnd = self.rng.random
        noise = (rnd() + rnd() - 1.0) * 4.0  # triangular, +-4 points
        p = g.profile
        load = self.fabric.load(self.name, g.index) if self.fabric is not None else None
        if p is None:
            util = 0.0
            mem = 0.0
        else:
            util = min(100.0, max(0.0, p.utilization_pct + (noise * 0.25 if p.idle else noise)))
            mem = float(int(p.memory_fraction * m.memory_mib))
            if load is not None:  # the iteration rhythm: a rank that waits for its peers is not busy
                util = min(100.0, max(0.0, (p.utilization_pct + noise * 0.25) * load.duty))
        reasons = _IDLE_REASONS if util < 1.0 else _NO_REASONS
        power = m.idle_w + (m.tdp_w - m.idle_w) * (0.1 + 0.85 * util / 100.0 if util >= 1.0 else 0.0)
        power += noise * 0.01 * m.tdp_w
        clock = m.max_sm_clock_mhz if util >= 1.0 else 345.0
        capped = self._clock_factor(g.index, load)
        if capped < 1.0:
            clock *= capped
            power *= capped
            reasons = _CAPPED_REASONS
        if g.power_brake:
            reasons = _BRAKE_REASONS
            power = min(power, 0.5 * m.tdp_w)
            clock = min(clock, 0.5 * m.max_sm_clock_mhz)
        target = AMBIENT_C + 60.0 * power / m.tdp_w
        if g.thermal:
            target = m.slowdown_temp_c + 5.0
            reasons = _THERMAL_REASONS
            clock = min(clock, 0.6 * m.max_sm_clock_mhz)
        g.temp += (target - g.temp) * min(1.0, dt / THERMAL_TAU_S) if not g.thermal else (target - g.temp)
        if g.sbe_rate or g.crc_rate or g.replay_rate or g.pcie_rate:
            self._count_errors(g, dt)
        if m.vendor == "amd":
            return GpuSample(
                index=g.index,
                uuid=g.uuid,
                utilization_pct=_tenth(util),
                memory_utilization_pct=_tenth(util * 0.45),
                sm_activity_pct=_tenth(util) if load is not None else None,
                memory_used_mib=mem,
                memory_total_mib=m.memory_mib,
                power_w=_tenth(max(power, 0.5 * m.idle_w)),
                power_limit_w=m.tdp_w,
                temperature_c=float(int(g.temp + 0.5)),
                sm_clock_mhz=clock,
                mem_clock_mhz=m.mem_clock_mhz,
                ecc_sbe_volatile=g.sbe,
                ecc_dbe_volatile=g.amd_ue.get("umc", 0),
                retired_pages_dbe=g.amd_bad_pages,
                retired_pages_pending=False,
                pcie_replay_count=g.pcie,
                processes=g._procs,
                amd=self._amd_health(g),
                nvlink=_NO_LINKS,
            )
        return GpuSample(
            index=g.index,
            uuid=g.uuid,
            utilization_pct=_tenth(util),
            memory_utilization_pct=_tenth(util * 0.45),
            sm_activity_pct=_tenth(util) if load is not None else None,
            memory_used_mib=mem,
            memory_total_mib=m.memory_mib,
            power_w=_tenth(max(power, 0.5 * m.idle_w)),
            power_limit_w=m.tdp_w,
            temperature_c=float(int(g.temp + 0.5)),
            sm_clock_mhz=clock,
            mem_clock_mhz=m.mem_clock_mhz,
            throttle_reasons=reasons,
            ecc_sbe_volatile=g.sbe,
            ecc_dbe_volatile=g.dbe,
            retired_pages_pending=False,
            row_remap=self._remap(g),
            pcie_replay_count=g.pcie,
            nvlink=self._links(g),
            processes=g._procs,
        )

    def _clock_factor(self, index: int, load: GpuLoad | None) -> float:
        if load is not None:
            return load.clock
        return self.fabric.slow_gpus.get((self.name, index), 1.0) if self.fabric is not None else 1.0

    def fabric_reader(self) -> SimNicReader:
        assert self.fabric is not None
        return SimNicReader(self.fabric, self.name)

    def _count_errors(self, g: SimGpu, dt: float) -> None:
        def take(rate: float) -> int:
            # Poisson-ish counts from a seeded RNG: the mean is rate * dt.
            mean = rate * dt
            return int(mean) + (1 if self.rng.random() < mean - int(mean) else 0)

        sbe = take(g.sbe_rate)
        if sbe:
            g.sbe += sbe
            g._amd = None
        g.pcie += take(g.pcie_rate)
        crc, replay = take(g.crc_rate), take(g.replay_rate)
        if crc or replay:
            g.crc += crc
            g.replay += replay
            g._links = None

    def _amd_health(self, g: SimGpu) -> AmdGpuHealth:
        if g._amd is None:  # one shared object until something changes (the detectors' fast path)
            ce = g.sbe
            g._amd = AmdGpuHealth(
                ras=[
                    RasBlockCount(
                        block=b, ue=g.amd_ue.get(b, 0), ce=ce if b == "umc" else 0, de=0 if b == "umc" else None
                    )
                    for b in AMD_RAS_BLOCKS
                ],
                bad_pages=g.amd_bad_pages,
                bad_pages_pending=0,
                bad_page_threshold=int(self.model.memory_mib // 100),
                xgmi_links=self.model.nvlink_links,
                xgmi_down=list(g.xgmi_down),
                ras_inaccessible=g.amd_resetting,
            )
        return g._amd

    def _remap(self, g: SimGpu) -> RowRemapState:
        key = (g.remap_unc, g.remap_pending, g.remap_failure)
        if g._remap is None or g._remap_key != key:  # one shared object until the state changes
            g._remap_key = key
            g._remap = RowRemapState(correctable=0, uncorrectable=key[0], pending=key[1], failure=key[2])
        return g._remap

    def _links(self, g: SimGpu) -> list[NvLinkCounters]:
        if g._links is None:  # rebuilt only when a counter moved: link 0 carries the injected errors
            n = self.model.nvlink_links
            g._links = [
                NvLinkCounters(
                    link=i,
                    crc_flit_errors=g.crc if i == 0 else 0,
                    crc_data_errors=0,
                    replay_errors=g.replay if i == 0 else 0,
                    recovery_errors=g.recovery if i == 0 else 0,
                )
                for i in range(n)
            ]
        return g._links

    # --- what the executor and the operator do to it --------------------------------------------

    def assign(self, allocation: Mapping[int, str]) -> None:
        """Which job holds each GPU now (GPUs not in `allocation` are free)."""
        for g in self.gpus:
            job = allocation.get(g.index)
            if job == g.job:
                continue
            g.job = job
            g.profile = JobProfile.of(self.seed, job) if job is not None else None
            if job is None or g.profile is None:
                g._procs = []
            else:
                pid = 10_000 + int(hashlib.sha256(f"{job}/{g.index}".encode()).hexdigest()[:4], 16)
                g._procs = [
                    ProcessInfo(
                        pid=pid, name="python", used_memory_mib=round(g.profile.memory_fraction * self.model.memory_mib)
                    )
                ]

    def inject(self, kind: SimFaultKind, gpu: int | None, xid: int | None, now: float) -> dict[str, object]:
        if kind is SimFaultKind.AGENT_SILENT:
            self.silent = True
            return {"node": self.name, "kind": kind.value}
        if kind is SimFaultKind.CLEAR:
            targets = self.gpus if gpu is None else [self._gpu(gpu)]
            for g in targets:
                g.clear()
            if gpu is None:
                self.silent = False
            return {"node": self.name, "kind": kind.value, "gpu": gpu}
        g = self._gpu(0 if gpu is None else gpu)
        amd = self.model.vendor == "amd"
        if kind in AMD_ONLY and not amd:
            raise SimError(f"{kind.value} is an AMD fault and {self.name} is a {self.model.model} node", "kind")
        if amd and kind in (SimFaultKind.ROW_REMAP_FAILURE, SimFaultKind.ROW_REMAP_PENDING, SimFaultKind.NVLINK):
            raise SimError(f"{self.name} is an AMD node: no {kind.value}; try amd_bad_pages or xgmi_down", "kind")
        g._amd = None
        match kind:
            case SimFaultKind.XID:
                if xid is None or xid < 1:
                    raise SimError("an xid fault needs the XID code: pass --xid N (N >= 1)", "xid")
                g.xids.append(XidEvent(g.index, xid, now))
            case SimFaultKind.ECC_DBE if amd:
                g.amd_ue["umc"] = g.amd_ue.get("umc", 0) + 1
            case SimFaultKind.ECC_DBE:
                g.dbe += 1
            case SimFaultKind.AMD_UMC_UE:
                g.amd_ue["umc"] = g.amd_ue.get("umc", 0) + 1
            case SimFaultKind.AMD_GFX_UE:
                g.amd_ue["gfx"] = g.amd_ue.get("gfx", 0) + 1
            case SimFaultKind.AMD_BAD_PAGES:
                g.amd_bad_pages = int(self.model.memory_mib // 100)
            case SimFaultKind.AMD_CPER_FATAL:
                g.amd_events.append(AmdEvent(g.index, "cper", now, afid=xid, severity="fatal"))
            case SimFaultKind.AMD_RESET_HANG:
                g.amd_resetting = True
                g.amd_events.append(AmdEvent(g.index, "reset_begin", now))
            case SimFaultKind.XGMI_DOWN:
                g.xgmi_down = [*g.xgmi_down, len(g.xgmi_down) % max(1, self.model.nvlink_links)]
            case SimFaultKind.SBE_STORM:
                g.sbe_rate = SBE_STORM_PER_S
            case SimFaultKind.ROW_REMAP_FAILURE:
                g.remap_failure = True
                g.remap_unc += 1
            case SimFaultKind.ROW_REMAP_PENDING:
                g.remap_pending = True
                g.remap_unc += 1
            case SimFaultKind.THERMAL:
                g.thermal = True
            case SimFaultKind.POWER_BRAKE:
                g.power_brake = True
            case SimFaultKind.NVLINK:
                if not self.model.nvlink_links:
                    raise SimError(f"{self.model.model} has no NVLink; pick another kind", "kind")
                g.crc_rate, g.replay_rate = NVLINK_CRC_PER_S, NVLINK_REPLAY_PER_S
            case SimFaultKind.PCIE_REPLAY:
                g.pcie_rate = PCIE_REPLAY_PER_S
            case SimFaultKind.GPU_LOST:
                g.lost = True
        return {"node": self.name, "kind": kind.value, "gpu": g.index, "xid": xid}

    def _gpu(self, index: int) -> SimGpu:
        if not 0 <= index < len(self.gpus):
            raise SimError(f"node {self.name} has GPUs 0..{len(self.gpus) - 1}; --gpu {index} is not one", "gpu")
        return self.gpus[index]


class SimFleet:
    """All simulated nodes of one agent process, named `<prefix>-<nnnn>`."""

    def __init__(
        self,
        *,
        seed: int,
        nodes: int,
        gpus_per_node: int,
        model: GpuModel,
        prefix: str = "sim",
        topology: Topology | None = None,
        amd_nodes: int = 0,
        amd_model: GpuModel | None = None,
    ) -> None:
        """`amd_nodes`: the last that many nodes are AMD nodes of `amd_model` (a mixed fleet)."""
        width = max(3, len(str(nodes - 1)))
        names = [f"{prefix}-{i:0{width}d}" for i in range(nodes)]
        first_amd = nodes - amd_nodes
        if amd_nodes and (amd_model is None or amd_model.vendor != "amd"):
            raise ValueError("amd_nodes needs an AMD amd_model")
        self.nodes = {
            name: SimNode(seed, name, gpus_per_node, amd_model if i >= first_amd and amd_model else model)
            for i, name in enumerate(names)
        }
        # One NIC per GPU (rail-optimised), topology labels by position; see node_agent/sim/fabric.py.
        self.fabric = SimFabric(seed, list(self.nodes), nics_per_node=gpus_per_node, topology=topology)
        for node in self.nodes.values():
            node.fabric = self.fabric

    def node(self, name: str) -> SimNode:
        node = self.nodes.get(name)
        if node is None:
            some = ", ".join(list(self.nodes)[:3])
            raise SimError(f"no simulated node {name!r} here (nodes are named like {some}, ...)", "node")
        return node

    def inject(
        self, node: str, kind: str, gpu: int | None, xid: int | None, now: float, nic: int | None = None
    ) -> dict[str, object]:
        try:
            fault = SimFaultKind(kind)
        except ValueError:
            raise SimError(
                f"unknown fault kind {kind!r}; one of: {', '.join(k.value for k in SimFaultKind)}", "kind"
            ) from None
        target = self.node(node)
        if nic is not None and not 0 <= nic < len(self.fabric.nics[node]):
            valid = len(self.fabric.nics[node]) - 1
            raise SimError(f"node {node} has NICs 0..{valid}; --nic {nic} is not one", "nic")
        if fault.value in {f.value for f in FabricFault}:
            if gpu is not None:
                target._gpu(gpu)  # refuses an index the node does not have
            return self.fabric.inject(node, FabricFault(fault.value), nic, gpu, now)
        result = target.inject(fault, gpu, xid, now)
        if fault is SimFaultKind.CLEAR:
            self.fabric.clear(node, gpu, nic)
            result["nic"] = nic
        return result

    def assign(self, allocations: Mapping[str, Mapping[int, str]]) -> None:
        """The executor's view: node -> GPU index -> job id, for every node of this fleet."""
        for name, node in self.nodes.items():
            node.assign(allocations.get(name, {}))
        active = {g.job: not g.profile.idle for n in self.nodes.values() for g in n.gpus if g.job and g.profile}
        self.fabric.assign(allocations, active)

    def step(self, now: float) -> None:
        """Advance the jobs' rhythm and the NICs to `now` (before the nodes are read)."""
        self.fabric.step(now)
