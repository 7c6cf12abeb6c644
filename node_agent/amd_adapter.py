"""AMD Instinct GPUs with the NVML adapter's contract: the same `NodeSample` fields, from AMD's SMI
library (`amdsmi`, imported lazily) or, without it, from sysfs (`node_agent.amd_sysfs`), which is what
amdsmi itself reads.

Field by field (docs/amd.md has the full table):
- utilization_pct / memory_utilization_pct: amdsmi_get_gpu_activity gfx_activity / umc_activity;
  sysfs gpu_metrics average_gfx_activity / average_umc_activity, else gpu_busy_percent / mem_busy_percent.
- memory_used_mib / memory_total_mib: amdsmi_get_gpu_vram_usage (MB); sysfs mem_info_vram_used|total (bytes).
- power_w / power_limit_w: amdsmi_get_power_info current_socket_power (else average_socket_power) /
  power_limit (W); sysfs gpu_metrics socket power, else hwmon power1_average|power1_input; power1_cap (uW).
- temperature_c: the hotspot (junction) sensor: amdsmi_get_temp_metric(HOTSPOT, CURRENT); gpu_metrics
  temperature_hotspot, else hwmon temp (junction, else edge). MI300 has no edge sensor.
- sm_clock_mhz / mem_clock_mhz: amdsmi_get_clock_info(GFX / MEM) clk; gpu_metrics current_gfxclk /
  current_uclk, else the starred pp_dpm_sclk / pp_dpm_mclk level.
- ecc_sbe_volatile: corrected errors summed over the RAS blocks; ecc_dbe_volatile: the UMC (HBM)
  uncorrectable count, the DBE analogue. Both are amdgpu's counts since the driver loaded.
- retired_pages_dbe / retired_pages_pending: ras/gpu_vram_bad_pages (or amdsmi_get_gpu_bad_page_info)
  reserved pages / any page pending reservation. retired_pages_sbe: None (AMD does not split by cause).
- pcie_replay_count: gpu_metrics pcie_replay_count_acc, else the pcie_replay_count file.
- nvlink: [] (XGMI is reported in `amd.xgmi_*`); row_remap: None (AMD retires pages instead).
- `amd`: RAS blocks (ue/ce/de), bad pages and the RMA threshold, XGMI links down, RAS inaccessible.

CPER records (and their AMD Field IDs) and GPU reset notifications come only through amdsmi; sysfs has
no CPER (the driver's CPER ring is in debugfs, root only), and a reset shows there as RAS counters that
answer "Query currently inaccessible".
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec

from events.telemetry import AmdGpuHealth, GpuInfo, GpuSample, NodeSample, ProcessInfo, RasBlockCount
from node_agent import amd_sysfs as fs
from node_agent.amd_models import DEVICE_IDS, normalized_model, partition_layout
from node_agent.detectors import DEFAULT_SLOWDOWN_TEMP_C, AmdEvent, GpuLimits, Reading, pcie_replay_limit
from services.runtime.logs import get_logger

log = get_logger("chamber.agent.amd")
T = TypeVar("T")
MIB = 1024 * 1024
# amdgpu's bad_page_threshold module parameter (amdgpu_drv.c): -1 the driver's default (its threshold is
# then only in debugfs), -2 "threshold determined by a formula" (one bad page per 100 MB of VRAM,
# RAS_BAD_PAGE_COVER in amdgpu_ras.c), 0 retirement disabled, N > 0 that many pages.
BAD_PAGE_PARAM = "sys/module/amdgpu/parameters/bad_page_threshold"
RAS_BAD_PAGE_COVER = 100 * 1024 * 1024
AMDSMI_BLOCKS = ("UMC", "GFX", "SDMA", "MMHUB", "PCIE_BIF", "HDP", "XGMI_WAFL")
CPER_SEVERITY_MASK = 0b111  # amdsmi_cper_sev_t: NON_FATAL_UNCORRECTED 0, FATAL 1, NON_FATAL_CORRECTED 2
CPER_BUFFER = 256 * 1024
REREAD_INVENTORY = 6
# AMD GPUs have no NVLink: every sample shares this one empty list, so the detectors see "the same
# links as last time" by identity (their fast path) and the wire form leaves it out as before.
NO_LINKS: list[Any] = []
_PCIE_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}


class AmdUnavailable(RuntimeError):
    """No usable AMD GPU here: the message says what is missing and what to do."""


class GpuLost(Exception):
    pass


def import_amdsmi() -> Any:
    """The `amdsmi` module, or AmdUnavailable naming what is missing. The package imports
    libamd_smi.so at import time: a missing library shows as KeyError (ROCM_PATH lookup) or OSError
    (ctypes cannot load it), not ImportError."""
    try:
        import amdsmi  # type: ignore[import-not-found]
    except ImportError as exc:
        raise AmdUnavailable(f"the amdsmi Python module is missing ({exc}): pip install amdsmi (ROCm's)") from None
    except KeyError as exc:
        raise AmdUnavailable(
            f"amdsmi is installed but cannot find libamd_smi.so (KeyError {exc}): install ROCm's amd-smi-lib "
            "or set ROCM_PATH to the ROCm install"
        ) from None
    except OSError as exc:
        raise AmdUnavailable(f"amdsmi is installed but libamd_smi.so could not be loaded ({exc})") from None
    return amdsmi


def bad_page_threshold(root: Path, vram_total_bytes: int | None) -> int | None:
    """The RMA threshold the driver applies, where it can be known without debugfs (see BAD_PAGE_PARAM);
    None when the parameter is -1 / unreadable and the driver computed it from firmware data."""
    value = fs.read_int(str(root / BAD_PAGE_PARAM))
    if value is None or value == -1 or value == 0:
        return None
    if value == -2:
        return vram_total_bytes // RAS_BAD_PAGE_COVER if vram_total_bytes else None
    return value if value > 0 else None


class FdCache:
    """sysfs files kept open and re-read with pread at offset 0 (amdgpu regenerates the attribute on
    each read from 0): one syscall per file per sample, which keeps a node sample under 200 us."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def read(self, path: str) -> bytes | None:
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                return None
            self._fds[path] = fd
        try:
            return os.pread(fd, 65536, 0)
        except OSError:  # ENODEV (gone), EIO: drop it and open afresh next time
            self.forget(path)
            return None

    def text(self, path: str) -> str | None:
        raw = self.read(path)
        return None if raw is None else raw.decode("ascii", "replace").strip()

    def int(self, path: str) -> int | None:
        raw = self.text(path)
        try:
            return int(raw, 0) if raw else None
        except ValueError:
            return None

    def forget(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_under(self, prefix: str) -> None:
        for path in [p for p in self._fds if p.startswith(prefix)]:
            self.forget(path)

    def close(self) -> None:
        for path in list(self._fds):
            self.forget(path)


def _ras(blocks: list[tuple[str, fs.RasCount]]) -> tuple[list[RasBlockCount], int | None, int | None]:
    """(the blocks, corrected errors summed, the UMC uncorrectable count)."""
    out = [RasBlockCount(block=b, ue=c.ue, ce=c.ce, de=c.de) for b, c in blocks]
    ce = sum(c.ce for _, c in blocks) if blocks else None
    umc = next((c.ue for b, c in blocks if b == "umc"), None)
    return out, ce, umc


class _CardPaths:
    """One card's per-sample files, opened once: gpu_metrics, mem_info_vram_used, each RAS block's
    err_count, gpu_vram_bad_pages (-1: the file is not there). A sample is one pread of each."""

    def __init__(self, c: fs.AmdCard) -> None:
        self.vendor = c.path("vendor")
        self.replays = c.path("pcie_replay_count")
        self.ras = [(b, c.path(f"ras/{b}_err_count")) for b in c.ras_blocks]
        self.bad_pages = c.path("ras/gpu_vram_bad_pages")
        self.paths = [c.path("gpu_metrics"), c.path("mem_info_vram_used"), *(p for _, p in self.ras)]
        if self.ras:
            self.paths.append(self.bad_pages)
        self.nras = len(self.ras)
        self.fds = [_open(p) for p in self.paths]
        self.all_open = min(self.fds) >= 0
        # gpu_metrics read whole; the counters are short text (SHORT_READ), and so is the bad-page list
        # of most boards (none); a longer list is read on (`read_rest`) and in one go from then on.
        self.sizes = [65536, SHORT_READ, *(SHORT_READ for _ in self.ras), *((SHORT_READ,) if self.ras else ())]
        self.bad_pages_full = SHORT_READ - BAD_PAGE_LINE  # a bad-page read longer than this may have more
        self.zeros = (0,) * len(self.fds)
        self.vendor_fd = _open(self.vendor)
        self.last_metrics: bytes | None = None  # gpu_metrics as last read
        # The card's sample with what moves seldom (identity, static figures, RAS, bad pages, replays)
        # filled in, built again only when one of those changes: a sample is then one
        # `msgspec.structs.replace` of the seven figures that move (a GpuSample built from keywords
        # costs five times that: every field matched by name, a fresh list per list default).
        self.template: GpuSample | None = None
        self.template_memo: _Memo | None = None
        self.template_key: tuple[Any, ...] = ()
        # the decoder of the table header this card sent last (a card does not change revision)
        self.metrics_head = b""
        self.metrics_min = 0
        self.decoder: fs.MetricsDecoder | None = None

    def gone(self) -> bool:
        """The device's files were removed (fstat of an open file: no links left)."""
        try:
            return self.vendor_fd < 0 or os.fstat(self.vendor_fd).st_nlink == 0
        except OSError:
            return True

    def read_each(self) -> list[bytes | None]:
        """Each file on its own (a file is not open, or the one-map read of them all failed): None for
        one that is not there or failed (reopened next time)."""
        pread = os.pread
        try:
            return [pread(fd, size, 0) if fd >= 0 else None for fd, size in zip(self.fds, self.sizes, strict=True)]
        except OSError:
            pass
        out: list[bytes | None] = []
        for n, fd in enumerate(self.fds):
            if fd < 0:
                out.append(None)
                continue
            try:
                out.append(pread(fd, self.sizes[n], 0))
            except OSError:  # EIO / ENODEV: reopen next time
                self._reopen(n)
                out.append(None)
        return out

    def read_rest(self, n: int, first: bytes) -> bytes:
        """The rest of a file longer than one read: gpu_vram_bad_pages is a binary attribute, which
        kernfs answers at most a page per read (kernfs_file_read_iter), whole 28-byte lines each time."""
        self.sizes[n] = 65536
        self.bad_pages_full = MIN_PAGE - BAD_PAGE_LINE
        chunks, at = [first], len(first)
        with contextlib.suppress(OSError):
            while chunk := os.pread(self.fds[n], 65536, at):
                chunks.append(chunk)
                at += len(chunk)
        return b"".join(chunks)

    def _reopen(self, n: int) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fds[n])
        self.fds[n] = _open(self.paths[n])
        self.all_open = min(self.fds) >= 0

    def close(self) -> None:
        for fd in [*self.fds, self.vendor_fd]:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fds = [-1] * len(self.fds)
        self.all_open = False
        self.vendor_fd = -1


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return -1


