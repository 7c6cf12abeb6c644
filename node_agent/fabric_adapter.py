"""Every read of the node's fabric in one place: InfiniBand/RoCE ports and Ethernet interfaces from
sysfs, PFC pause counters through the ethtool statistics ioctl, and (optionally) NCCL's RAS service.

All reads work without root (shared/reference/fabric.md). The sysfs root is a parameter, so tests run
the adapter on a recorded tree they create. What cannot be read is None in the sample, never 0; a
counter that goes backwards (wrap, driver reload, reset) restarts its rate (None for that interval),
and a saturated 32/64-bit counter reads as unknown: a rate is never negative.

Sources: the kernel's drivers/infiniband/core/sysfs.c (port attributes, counters in 4-byte words for
port_xmit_data / port_rcv_data), node_exporter's infiniband and netclass collectors (which files exist),
net/ethtool/ioctl.c (ETHTOOL_GSTATS needs no CAP_NET_ADMIN).
"""

from __future__ import annotations

import array
import fcntl
import os
import re
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from events.fabric import CollectiveBandwidth, CommProgress, DeadPeer, FabricSample, LinkState, NicSample
from services.runtime.logs import get_logger

log = get_logger("chamber.agent.fabric")

IB_DIR = "sys/class/infiniband"
NET_DIR = "sys/class/net"
_SATURATED = {2**32 - 1, 2**64 - 1}  # non-extended IB counters stop at their maximum instead of wrapping
IB_ERROR_COUNTERS = ("symbol_error", "port_rcv_errors", "port_rcv_remote_physical_errors", "link_error_recovery")
ETH_ERROR_COUNTERS = ("rx_errors", "tx_errors", "rx_crc_errors")
ETH_DISCARD_COUNTERS = ("rx_dropped", "tx_dropped")
_PAUSE = re.compile(r"^(rx|tx)_(prio\d+_)?pause(_ctrl_phy)?$")  # mlx5: rx_prio3_pause, rx_pause_ctrl_phy


