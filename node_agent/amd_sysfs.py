"""Every sysfs read of AMD Instinct GPUs in one place: what amdgpu exposes under
`/sys/class/drm/card*/device/` and what KFD exposes under `/sys/class/kfd/kfd/topology/nodes/*`.

This is what AMD's own SMI library reads; the agent uses it when `amdsmi` (libamd_smi.so) is not
installed. The root is a parameter (`chamber agent --sysfs-root`, shared with the NIC reader), so tests
run it on trees `tests/amd_sysfs_tree.py` writes in the same layout. All of it is world-readable.

Sources (cited again where used):
- Linux Documentation/gpu/amdgpu/ras.rst and drivers/gpu/drm/amd/amdgpu/amdgpu_ras.c: `ras/features`
  ("feature mask: 0x..."), `ras/<block>_err_count` ("ue: N", "ce: N", and "de: N" on newer kernels;
  "Query currently inaccessible" while a GPU reset is under way), `ras/gpu_vram_bad_pages`
  ("0x%08x : 0x%08x : R|P|F", gpu pfn : page size : reserved / pending / failed).
- Documentation/gpu/amdgpu/thermal.rst (hwmon: power1_average / power1_input and power1_cap in
  microwatts, temp*_input and temp*_crit in millidegrees, temp*_label edge / junction / mem) and
  driver-misc.rst / amdgpu_pm.c (gpu_busy_percent, mem_busy_percent, mem_info_vram_used|total in
  bytes, pp_dpm_sclk / pp_dpm_mclk lines "N: 1500Mhz *" with the current level starred, unique_id).
- drivers/gpu/drm/amd/include/kgd_pp_interface.h: the binary `gpu_metrics` table (header: u16
  structure_size, u8 format_revision, u8 content_revision; fields 0xFFFF/0xFF.. when not supported).
- drivers/gpu/drm/amd/amdkfd/kfd_topology.c: `nodes/N/properties` ("name value" lines; simd_count 0 is
  a CPU node; location_id = PCI bus<<8 | device<<3 | function; drm_render_minor).
- amdgpu_xcp / amdgpu_gfx.c: `current_compute_partition` (SPX|DPX|TPX|QPX|CPX) and
  `current_memory_partition` (NPS1|NPS2|NPS4|NPS8) on MI300-class devices.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

DRM_DIR = "sys/class/drm"
KFD_NODES_DIR = "sys/class/kfd/kfd/topology/nodes"
AMD_VENDOR = "0x1002"
# RAS blocks amdgpu names in sysfs (amdgpu_ras.c ras_block_string, the ones with an `_err_count` file).
RAS_BLOCKS = ("umc", "gfx", "sdma", "mmhub", "pcie_bif", "hdp", "xgmi_wafl", "athub", "df", "smn", "sem", "mp0",
              "mp1", "fuse", "mca", "vcn", "jpeg", "ih", "mpio", "mmsch")  # fmt: skip
# Each block's bit in `ras/features` (amdgpu_ras.h enum amdgpu_ras_block, in that order): the driver's
# con->features, the blocks whose RAS is enabled. amd-smi reads a block's count only when its bit is set.
RAS_FEATURE_BIT = {name: bit for bit, name in enumerate(
    ("umc", "sdma", "gfx", "mmhub", "athub", "pcie_bif", "hdp", "xgmi_wafl", "df", "smn", "sem", "mp0", "mp1", "fuse",
     "mca", "vcn", "jpeg", "ih", "mpio", "mmsch"))}  # fmt: skip
RAS_INACCESSIBLE = "Query currently inaccessible"  # amdgpu_ras_sysfs_read while a reset runs (-EIO)
_NA16 = 0xFFFF
_NA64 = 0xFFFFFFFFFFFFFFFF

# gpu_metrics offsets per (format, content) revision, from kgd_pp_interface.h under x86-64 natural
# alignment (the structs are not packed): hotspot C, memory C, socket power W, gfx %, umc %,
# current gfxclk MHz (first instance), current uclk MHz, PCIe replay count (u64), XGMI link status
# array (v1.7+: 8 x u16, 1 = up). None: the revision does not carry that field.
_METRICS: dict[tuple[int, int], dict[str, int | None]] = {
    (1, 3): {"hotspot": 6, "mem": 8, "power": 22, "gfx": 16, "umc": 18, "gfxclk": 54, "uclk": 58,
             "replay": None, "xgmi": None},
    (1, 4): {"hotspot": 4, "mem": 6, "power": 10, "gfx": 12, "umc": 14, "gfxclk": 240, "uclk": 280,
             "replay": 88, "xgmi": None},
    (1, 5): {"hotspot": 4, "mem": 6, "power": 10, "gfx": 12, "umc": 14, "gfxclk": 280, "uclk": 320,
             "replay": 120, "xgmi": None},
    (1, 6): {"hotspot": 4, "mem": 6, "power": 10, "gfx": 12, "umc": 14, "gfxclk": 264, "uclk": 304,
             "replay": 104, "xgmi": None},
    (1, 7): {"hotspot": 4, "mem": 6, "power": 10, "gfx": 12, "umc": 14, "gfxclk": 296, "uclk": 336,
             "replay": 112, "xgmi": 264},
    (1, 8): {"hotspot": 4, "mem": 6, "power": 10, "gfx": 12, "umc": 14, "gfxclk": 296, "uclk": 336,
             "replay": 112, "xgmi": 264},
}  # fmt: skip
METRICS_SIZES = {(1, 3): 120, (1, 4): 288, (1, 5): 328, (1, 6): 1664, (1, 7): 2208, (1, 8): 3360}
XGMI_LINKS_IN_METRICS = 8


def read_bytes(path: str) -> bytes | None:
    """One sysfs file, in one read (os-level: sysfs answers a whole attribute per read at offset 0)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 65536)
    except OSError:  # ENODEV: the device went away; EIO: amdgpu refused (reset)
        return None
    finally:
        os.close(fd)