# A binary sysfs attribute answers at most a page per read; gpu_vram_bad_pages lines are 28 bytes
# ("0x%08x : 0x%08x : %1s\n", amdgpu_ras_sysfs_badpages_read), and a read returns whole lines only.
MIN_PAGE = 4096
BAD_PAGE_LINE = 28
# mem_info_vram_used ("%llu\n") and ras/<block>_err_count (two or three "xx: %lu\n" lines, or "Query
# currently inaccessible\n") are at most 75 bytes. A read that small is a pymalloc allocation, where a
# 64 KiB one is a malloc and a realloc: 8 of a card's 10 reads per sample.
SHORT_READ = 448
NA16 = 0xFFFF  # a gpu_metrics field the board does not fill
NA64 = 0xFFFFFFFFFFFFFFFF
_moving = msgspec.structs.replace  # a card's sample from its template (`_CardPaths.template`)
_pread = os.pread


class _Static(NamedTuple):
    """What a sample takes from the last inventory pass."""

    total_mib: float | None
    limit_w: float | None
    threshold: int | None  # bad pages before the driver asks for an RMA


_NO_STATIC = _Static(None, None, None)


class _Memo(NamedTuple):
    """A card's RAS and bad-page files and XGMI words as last read, and the health built from them."""

    ras_raw: list[bytes | None]
    bad_raw: bytes | None
    xgmi: tuple[int, ...] | None  # the raw link status words (0xFFFF: no such link)
    threshold: int | None
    health: AmdGpuHealth
    ce: int | None  # corrected errors summed over the blocks
    umc_ue: int | None
    reserved: int | None  # retired pages
    pending: bool | None  # any page pending retirement