def _natural(name: str) -> list[object]:
    """mlx5_2 before mlx5_10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(path: Path) -> int | None:
    raw = _text(path)
    if raw is None:
        return None
    try:
        value = int(raw, 0) if raw.startswith("0x") else int(raw)
    except ValueError:
        return None
    return None if value < 0 or value in _SATURATED else value


def ib_state(raw: str | None) -> LinkState:
    """`4: ACTIVE` -> up; `1: DOWN` -> down; `2: INIT` / `3: ARMED` -> init."""
    word = (raw or "").partition(":")[2].strip().upper() or (raw or "").strip().upper()
    return {"ACTIVE": LinkState.UP, "DOWN": LinkState.DOWN, "INIT": LinkState.INIT, "ARMED": LinkState.INIT}.get(
        word, LinkState.UNKNOWN
    )


def eth_state(raw: str | None) -> LinkState:
    return {"up": LinkState.UP, "down": LinkState.DOWN, "lowerlayerdown": LinkState.DOWN}.get(
        (raw or "").lower(), LinkState.UNKNOWN
    )


def ib_rate_gbps(raw: str | None) -> float | None:
    """`400 Gb/sec (4X NDR)` -> 400.0."""
    m = re.match(r"^\s*([0-9.]+)\s*Gb/sec", raw or "")
    return float(m.group(1)) if m else None


def eth_speed_gbps(raw: str | None) -> float | None:
    """`speed` is Mb/s; -1 (or unreadable while the link is down) is unknown."""
    try:
        mbps = int(raw or "")
    except ValueError:
        return None
    return mbps / 1000.0 if mbps > 0 else None


@dataclass(frozen=True)
class PortReading:
    """Raw cumulative counters of one port at one time (None: unreadable)."""

    name: str
    kind: str
    state: LinkState
    rate_gbps: float | None
    tx_bytes: int | None
    rx_bytes: int | None
    errors: int | None
    discards: int | None
    pause: int | None
    flaps: int | None


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def read_ib_port(port_dir: Path, name: str, pause: int | None = None) -> PortReading:
    c = port_dir / "counters"
    words_tx, words_rx = _int(c / "port_xmit_data"), _int(c / "port_rcv_data")
    wait = _int(c / "port_xmit_wait")
    return PortReading(
        name=name,
        kind="ib",
        state=ib_state(_text(port_dir / "state")),
        rate_gbps=ib_rate_gbps(_text(port_dir / "rate")),
        tx_bytes=None if words_tx is None else words_tx * 4,
        rx_bytes=None if words_rx is None else words_rx * 4,
        errors=_sum([_int(c / n) for n in IB_ERROR_COUNTERS]),
        discards=_int(c / "port_xmit_discards"),
        pause=pause if pause is not None else wait,
        flaps=_int(c / "link_downed"),
    )


def read_eth(if_dir: Path, name: str, pause: int | None = None) -> PortReading:
    s = if_dir / "statistics"
    changes = _int(if_dir / "carrier_changes")
    return PortReading(
        name=name,
        kind="eth",
        state=eth_state(_text(if_dir / "operstate")),
        rate_gbps=eth_speed_gbps(_text(if_dir / "speed")),
        tx_bytes=_int(s / "tx_bytes"),
        rx_bytes=_int(s / "rx_bytes"),
        errors=_sum([_int(s / n) for n in ETH_ERROR_COUNTERS]),
        discards=_sum([_int(s / n) for n in ETH_DISCARD_COUNTERS]),
        pause=pause,
        flaps=None if changes is None else (changes + 1) // 2,  # a flap is down + up: two carrier changes
    )


# --- ethtool statistics (PFC pause) ------------------------------------------------------------------

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x00000003
ETHTOOL_GSTRINGS = 0x0000001B
ETHTOOL_GSTATS = 0x0000001D
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
_DRVINFO_LEN = 196  # struct ethtool_drvinfo
_N_STATS_AT = 180  # offset of n_stats in it


def ethtool_stats(ifname: str) -> dict[str, int] | None:
    """The driver's statistics (`ethtool -S`), or None where the interface or driver offers none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            drv = array.array("B", struct.pack("I", ETHTOOL_GDRVINFO) + bytes(_DRVINFO_LEN - 4))
            _ioctl(sock, ifname, drv)
            (n,) = struct.unpack_from("I", drv, _N_STATS_AT)
            if n == 0 or n > 100_000:
                return None
            names = array.array("B", struct.pack("III", ETHTOOL_GSTRINGS, ETH_SS_STATS, n) + bytes(n * ETH_GSTRING_LEN))
            _ioctl(sock, ifname, names)
            stats = array.array("B", struct.pack("II", ETHTOOL_GSTATS, n) + bytes(n * 8))
            _ioctl(sock, ifname, stats)
    except OSError:
        return None
    raw_names, raw_values = bytes(names[12:]), bytes(stats[8:])
    out = {}
    for i in range(n):
        key = raw_names[i * ETH_GSTRING_LEN : (i + 1) * ETH_GSTRING_LEN].split(b"\0", 1)[0].decode(errors="replace")
        (out[key],) = struct.unpack_from("Q", raw_values, i * 8)
    return out


def _ioctl(sock: socket.socket, ifname: str, buf: array.array[int]) -> None:
    addr, _ = buf.buffer_info()
    ifreq = struct.pack("16sP", ifname.encode()[:15], addr)
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq + bytes(40 - len(ifreq)))


def pause_frames(stats: Mapping[str, int] | None) -> int | None:
    """Sum of the per-priority (or global) pause counters a driver reports; None if it reports none."""
    if not stats:
        return None
    hits = [v for k, v in stats.items() if _PAUSE.match(k)]
    return sum(hits) if hits else None


# --- NCCL RAS (optional) -----------------------------------------------------------------------------

RAS_PORT = 28028