def read_text(path: str) -> str | None:
    raw = read_bytes(path)
    return None if raw is None else raw.decode("ascii", "replace").strip()


def read_int(path: str) -> int | None:
    raw = read_text(path)
    if raw is None or not raw:
        return None
    try:
        return int(raw, 0)
    except ValueError:
        return None


@dataclass(frozen=True)
class RasCount:
    ue: int
    ce: int
    de: int | None


def parse_err_count(text: str) -> RasCount | None:
    """`ue: 0\\nce: 1\\nde: 0` -> RasCount; None for "Query currently inaccessible" or garbage."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("ue", "ce", "de"):
            try:
                values[key.strip()] = int(value.strip())
            except ValueError:
                return None
    if "ue" not in values or "ce" not in values:
        return None
    return RasCount(values["ue"], values["ce"], values.get("de"))


def parse_features(text: str) -> int | None:
    """`feature mask: 0x3fbff` -> the mask (a bit per RAS block, amdgpu_ras_block order)."""
    m = re.search(r"feature mask:\s*(0x[0-9a-fA-F]+|\d+)", text)
    return int(m.group(1), 0) if m else None


@dataclass(frozen=True)
class BadPages:
    total: int
    reserved: int
    pending: int
    failed: int


def parse_bad_pages(text: str) -> BadPages:
    """Lines `0x00000001 : 0x00001000 : R` (pfn : size : R reserved | P pending | F failed to reserve)."""
    reserved = pending = failed = 0
    for line in text.splitlines():
        flag = line.rpartition(":")[2].strip()
        if flag == "R":
            reserved += 1
        elif flag == "P":
            pending += 1
        elif flag == "F":
            failed += 1
    return BadPages(reserved + pending + failed, reserved, pending, failed)


def parse_dpm(text: str) -> float | None:
    """pp_dpm_sclk: `0: 500Mhz\\n1: 1900Mhz *` -> 1900.0 (the starred level is the current one)."""
    for line in text.splitlines():
        if line.rstrip().endswith("*"):
            m = re.search(r"(\d+)\s*Mhz", line, flags=re.I)
            if m:
                return float(m.group(1))
    return None


class Metrics(NamedTuple):
    """The fields of one gpu_metrics table the agent uses (None: not in this revision / not supported).
    A NamedTuple: one is decoded per GPU per sample, and a frozen dataclass costs several times more."""

    revision: tuple[int, int]
    hotspot_c: float | None = None
    mem_temp_c: float | None = None
    power_w: float | None = None
    gfx_pct: float | None = None
    umc_pct: float | None = None
    gfxclk_mhz: float | None = None
    uclk_mhz: float | None = None
    pcie_replays: int | None = None
    xgmi_status: tuple[int, ...] | None = None  # per link: 1 up, 0 down (v1.7+)


_FIELDS = ("hotspot", "mem", "power", "gfx", "umc", "gfxclk", "uclk")


def _compile(layout: dict[str, int | None]) -> tuple[struct.Struct, tuple[int, ...], int | None, int | None]:
    """One struct.Struct that picks every field of a layout in one unpack (pad bytes between them), and
    where each field lands in the unpacked tuple: the 16-bit fields of `_FIELDS` in that order, the
    replay counter, the first XGMI link (None: not in this revision). Done once per revision."""
    sizes = {"replay": 8, "xgmi": 2 * XGMI_LINKS_IN_METRICS}
    fields = sorted((off, name) for name, off in layout.items() if off is not None)
    fmt, at, pos, where = "<", 0, 0, {}
    for off, name in fields:
        fmt += f"{off - at}x" if off > at else ""
        fmt += {"replay": "Q", "xgmi": f"{XGMI_LINKS_IN_METRICS}H"}.get(name, "H")
        at = off + sizes.get(name, 2)
        where[name] = pos
        pos += XGMI_LINKS_IN_METRICS if name == "xgmi" else 1
    return struct.Struct(fmt), tuple(where[f] for f in _FIELDS), where.get("replay"), where.get("xgmi")


_HEADER = struct.Struct("<HBB")


class MetricsDecoder(NamedTuple):
    """How to read one gpu_metrics header's tables (the header: structure size and revision): one
    `unpack` of every field, and `pick` that orders hotspot, power, gfx %, umc %, gfxclk, uclk (and the
    replay counter where the revision has one) out of it. The agent decodes 8 of these a sample."""

    revision: tuple[int, int]
    min_len: int  # a shorter read is refused
    unpack: Callable[[bytes], tuple[int, ...]]
    pick: Callable[[tuple[int, ...]], tuple[int, ...]]  # always 7 values (the last a filler without replay)
    mem_at: int  # the memory temperature in the unpacked tuple
    has_replay: bool
    xgmi: slice | None  # the XGMI link status words in the unpacked tuple (v1.7+)


_DECODERS: dict[bytes, MetricsDecoder | None] = {}


def metrics_decoder(raw: bytes) -> MetricsDecoder | None:
    """The decoder for this table's header (cached per header); None for a revision we do not know or
    a read too short to hold the table."""
    head = raw[:4]
    try:
        dec = _DECODERS[head]
    except KeyError:
        dec = _new_decoder(head)
        if len(_DECODERS) > 64:  # garbage headers must not grow it without bound
            _DECODERS.clear()
        _DECODERS[head] = dec
    if dec is None or len(raw) < dec.min_len:
        return None
    return dec


def _new_decoder(head: bytes) -> MetricsDecoder | None:
    if len(head) < 4:
        return None
    size, fmt, content = _HEADER.unpack(head)
    rev = (fmt, content)
    if rev not in _METRICS:
        return None
    packer, at, replay_at, xgmi_at = _compile(_METRICS[rev])
    hot, mem, power, gfx, umc, gfxclk, uclk = at
    picked = (hot, power, gfx, umc, gfxclk, uclk, replay_at if replay_at is not None else hot)
    return MetricsDecoder(
        revision=rev,
        # min(size, known): a table that says it is shorter is read as far as it goes; never shorter
        # than the fields unpacked
        min_len=max(min(size, METRICS_SIZES[rev]), packer.size),
        unpack=packer.unpack_from,
        pick=itemgetter(*picked),
        mem_at=mem,
        has_replay=replay_at is not None,
        xgmi=slice(xgmi_at, xgmi_at + XGMI_LINKS_IN_METRICS) if xgmi_at is not None else None,
    )


def _f16(v: int) -> float | None:
    return None if v == _NA16 else float(v)


def parse_gpu_metrics(raw: bytes) -> Metrics | None:
    """Decode a gpu_metrics table of a known v1 revision; None for one we do not know or a short read."""
    dec = metrics_decoder(raw)
    if dec is None:
        return None
    v = dec.unpack(raw)
    got = dec.pick(v)
    replay = got[6] if dec.has_replay else None  # else a filler
    return Metrics(
        dec.revision,
        hotspot_c=_f16(got[0]),
        mem_temp_c=_f16(v[dec.mem_at]),
        power_w=_f16(got[1]),
        gfx_pct=_f16(got[2]),
        umc_pct=_f16(got[3]),
        gfxclk_mhz=_f16(got[4]),
        uclk_mhz=_f16(got[5]),
        pcie_replays=None if replay is None or replay == _NA64 else int(replay),
        xgmi_status=xgmi_links(v[dec.xgmi]) if dec.xgmi is not None else None,
    )


def xgmi_links(words: tuple[int, ...]) -> tuple[int, ...]:
    """The link status words a board fills (1 up, 0 down); 0xFFFF is a link it does not have."""
    return tuple(s for s in words if s != _NA16)


def parse_properties(text: str) -> dict[str, int]:
    """KFD `properties`: "simd_count 1216" lines -> {name: int}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        try:
            out[name] = int(value.strip())
        except ValueError:
            continue
    return out