@dataclass(frozen=True)
class _Identity:
    total: int | None  # VRAM bytes
    name: str
    unique: str | None
    serial: str | None
    slowdown_c: float
    threshold: int | None  # bad pages before the driver asks for an RMA


class SysfsSource:
    """Physical AMD GPUs read from sysfs under `root`."""

    name = "sysfs"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cards = fs.find_cards(root)
        self.fds = FdCache()
        self.driver_version = fs.read_text(str(root / "sys/module/amdgpu/version")) or None
        self._static: dict[int, _Static] = {}
        self._partitions: dict[int, int] = {}
        self._paths: dict[int, _CardPaths] = {}
        self._kfd: list[fs.KfdNode] | None = None  # read again when a card's partition mode changes
        self._identities: dict[int, _Identity] = {}
        self._modes: dict[int, tuple[str | None, str | None]] = {}  # the partition modes last seen
        self._memo: dict[int, _Memo] = {}
        self._rescan = -1  # the card whose RAS blocks the last inventory pass asked again

    def count(self) -> int:
        return len(self.cards)

    def refresh(self) -> None:
        """A new inventory pass (a minute apart): one card's RAS blocks asked again, in turn (a block
        whose file appeared, or whose bit in `ras/features` moved, is read from its next sample on; on
        an 8-GPU node within 8 passes; a listdir of every card each pass would cost more than the rest
        of the pass). The KFD topology is read again only when a card's partition mode changed (`info`)."""
        if self.cards:
            self._rescan = i = (self._rescan + 1) % len(self.cards)
            c = self.cards[i]
            blocks = fs.ras_blocks(c.device)
            if blocks != c.ras_blocks:
                log.info("RAS blocks changed", gpu=i, blocks=blocks, before=c.ras_blocks)
                c.ras_blocks = blocks
                paths = self._paths.pop(i, None)  # its files opened afresh at the next sample
                if paths is not None:
                    paths.close()
                self._memo.pop(i, None)  # the same bytes from other blocks are other blocks' counts

    def partitions(self, i: int) -> int:
        """How many logical GPUs card i shows: its KFD compute nodes (one per compute partition),
        else the partition table for the mode it reports."""
        return self._partitions.get(i, 1)

    def _identity(self, i: int) -> _Identity:
        """What does not change while the driver is loaded, read once per card (again after a loss)."""
        known = self._identities.get(i)
        if known is not None:
            return known
        c = self.cards[i]
        total = fs.read_int(c.path("mem_info_vram_total"))
        name = fs.read_text(c.path("product_name")) or DEVICE_IDS.get(c.device_id or -1, "AMD GPU")
        if "MI" not in name.upper() and c.device_id in DEVICE_IDS:
            name = DEVICE_IDS[c.device_id or -1]
        crit = fs.read_int(c.temp_crit_file) if c.temp_crit_file else None
        ident = self._identities[i] = _Identity(
            total=total,
            name=name,
            unique=fs.read_text(c.path("unique_id")),
            serial=fs.read_text(c.path("serial_number")) or None,
            slowdown_c=crit / 1000.0 if crit else DEFAULT_SLOWDOWN_TEMP_C,
            threshold=bad_page_threshold(self.root, total),
        )
        return ident

    def info(self, i: int) -> tuple[GpuInfo, GpuLimits]:
        """Identity (cached), and what may change between passes: the power cap, the PCIe link (it
        may train down), the partition modes; a few preads of files kept open."""
        c, fds = self.cards[i], self.fds
        if fs.read_bytes(c.path("vendor")) is None:  # opened afresh: a removed device's files are gone
            self._identities.pop(i, None)
            self._modes.pop(i, None)
            fds.close_under(c.path(""))  # a device that comes back has new files
            raise GpuLost()
        ident = self._identity(i)
        total_mib = ident.total / MIB if ident.total else None
        cap_uw = fds.int(f"{c.hwmon}/power1_cap") if c.hwmon else None
        speed = (fds.text(c.path("current_link_speed")) or "").split(" ")[0]
        width = fds.int(c.path("current_link_width"))
        self._static[i] = _Static(total_mib, cap_uw / 1e6 if cap_uw else None, ident.threshold)
        compute = fds.text(c.path("current_compute_partition")) or None
        memory = fds.text(c.path("current_memory_partition")) or None
        if self._modes.get(i) != (compute, memory):
            self._modes[i] = (compute, memory)
            self._partitions[i] = self._count_partitions(i, compute, memory)
        gpu = GpuInfo(
            index=i,
            uuid=f"GPU-{ident.unique}" if ident.unique else f"amd-{c.pci_bus_id or c.card}",
            model=normalized_model(ident.name, total_mib),
            name=ident.name,
            serial=ident.serial,
            pci_bus_id=c.pci_bus_id or None,
            memory_total_mib=total_mib,
            power_limit_w=self._static[i].limit_w,
            nvlink_links=None,
            vendor="amd",
            compute_partition=compute,
            memory_partition=memory,
        )
        limits = GpuLimits(
            slowdown_temp_c=ident.slowdown_c, pcie_replays_per_window=pcie_replay_limit(_PCIE_GEN.get(speed), width)
        )
        return gpu, limits

    def _count_partitions(self, i: int, compute: str | None, memory: str | None) -> int:
        """The card's KFD compute nodes (the topology read afresh: the mode changed), else the mode's table."""
        self._kfd = fs.read_kfd_nodes(self.root)
        loc = fs.location_id(self.cards[i].pci_bus_id)
        kfd = [n for n in self._kfd if n.is_gpu and n.properties.get("location_id") == loc]
        try:
            by_mode = partition_layout(compute, memory).gpus_per_device
        except ValueError:
            by_mode = 1
        if kfd and len(kfd) != by_mode:
            log.warning("KFD nodes and partition mode disagree", gpu=i, kfd_nodes=len(kfd), mode=compute)
        return len(kfd) or by_mode

    def sample(self, i: int, uuid: str, index: int | None = None) -> tuple[GpuSample, AmdGpuHealth]:
        paths = self._paths.get(i)
        if paths is None:
            paths = self._paths[i] = _CardPaths(self.cards[i])
        raws: list[bytes | None]
        if paths.all_open:  # the common case: one pread of each file, in one map (no Python frame per file)
            try:
                raws = list(map(_pread, paths.fds, paths.sizes, paths.zeros))
            except OSError:
                raws = paths.read_each()
        else:
            raws = paths.read_each()
        raw = raws[0]
        # A GPU that fell off the bus loses its sysfs directory: its open files answer ENODEV (None
        # here), and a recorded tree whose files were deleted shows them unlinked. A live GPU's
        # gpu_metrics changes every read (it carries a timestamp): only a table that did not move
        # needs the fstat.
        moved = raw is not None and raw != paths.last_metrics
        paths.last_metrics = raw
        if (raw is None and raws[1] is None) or (not moved and paths.gone()):
            paths.close()
            del self._paths[i]  # opened afresh next time: a GPU that comes back is read again
            raise GpuLost()
        total_mib, limit_w, threshold = self._static.get(i, _NO_STATIC)
        dec: fs.MetricsDecoder | None = None
        xgmi: tuple[int, ...] | None = None
        if raw:
            if raw[:4] == paths.metrics_head and len(raw) >= paths.metrics_min:
                dec = paths.decoder  # the table this card sent last time: a known revision
            else:
                dec = fs.metrics_decoder(raw)
                paths.metrics_head = raw[:4] if dec else b""
                paths.metrics_min, paths.decoder = (dec.min_len, dec) if dec else (0, None)
        if dec is not None:
            v = dec.unpack(raw)  # type: ignore[arg-type]
            hot, power, gfx, umc, gfxclk, uclk, replay = dec.pick(v)
            if dec.xgmi is not None:
                xgmi = v[dec.xgmi]
        util: float | None
        watts: float | None
        temp: float | None
        sclk: float | None
        mclk: float | None
        replays: int | None
        if (
            dec is not None
            and dec.has_replay
            and gfx != NA16
            and power != NA16
            and hot != NA16
            and gfxclk != NA16
            and uclk != NA16
            and replay != NA64
        ):  # the table has everything (MI300): no other file to read
            util, mem_util, watts, temp = float(gfx), (None if umc == NA16 else float(umc)), float(power), float(hot)
            sclk, mclk, replays = float(gfxclk), float(uclk), replay
        else:
            util, mem_util, watts, temp, sclk, mclk, replays = self._from_files(self.cards[i], paths, raw)
        used_raw = raws[1]
        try:
            used_mib = int(used_raw) / MIB if used_raw else None
        except ValueError:
            used_mib = None
        # RAS counts and bad pages change rarely: parse them only when the files' bytes change.
        nras = paths.nras
        ras_raw = raws[2 : 2 + nras]
        bad_raw = raws[2 + nras] if nras else None
        # a read that came back (nearly) full: there may be more lines
        if bad_raw is not None and len(bad_raw) > paths.bad_pages_full:
            bad_raw = paths.read_rest(2 + nras, bad_raw)
        memo = self._memo.get(i)
        if memo is None or memo[0] != ras_raw or memo[1] != bad_raw or memo[2] != xgmi or memo[3] != threshold:
            memo = self._memo[i] = self._health(paths, ras_raw, bad_raw, xgmi, threshold)
        health = memo.health
        key = (index if index is not None else i, uuid, total_mib, limit_w, replays)
        template = paths.template
        if template is None or paths.template_memo is not memo or paths.template_key != key:
            template = paths.template = _template(key[0], uuid, total_mib, limit_w, memo, replays)
            paths.template_memo, paths.template_key = memo, key
        sample = _moving(
            template,
            utilization_pct=util,
            memory_utilization_pct=mem_util,
            memory_used_mib=used_mib,
            power_w=watts,
            temperature_c=temp,
            sm_clock_mhz=sclk,
            mem_clock_mhz=mclk,
        )
        return sample, health

    def _from_files(
        self, c: fs.AmdCard, paths: _CardPaths, raw: bytes | None
    ) -> tuple[float | None, float | None, float | None, float | None, float | None, float | None, int | None]:
        """What a table without every field (MI200, an older firmware, no gpu_metrics) leaves to the
        plain files: utilization, memory utilization, power, temperature, clocks, PCIe replays."""
        fds = self.fds
        m = fs.parse_gpu_metrics(raw) if raw else None
        util: float | None
        power: float | None
        temp: float | None
        if m is not None and m.gfx_pct is not None and m.power_w is not None and m.hotspot_c is not None:
            util, mem_util, power, temp = m.gfx_pct, m.umc_pct, m.power_w, m.hotspot_c
        else:
            util, mem_util, power, temp = self._plain(c, m)
        sclk = m.gfxclk_mhz if m and m.gfxclk_mhz is not None else None
        if sclk is None:
            sclk = fs.parse_dpm(fds.text(c.path("pp_dpm_sclk")) or "")
        mclk = m.uclk_mhz if m and m.uclk_mhz is not None else None
        if mclk is None:
            mclk = fs.parse_dpm(fds.text(c.path("pp_dpm_mclk")) or "")
        replays = m.pcie_replays if m and m.pcie_replays is not None else fds.int(paths.replays)
        return util, mem_util, power, temp, sclk, mclk, replays

    def _plain(
        self, c: fs.AmdCard, m: fs.Metrics | None
    ) -> tuple[float | None, float | None, float | None, float | None]:
        """Utilization, memory utilization, power, temperature from the plain files (no gpu_metrics)."""
        fds = self.fds
        util = m.gfx_pct if m and m.gfx_pct is not None else _f(fds.int(c.path("gpu_busy_percent")))
        mem_util = m.umc_pct if m and m.umc_pct is not None else _f(fds.int(c.path("mem_busy_percent")))
        power = m.power_w if m and m.power_w is not None else None
        if power is None and c.power_file:
            uw = fds.int(c.power_file)
            power = uw / 1e6 if uw is not None else None
        temp = m.hotspot_c if m and m.hotspot_c is not None else None
        if temp is None and c.temp_file:
            milli = fds.int(c.temp_file)
            temp = milli / 1000.0 if milli is not None else None
        return util, mem_util, power, temp

    @staticmethod
    def _health(
        paths: _CardPaths,
        ras_raw: list[bytes | None],
        bad_raw: bytes | None,
        xgmi: tuple[int, ...] | None,
        threshold: int | None,
    ) -> _Memo:
        """The card's health from its RAS files, bad pages and XGMI link words, with what the sample
        takes from them."""
        blocks: list[tuple[str, fs.RasCount]] = []
        inaccessible = False
        for (block, _), raw in zip(paths.ras, ras_raw, strict=True):
            if raw is None:
                continue
            text = raw.decode("ascii", "replace")
            if fs.RAS_INACCESSIBLE in text:
                inaccessible = True
                continue
            count = fs.parse_err_count(text)
            if count is not None:
                blocks.append((block, count))
        bad = fs.parse_bad_pages(bad_raw.decode("ascii", "replace")) if bad_raw is not None else None
        ras, ce, umc_ue = _ras(blocks)
        links = fs.xgmi_links(xgmi) if xgmi is not None else None
        health = AmdGpuHealth(
            ras=ras,
            bad_pages=bad.total if bad else None,
            bad_pages_pending=bad.pending if bad else None,
            bad_page_threshold=threshold,
            xgmi_links=len(links) if links else None,
            xgmi_down=[n for n, up in enumerate(links) if up == 0] if links else [],
            ras_inaccessible=inaccessible,
        )
        reserved, pending = (bad.reserved, bad.pending > 0) if bad else (None, None)
        return _Memo(ras_raw, bad_raw, xgmi, threshold, health, ce, umc_ue, reserved, pending)

    def events(self, now: float) -> list[AmdEvent]:
        return []  # no CPER or reset notifications in sysfs (see the module docstring)

    def close(self) -> None:
        self.fds.close()
        for paths in self._paths.values():
            paths.close()