def read_nccl_ras(host: str = "127.0.0.1", port: int = RAS_PORT, timeout_s: float = 0.5) -> list[CommProgress] | None:
    """Per-communicator collective counts from NCCL's RAS service (JSON output: NCCL >= 2.28.7), or None
    when it is unreachable or too old to answer in JSON. The agent no longer uses this one-shot reader:
    `--nccl-ras` runs node_agent/ras_poller.py (the documented handshake, text fallback, MONITOR).
    Unverified against a live NCCL here: the parser takes what it recognises
    (`communicators[*].{id|commHash, ranks, ops|collOpCount, missingRanks}`) and ignores the rest."""
    import json

    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            conn.sendall(b"SET FORMAT json\nSTATUS\n")
            chunks = []
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if sum(len(c) for c in chunks) > 4 * 1024 * 1024:
                    break
    except OSError:
        return None
    try:
        doc = json.loads(b"".join(chunks).decode(errors="replace"))
    except ValueError:
        return None
    comms = doc.get("communicators") if isinstance(doc, dict) else None
    if not isinstance(comms, list):
        return None
    out = []
    for c in comms:
        if not isinstance(c, dict):
            continue
        ops = c.get("ops", c.get("collOpCount"))
        comm = c.get("id", c.get("commHash"))
        if isinstance(ops, int) and comm is not None:
            ranks = c.get("ranks")
            missing = c.get("missingRanks", 0)
            out.append(
                CommProgress(
                    comm=str(comm),
                    ops=ops,
                    ranks=ranks if isinstance(ranks, int) else None,
                    missing_ranks=missing if isinstance(missing, int) else 0,
                )
            )
    return out