@dataclass
class AmdCard:
    """One AMD GPU's sysfs directory, with its file paths resolved once (reads happen per sample)."""

    card: str  # card0
    device: str  # .../card0/device
    pci_bus_id: str  # 0000:05:00.0 (the device link's target)
    device_id: int | None
    hwmon: str | None  # .../device/hwmon/hwmon3
    ras_blocks: list[str] = field(default_factory=list)  # blocks with an _err_count file
    power_file: str | None = None  # power1_average or power1_input
    temp_file: str | None = None  # the junction (hotspot) sensor, else edge
    temp_crit_file: str | None = None

    def path(self, name: str) -> str:
        return f"{self.device}/{name}"


def find_cards(root: Path) -> list[AmdCard]:
    """AMD GPUs under root/sys/class/drm (`cardN` whose device/vendor is 0x1002), in card order."""
    drm = root / DRM_DIR
    try:
        names = sorted((n for n in os.listdir(drm) if re.fullmatch(r"card\d+", n)), key=lambda n: int(n[4:]))
    except OSError:
        return []
    cards = []
    for name in names:
        device = str(drm / name / "device")
        if (read_text(f"{device}/vendor") or "").lower() != AMD_VENDOR:
            continue
        cards.append(_card(name, device))
    return cards


def _card(name: str, device: str) -> AmdCard:
    try:
        bus_id = os.path.basename(os.path.realpath(device))
    except OSError:
        bus_id = ""
    if not re.fullmatch(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]", bus_id):
        bus_id = ""
    card = AmdCard(card=name, device=device, pci_bus_id=bus_id, device_id=read_int(f"{device}/device"), hwmon=None)
    try:
        hwmons = sorted(os.listdir(f"{device}/hwmon"))
    except OSError:
        hwmons = []
    if hwmons:
        card.hwmon = hw = f"{device}/hwmon/{hwmons[0]}"
        powers = (f"{hw}/{f}" for f in ("power1_average", "power1_input"))
        card.power_file = next((f for f in powers if os.path.exists(f)), None)
        labels = {}
        for n in range(1, 6):
            label = read_text(f"{hw}/temp{n}_label")
            if label is not None:
                labels[label] = n
        sensor = labels.get("junction") or labels.get("edge") or (1 if os.path.exists(f"{hw}/temp1_input") else None)
        if sensor is not None:
            card.temp_file = f"{hw}/temp{sensor}_input"
            card.temp_crit_file = f"{hw}/temp{sensor}_crit"
    card.ras_blocks = ras_blocks(device)
    return card