class _SmiMemo(NamedTuple):
    """One handle's health inputs as last read (the ECC total, the bad pages, the XGMI status), what
    was built from them, and the per-block counts read when the total last moved."""

    total: Any  # amdsmi_get_gpu_total_ecc_count's answer
    blocks: list[tuple[str, fs.RasCount]]
    pages: Any
    links: Any
    threshold: int | None
    health: AmdGpuHealth
    ce: int | None
    umc_ue: int | None
    reserved: int | None
    pending: bool | None


def _template(
    index: int,
    uuid: str,
    total_mib: float | None,
    limit_w: float | None,
    memo: _Memo | _SmiMemo,
    replays: int | None = None,
) -> GpuSample:
    """A card's sample of its slow-moving figures (identity, capacity, ECC and pages, health), into
    which `_moving` puts the figures that change every tick; the sysfs and amdsmi readers keep one per
    card."""
    return GpuSample(
        index=index,
        uuid=uuid,
        memory_total_mib=total_mib,
        power_limit_w=limit_w,
        ecc_sbe_volatile=memo.ce,
        ecc_dbe_volatile=memo.umc_ue,
        retired_pages_dbe=memo.reserved,
        retired_pages_pending=memo.pending,
        pcie_replay_count=replays,
        amd=memo.health,
        nvlink=NO_LINKS,
    )