def node_addresses() -> list[str]:
    """This host's IP addresses as the resolver knows them (NCCL RAS names peers by address)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        return []
    return sorted({str(i[4][0]) for i in infos if not str(i[4][0]).startswith(("127.", "::1"))})


# --- the adapter -------------------------------------------------------------------------------------


@dataclass
class _Prev:
    at: float
    reading: PortReading


def _delta(now: int | None, before: int | None) -> int | None:
    """Counts within the interval; None when unknown or when the counter went backwards (a reset)."""
    if now is None or before is None or now < before:
        return None
    return now - before


def _rate(now: int | None, before: int | None, dt: float) -> float | None:
    d = _delta(now, before)
    return None if d is None or dt <= 0 else round(d / dt, 1)


@dataclass
class FabricAdapter:
    """Reads every NIC port of the node and turns counters into per-interval rates and deltas.

    `rails` maps a port name (`mlx5_0/1`, `eth2`) to the GPU it serves; `labels` are the node's topology
    (rack, leaf, spine). `ethtool` and `ras` are the pause-counter and NCCL readers (None: not read).
    """

    root: Path = Path("/")
    labels: dict[str, str] = field(default_factory=dict)
    rails: dict[str, int] = field(default_factory=dict)
    ethtool: Callable[[str], dict[str, int] | None] | None = ethtool_stats
    ras: Callable[[], list[CommProgress] | None] | None = None
    ras_dead: Callable[[], list[DeadPeer]] | None = None  # NCCL RAS peers declared dead (node_agent/ras_poller.py)
    addresses: list[str] = field(default_factory=list)  # this node's IPs: RAS names a dead peer by address
    inspector: Callable[[], list[CollectiveBandwidth]] | None = None  # NCCL Inspector (node_agent/inspector.py)
    _prev: dict[str, _Prev] = field(default_factory=dict)
    _ras_failed: bool = False
    _ib: Path = field(init=False)
    _net: Path = field(init=False)

    def __post_init__(self) -> None:
        self._ib, self._net = self.root / IB_DIR, self.root / NET_DIR  # joined once, not every sample

    def ports(self) -> list[PortReading]:
        out: list[PortReading] = []
        rdma_netdevs: set[str] = set()
        ib = self._ib
        for dev in sorted(_listdir(ib), key=_natural):
            ports_dir = ib / dev / "ports"
            netdev = self._rdma_netdev(ib / dev)
            if netdev:
                rdma_netdevs.add(netdev)
            pause = pause_frames(self.ethtool(netdev)) if netdev and self.ethtool else None
            for port in sorted(_listdir(ports_dir), key=_natural):
                out.append(read_ib_port(ports_dir / port, f"{dev}/{port}", pause))
        net = self._net
        for ifname in sorted(_listdir(net), key=_natural):
            if_dir = net / ifname
            # Physical interfaces only (virtual ones have no `device`), and not the netdev of an RDMA
            # device already read above (its traffic would count twice).
            if (
                ifname in rdma_netdevs
                or not (if_dir / "device").exists()
                or (if_dir / "device" / "infiniband").exists()
            ):
                continue
            pause = pause_frames(self.ethtool(ifname)) if self.ethtool else None
            out.append(read_eth(if_dir, ifname, pause))
        return out

    @staticmethod
    def _rdma_netdev(dev_dir: Path) -> str | None:
        """The Ethernet netdev under a RoCE device (`device/net/<if>`), for its PFC counters."""
        names = _listdir(dev_dir / "device" / "net")
        return sorted(names)[0] if names else None

    def read(self, cluster: str, node: str, seq: int, now: float, interval_s: float) -> FabricSample | None:
        """One sample of every port; None when the node has no readable NIC at all."""
        ports = self.ports()
        if not ports and self.ras is None:
            return None
        nics = []
        for i, p in enumerate(ports):
            prev = self._prev.get(p.name)
            self._prev[p.name] = _Prev(now, p)
            before = prev.reading if prev is not None else None
            dt = now - prev.at if prev is not None else 0.0
            nics.append(
                NicSample(
                    name=p.name,
                    index=i,
                    kind=p.kind,
                    state=p.state,
                    rate_gbps=p.rate_gbps,
                    tx_bytes_per_s=_rate(p.tx_bytes, before.tx_bytes, dt) if before else None,
                    rx_bytes_per_s=_rate(p.rx_bytes, before.rx_bytes, dt) if before else None,
                    errors=_delta(p.errors, before.errors) if before else None,
                    discards=_delta(p.discards, before.discards) if before else None,
                    pause=_delta(p.pause, before.pause) if before else None,
                    flaps=_delta(p.flaps, before.flaps) if before else None,
                    gpu_index=self.rails.get(p.name),
                )
            )
        for gone in set(self._prev) - {p.name for p in ports}:
            del self._prev[gone]  # a port that comes back starts its rates over
        return FabricSample(
            cluster=cluster,
            node=node,
            seq=seq,
            observed_at=now,
            interval_s=interval_s,
            nics=nics,
            comms=self._comms(),
            labels=self.labels,
            dead_peers=self.ras_dead() if self.ras_dead is not None else [],
            addresses=list(self.addresses),
            collectives=self.inspector() if self.inspector is not None else [],
        )

    def _comms(self) -> list[CommProgress]:
        if self.ras is None:
            return []
        comms = self.ras()
        if comms is None:
            if not self._ras_failed:  # one line, not one per interval
                log.info("NCCL RAS not reachable or too old (no JSON); collective progress skipped")
            self._ras_failed = True
            return []
        self._ras_failed = False
        return comms


_missing: set[Path] = set()  # directories the last listing did not find


def _listdir(path: Path) -> list[str]:
    """The names in a directory, [] when it cannot be listed. A directory that was missing is listed
    again once `access` finds it: a listing that fails builds an exception object, every sample on a
    node without InfiniBand (about 10,000 instructions of the sample's 730,000 on an AMD node)."""
    if path in _missing:
        if not os.access(path, os.F_OK):
            return []
        _missing.discard(path)
    try:
        return os.listdir(path)  # names only: no Path object per entry (this runs every sample)
    except OSError:
        if len(_missing) > 1024:  # devices come and go: keep it bounded
            _missing.clear()
        _missing.add(path)
        return []