def ras_blocks(device: str) -> list[str]:
    """The RAS blocks of a device to read: those with an `_err_count` file whose bit `ras/features` sets
    (all with a file when the mask does not read). The driver makes the files in its late init, and
    the mask can change at run time (ras_ctrl), so the agent asks again on its inventory pass."""
    try:
        names = set(os.listdir(f"{device}/ras"))
    except OSError:
        return []
    mask = parse_features(read_text(f"{device}/ras/features") or "") if "features" in names else None
    return [b for b in RAS_BLOCKS if f"{b}_err_count" in names and (mask is None or mask >> RAS_FEATURE_BIT[b] & 1)]


@dataclass(frozen=True)
class KfdNode:
    node: int
    properties: dict[str, int]

    @property
    def is_gpu(self) -> bool:
        return self.properties.get("simd_count", 0) > 0


def read_kfd_nodes(root: Path) -> list[KfdNode]:
    """KFD topology nodes (CPUs and GPUs, and on a partitioned MI300 one node per compute partition)."""
    base = root / KFD_NODES_DIR
    try:
        names = sorted((n for n in os.listdir(base) if n.isdigit()), key=int)
    except OSError:
        return []
    out = []
    for n in names:
        text = read_text(str(base / n / "properties"))
        if text is not None:
            out.append(KfdNode(int(n), parse_properties(text)))
    return out


def location_id(pci_bus_id: str) -> int | None:
    """0000:05:00.0 -> KFD location_id (bus << 8 | device << 3 | function)."""
    m = re.fullmatch(r"[0-9a-fA-F]{4}:([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", pci_bus_id)
    if not m:
        return None
    return int(m.group(1), 16) << 8 | int(m.group(2), 16) << 3 | int(m.group(3))