class _SmiGpu:
    """One handle's per-sample calls, resolved at the inventory pass: a function the package lacks, or
    one the GPU answers NOT_SUPPORTED, is `_unsupported` (None) until the next pass asks again."""

    def __init__(self, source: AmdSmiSource, h: Any) -> None:
        smi = source.smi
        self.h = h
        self.fns = {name: source.resolve(name) for name in SAMPLE_CALLS}
        self.order = tuple(self.fns[name] for name in SAMPLE_CALLS)  # as `read` unpacks them
        self.template: GpuSample | None = None
        self.template_key: tuple[Any, ...] = ()
        self.memo: _SmiMemo | None = None
        self.procs_raw: Any = None
        self.procs: list[ProcessInfo] = []
        self.hot = (smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureMetric.CURRENT)
        self.gfx, self.mem = smi.AmdSmiClkType.GFX, smi.AmdSmiClkType.MEM

    def read(self) -> tuple[Any, ...]:
        """The ten per-sample answers, in one go (no Python frame per call); on any exception the
        caller asks each on its own (`read_each`)."""
        activity, vram, power, temp, clock, total, pages, links, procs = self.order
        h, (sensor, metric) = self.h, self.hot
        return (
            activity(h),
            vram(h),
            power(h),
            temp(h, sensor, metric),
            clock(h, self.gfx),
            clock(h, self.mem),
            total(h),
            pages(h),
            links(h),
            procs(h),
        )

    def read_each(self, source: AmdSmiSource) -> tuple[Any, ...]:
        """The same answers one call at a time: a call that fails is None (a NOT_SUPPORTED answer is
        remembered, so the next samples skip it until the next inventory pass)."""
        f, h, one = self.fns, self.h, source.soft
        args: list[tuple[str, tuple[Any, ...]]] = [
            ("amdsmi_get_gpu_activity", (h,)),
            ("amdsmi_get_gpu_vram_usage", (h,)),
            ("amdsmi_get_power_info", (h,)),
            ("amdsmi_get_temp_metric", (h, *self.hot)),
            ("amdsmi_get_clock_info", (h, self.gfx)),
            ("amdsmi_get_clock_info", (h, self.mem)),
            ("amdsmi_get_gpu_total_ecc_count", (h,)),
            ("amdsmi_get_gpu_bad_page_info", (h,)),
            ("amdsmi_get_gpu_xgmi_link_status", (h,)),
            ("amdsmi_get_gpu_process_list", (h,)),
        ]
        out = []
        for name, a in args:
            got, unsupported = one(f[name], *a)
            if unsupported and name != "amdsmi_get_clock_info":  # GFX and MEM share the function
                f[name] = _unsupported
            out.append(got)
        self.order = tuple(f[name] for name in SAMPLE_CALLS)
        return tuple(out)


_ASK_BLOCKS = object()  # a memo's total that no answer equals: the blocks are asked at the next sample


def _unsupported(*_: Any) -> None:
    return None


# The per-sample calls (`_SmiGpu.read`); the ECC count per block is asked only when the total moved.
SAMPLE_CALLS = (
    "amdsmi_get_gpu_activity",
    "amdsmi_get_gpu_vram_usage",
    "amdsmi_get_power_info",
    "amdsmi_get_temp_metric",
    "amdsmi_get_clock_info",
    "amdsmi_get_gpu_total_ecc_count",
    "amdsmi_get_gpu_bad_page_info",
    "amdsmi_get_gpu_xgmi_link_status",
    "amdsmi_get_gpu_process_list",
)
AMDSMI_NOT_SUPPORTED = 2  # amdsmi_status_t AMDSMI_STATUS_NOT_SUPPORTED


class AmdSmiSource:
    """AMD GPUs through the amdsmi 7.x Python package (one processor handle per GPU or partition).

    A sample asks each handle ten things (activity, VRAM, power, hotspot temperature, GFX and MEM
    clocks, the ECC total, bad pages, XGMI links, processes) and, for CPER records, one more. The ECC
    count per RAS block is asked again only when the total moved: amdsmi's total is the sum of the
    enabled blocks' counts (amdsmi_get_gpu_total_ecc_count), and the counts only grow while the driver
    is loaded, so an unchanged total is unchanged blocks. Each inventory pass asks every block anyway."""

    name = "amdsmi"

    def __init__(self, smi: Any, root: Path, *, watch_resets: bool = True) -> None:
        self.smi = smi
        self.root = root
        self.handles = list(smi.amdsmi_get_processor_handles())
        self.lacking: set[str] = set()  # functions this package does not have
        self._static: dict[int, dict[str, Any]] = {}
        self._blocks: dict[int, list[tuple[str, Any]]] = {}
        self._gpus: dict[int, _SmiGpu] = {}
        self._cursors: dict[int, int] = {}
        self._events: queue.SimpleQueue[AmdEvent] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cper = self.resolve("amdsmi_get_gpu_cper_entries")
        info = self._soft(smi.amdsmi_get_gpu_driver_info, self.handles[0]) if self.handles else None
        self.driver_version = info.get("driver_version") if isinstance(info, dict) else None
        if watch_resets and self.handles and hasattr(smi, "AmdSmiEventReader"):
            self._thread = threading.Thread(target=self._watch_resets, name="amdsmi-reset-events", daemon=True)
            self._thread.start()

    def resolve(self, name: str) -> Callable[..., Any]:
        """The package's function, or one that answers None when this package does not have it."""
        fn = getattr(self.smi, name, None)
        if fn is None:
            if name not in self.lacking:
                log.info("amdsmi lacks a function: its field stays empty", call=name)
                self.lacking.add(name)
            return _unsupported
        return fn

    def soft(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, bool]:
        """(the answer, False), or (None, whether the GPU answered NOT_SUPPORTED) when amdsmi raised."""
        try:
            return fn(*args), False
        except self.smi.AmdSmiException as exc:
            log.debug("amdsmi call failed", call=getattr(fn, "__name__", "?"), error=str(exc))
            code = getattr(exc, "get_error_code", None)
            return None, callable(code) and code() == AMDSMI_NOT_SUPPORTED

    def _soft(self, fn: Callable[..., T], *args: Any) -> T | None:
        """A field this GPU / driver cannot give is None (amdsmi raises AmdSmiLibraryException)."""
        return self.soft(fn, *args)[0]

    def count(self) -> int:
        return len(self.handles)

    def partitions(self, i: int) -> int:
        return 1  # amdsmi returns one processor handle per compute partition already

    def refresh(self) -> None:
        pass

    def info(self, i: int) -> tuple[GpuInfo, GpuLimits]:
        smi, h, soft = self.smi, self.handles[i], self._soft
        asic = soft(smi.amdsmi_get_gpu_asic_info, h) or {}
        vram = soft(smi.amdsmi_get_gpu_vram_usage, h)
        total_mib = _f(vram.get("vram_total")) if isinstance(vram, dict) else None
        power = soft(smi.amdsmi_get_power_info, h) or {}
        name = str(asic.get("market_name") or DEVICE_IDS.get(_int(asic.get("device_id")) or -1, "AMD GPU"))
        crit = soft(
            smi.amdsmi_get_temp_metric, h, smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureMetric.CRITICAL
        )
        total_bytes = int(total_mib * MIB) if total_mib else None
        self._static[i] = {
            "total_mib": total_mib,
            "limit_w": _f(power.get("power_limit")),
            "threshold": bad_page_threshold(self.root, total_bytes),
        }
        blocks = smi.AmdSmiGpuBlock
        self._blocks[i] = [(b.lower(), getattr(blocks, b)) for b in AMDSMI_BLOCKS if hasattr(blocks, b)]
        # the calls resolved afresh (a NOT_SUPPORTED asked again), every block read at the next sample
        known = self._gpus.get(i)
        fresh = self._gpus[i] = _SmiGpu(self, h)
        if known is not None and known.memo is not None:
            fresh.memo = known.memo._replace(total=_ASK_BLOCKS)  # its health kept while it holds
        serial = asic.get("asic_serial")
        gpu = GpuInfo(
            index=i,
            uuid=str(soft(smi.amdsmi_get_gpu_device_uuid, h) or f"amd-{i}"),
            model=normalized_model(name, total_mib),
            name=name,
            serial=str(serial) if serial not in (None, "N/A", "") else None,
            pci_bus_id=soft(smi.amdsmi_get_gpu_device_bdf, h),
            memory_total_mib=total_mib,
            power_limit_w=self._static[i]["limit_w"],
            nvlink_links=None,
            vendor="amd",
            compute_partition=_str(soft(smi.amdsmi_get_gpu_compute_partition, h)),
            memory_partition=_str(soft(smi.amdsmi_get_gpu_memory_partition, h)),
        )
        return gpu, GpuLimits(slowdown_temp_c=_f(crit) or DEFAULT_SLOWDOWN_TEMP_C)

    def sample(self, i: int, uuid: str, index: int | None = None) -> tuple[GpuSample, AmdGpuHealth]:
        g = self._gpus.get(i)
        if g is None:
            g = self._gpus[i] = _SmiGpu(self, self.handles[i])
        try:
            activity, vram, power, temp, gfx, mem, total, pages, links, procs = g.read()
        except self.smi.AmdSmiException:
            activity, vram, power, temp, gfx, mem, total, pages, links, procs = g.read_each(self)
        if activity is None and vram is None:
            raise GpuLost()
        threshold = self._static.get(i, {}).get("threshold")
        memo = g.memo
        if (
            memo is None
            or memo.total != total
            or total is None
            or memo.pages != pages
            or memo.links != links
            or memo.threshold != threshold
        ):
            blocks = memo.blocks if memo is not None and total is not None and memo.total == total else None
            fresh = self._health(i, g.h, total, blocks, pages, links, threshold)
            if memo is not None and memo.health == fresh.health:
                fresh = fresh._replace(health=memo.health)  # the same object: the detectors' fast path
            memo = g.memo = fresh
        if procs is not g.procs_raw and procs != g.procs_raw:
            g.procs_raw, g.procs = procs, self._process_infos(procs)
        activity = activity or {}
        power = power or {}
        gfx = gfx or {}
        mem = mem or {}
        watts = _f(power.get("current_socket_power"))
        if watts is None:
            watts = _f(power.get("average_socket_power"))  # MI200: only the average is reported
        used = total_mib = None
        if isinstance(vram, dict):
            used, total_mib = _f(vram.get("vram_used")), _f(vram.get("vram_total"))
        key = (index if index is not None else i, uuid, total_mib, _f(power.get("power_limit")))
        template = g.template
        if template is None or template.amd is not memo.health or g.template_key != key:
            template = g.template = _template(key[0], uuid, total_mib, key[3], memo)
            g.template_key = key
        sample = _moving(
            template,
            utilization_pct=_f(activity.get("gfx_activity")),
            memory_utilization_pct=_f(activity.get("umc_activity")),
            memory_used_mib=used,
            power_w=watts,
            temperature_c=_f(temp),
            sm_clock_mhz=_f(gfx.get("clk")),
            mem_clock_mhz=_f(mem.get("clk")),
            processes=g.procs,
        )
        return sample, memo.health

    def _health(
        self,
        i: int,
        h: Any,
        total: Any,
        blocks: list[tuple[str, fs.RasCount]] | None,
        pages: Any,
        links: Any,
        threshold: int | None,
    ) -> _SmiMemo:
        """The handle's health; the ECC count of each block read again unless `blocks` (the total did not
        move)."""
        if blocks is None:
            blocks = []
            for name, block in self._blocks.get(i, []):
                ec = self._soft(self.smi.amdsmi_get_gpu_ecc_count, h, block)
                if isinstance(ec, dict):
                    ue, corrected = int(ec["uncorrectable_count"]), int(ec["correctable_count"])
                    blocks.append((name, fs.RasCount(ue, corrected, _int(ec.get("deferred_count")))))
        listed = [] if isinstance(pages, str) else pages  # older packages answer "No bad pages found."
        reserved = pending = 0
        for p in listed or []:
            status = _status_name(p.get("status"))
            if "PENDING" in status:
                pending += 1
            elif "RESERVED" in status:
                reserved += 1
        status = links.get("status", []) if isinstance(links, dict) else []
        ras, ce_sum, umc_ue = _ras(blocks)
        ce: int | None = ce_sum
        if ce is None and isinstance(total, dict):
            ce = int(total["correctable_count"])
        known = listed is not None
        health = AmdGpuHealth(
            ras=ras,
            bad_pages=len(listed) if known else None,
            bad_pages_pending=pending if known else None,
            bad_page_threshold=threshold,
            xgmi_links=int(links["total_links"]) if isinstance(links, dict) else None,
            xgmi_down=[n for n, s in enumerate(status) if s == "D"],
        )
        return _SmiMemo(
            total,
            blocks,
            pages,
            links,
            threshold,
            health,
            ce,
            umc_ue,
            reserved if known else None,
            (pending > 0) if known else None,
        )

    def _process_infos(self, procs: Any) -> list[ProcessInfo]:
        out = []
        for p in procs or []:
            usage = p.get("memory_usage") or {}
            vram = _f(usage.get("vram_mem"))
            name = p.get("name") or ""
            mib = vram / MIB if vram is not None else None
            out.append(ProcessInfo(pid=int(p["pid"]), name="" if name == "N/A" else name, used_memory_mib=mib))
        return out

    def events(self, now: float) -> list[AmdEvent]:
        """New CPER records since the last call (AFIDs decoded), and reset notifications."""
        out = []
        smi, cper, cursors = self.smi, self._cper, self._cursors
        for i, h in enumerate(self.handles):
            cursor = cursors.get(i, 0)
            try:
                got = cper(h, CPER_SEVERITY_MASK, CPER_BUFFER, cursor)
            except smi.AmdSmiException as exc:
                log.debug("amdsmi call failed", call="amdsmi_get_gpu_cper_entries", error=str(exc))
                continue
            if got is None:
                continue
            entries, cursor, records, _status = got
            cursors[i] = cursor
            for n, entry in entries.items():
                afids: list[int | None] = []
                if n < len(records):
                    decoded = self._soft(smi.amdsmi_get_afids_from_cper, [records[n]])
                    afids = list(decoded[0]) if decoded else []
                severity = str(entry.get("error_severity", ""))
                for afid in afids or [None]:
                    out.append(AmdEvent(gpu_index=i, kind="cper", at=now, afid=afid, severity=severity))
        if self._events.empty():
            return out
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def _watch_resets(self) -> None:
        smi = self.smi
        kinds = [smi.AmdSmiEvtNotificationType.GPU_PRE_RESET, smi.AmdSmiEvtNotificationType.GPU_POST_RESET]
        readers = []
        for i, h in enumerate(self.handles):
            try:
                readers.append((i, smi.AmdSmiEventReader(h, kinds)))
            except smi.AmdSmiException as exc:
                log.warning("reset notifications unavailable", gpu=i, error=str(exc))
        import time

        while readers and not self._stop.is_set():
            for i, reader in readers:
                try:
                    got = reader.read(100)
                except smi.AmdSmiException:
                    continue
                for e in got or []:
                    name = str(e.get("event", ""))
                    kind = "reset_begin" if "PRE_RESET" in name else "reset_end" if "POST_RESET" in name else ""
                    if kind:
                        self._events.put(AmdEvent(gpu_index=i, kind=kind, at=time.time()))
        for _, reader in readers:
            with contextlib.suppress(Exception):
                reader.stop()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        with contextlib.suppress(Exception):
            self.smi.amdsmi_shut_down()


class AmdSampler:
    """One node's AMD GPUs (the `Sampler` of `node_agent.runner`), from amdsmi or sysfs.

    A GPU in a compute partition mode other than SPX is shown by sysfs as one card; the sampler lists it
    as `gpus_per_device` GPUs (one per partition, an equal share of the memory, the device's health on
    each), which is how the AMD device plugin advertises it. amdsmi already returns one handle per partition.
    """

    def __init__(self, source: SysfsSource | AmdSmiSource, *, node: str = "localhost") -> None:
        self.source = source
        self.node = node
        self.driver_version: str | None = source.driver_version
        self.cuda_version: str | None = None  # there is no CUDA on AMD; ROCm's version is not in sysfs
        self.lost: set[int] = set()
        self._limits: dict[int, GpuLimits] = {}
        self._physical: list[GpuInfo] = []
        self._inventory: list[GpuInfo] = []
        self._split: dict[int, int] = {}  # physical index -> partitions the sampler expands it into
        self._health: dict[int, AmdGpuHealth] = {}
        self._asked = 0
        self._inventory = self._read_inventory()

    @classmethod
    def open(
        cls, root: Path = Path("/"), *, amdsmi: Any = None, node: str = "localhost", use_amdsmi: bool = True
    ) -> AmdSampler:
        """amdsmi when it loads and starts; else sysfs; AmdUnavailable when neither finds a GPU."""
        why = "not tried"
        if use_amdsmi:
            try:
                smi = amdsmi if amdsmi is not None else import_amdsmi()
                smi.amdsmi_init()
                source: SysfsSource | AmdSmiSource = AmdSmiSource(smi, root)
                if source.count():
                    log.info("reading AMD GPUs through amdsmi", gpus=source.count())
                    return cls(source, node=node)
                why = "amdsmi found no GPU"
                source.close()
            except AmdUnavailable as exc:
                why = str(exc)
            except Exception as exc:  # amdsmi_init failing: no amdgpu driver loaded, no permission
                why = f"amdsmi could not start ({exc})"
        source = SysfsSource(root)
        if not source.count():
            raise AmdUnavailable(
                f"no AMD GPU here: none under {root / fs.DRM_DIR} with vendor {fs.AMD_VENDOR}, and {why}. Load "
                "the amdgpu driver (ROCm) on this node, point --sysfs-root at the host's /, or use "
                "`chamber agent --simulate`."
            )
        log.info("reading AMD GPUs from sysfs", gpus=source.count(), amdsmi=why)
        return cls(source, node=node)

    def close(self) -> None:
        self.source.close()

    def limits(self) -> Mapping[int, GpuLimits]:
        return self._limits

    def inventory_gpus(self) -> list[GpuInfo]:
        """The runner asks every 10 s; the identity files are read afresh every `REREAD_INVENTORY`-th
        time (a minute), which is how soon a new partition mode shows (it takes a driver reconfiguration)."""
        self._asked += 1
        if self._asked % REREAD_INVENTORY == 0 or self.lost:
            self._inventory = self._read_inventory()
        return self._inventory

    def _read_inventory(self) -> list[GpuInfo]:
        self.source.refresh()
        physical: list[GpuInfo] = []
        limits: dict[int, GpuLimits] = {}
        for i in range(self.source.count()):
            try:
                gpu, lim = self.source.info(i)
            except GpuLost:
                self.lost.add(i)
                known = next((g for g in self._physical if g.index == i), None)
                gpu, lim = known or GpuInfo(index=i, uuid=f"unknown-{i}", model="unknown", vendor="amd"), GpuLimits()
            physical.append(gpu)
            limits[i] = lim
        self._physical = physical
        self._split = {}
        out: list[GpuInfo] = []
        for gpu in physical:
            n = self.source.partitions(gpu.index)
            self._split[gpu.index] = n
            for part in range(n):
                index = len(out)
                self._limits[index] = limits[gpu.index]
                if n == 1:
                    out.append(_replace(gpu, index=index))
                else:
                    share = gpu.memory_total_mib / n if gpu.memory_total_mib else None
                    out.append(_replace(gpu, index=index, uuid=f"{gpu.uuid}-p{part}", memory_total_mib=share))
        return out

    def read(self, cluster: str, seq: int, now: float, interval_s: float) -> Reading:
        gpus: list[GpuSample] = []
        events: list[AmdEvent] = []
        first = 0
        sample_of, known, inventory, lost_now, split = (
            self.source.sample,
            self._health,
            self._inventory,
            self.lost,
            self._split,
        )
        for phys in self._physical:
            p = phys.index
            n = split.get(p, 1)
            try:
                sample, health = sample_of(p, phys.uuid, first)
                if lost_now:
                    lost_now.discard(p)
            except GpuLost:
                if p not in lost_now:
                    log.error("GPU lost", gpu=p, uuid=phys.uuid)
                lost_now.add(p)
                sample, health = GpuSample(index=first, uuid=phys.uuid), None
            if health is not None:
                prev = known.get(p)
                if prev is not health:
                    if prev is not None and prev == health:
                        health = prev  # the same object while nothing changed: the detectors' fast path
                        sample = msgspec.structs.replace(sample, amd=prev)
                    else:
                        known[p] = health
            if n == 1 and (first >= len(inventory) or inventory[first].uuid == phys.uuid):
                gpus.append(sample)  # the common case: no partitions, the source built it as it goes out
                first += 1
                continue
            # A partition's memory is an equal share of the device's; its load and health are the
            # device's (the sample already carries `health`): one replace per partition.
            used, total = sample.memory_used_mib, sample.memory_total_mib
            if n > 1:
                used = used / n if used is not None else None
                total = total / n if total is not None else None
            for index in range(first, first + n):
                uuid = inventory[index].uuid if index < len(inventory) else phys.uuid
                gpus.append(_moving(sample, index=index, uuid=uuid, memory_used_mib=used, memory_total_mib=total))
            first += n
        lost = (
            frozenset(i for i in range(len(self._inventory)) if self._physical_of(i) in self.lost)
            if self.lost
            else frozenset()
        )
        for e in self.source.events(now):
            events.extend(_replace_event(e, idx) for idx in self._indices_of(e.gpu_index))
        out = NodeSample(cluster=cluster, node=self.node, seq=seq, observed_at=now, interval_s=interval_s, gpus=gpus)
        return Reading(out, (), lost, tuple(events))

    def _physical_of(self, index: int) -> int:
        first = 0
        for phys, n in self._split.items():
            if first <= index < first + n:
                return phys
            first += n
        return index

    def _indices_of(self, phys: int) -> range:
        first = 0
        for p, n in self._split.items():
            if p == phys:
                return range(first, first + n)
            first += n
        return range(phys, phys + 1)


def _replace(gpu: GpuInfo, **changes: Any) -> GpuInfo:
    import msgspec

    return msgspec.structs.replace(gpu, **changes)


def _replace_event(e: AmdEvent, index: int) -> AmdEvent:
    from dataclasses import replace

    return replace(e, gpu_index=index)


def _f(value: Any) -> float | None:
    kind = type(value)
    if kind is int or kind is float:  # what amdsmi answers (bool, a subclass of int, is not a figure)
        return float(value)
    if value is None or value == "N/A" or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    f = _f(value)
    return int(f) if f is not None else None


def _str(value: Any) -> str | None:
    return str(value) if value not in (None, "", "N/A") else None


def _status_name(status: Any) -> str:
    name = getattr(status, "name", None)
    return str(name if name is not None else status).upper()
