"""A bounded, ordered on-disk spool for messages that could not be published yet.

Records are appended to segment files (length-prefixed msgpack) and read back oldest segment first.
When the spool is over its size limit, it sheds the oldest samples first (counted), then the oldest
inventories, and only when nothing but faults is left, the oldest faults (counted too): a fault is
never dropped while a sample could be dropped instead.

An agent that restarts finds its segments and flushes them. The file writes are not fsynced: the
spool survives the agent's crash, not the machine's power loss (a sample a second is not worth an
fsync each).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import BinaryIO

import msgspec

_LEN = struct.Struct(">I")


class Kind(IntEnum):
    """Drop order when full: samples first, faults last."""

    SAMPLE = 0
    INVENTORY = 1
    JOB = 2
    FAULT = 3


class Record(msgspec.Struct, array_like=True, frozen=True):
    kind: int
    subject: str
    headers: dict[str, str]
    body: bytes

    @property
    def msg_id(self) -> str:
        return self.headers.get("Nats-Msg-Id", "")


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(Record)


@dataclass
class SpoolStats:
    spooled: int = 0
    flushed: int = 0
    dropped_samples: int = 0
    dropped_inventories: int = 0
    dropped_jobs: int = 0
    dropped_faults: int = 0

    def dropped(self, kind: int, n: int = 1) -> None:
        if kind == Kind.SAMPLE:
            self.dropped_samples += n
        elif kind == Kind.INVENTORY:
            self.dropped_inventories += n
        elif kind == Kind.JOB:
            self.dropped_jobs += n
        else:
            self.dropped_faults += n


class Spool:
    def __init__(
        self, directory: Path, *, max_bytes: int = 256 * 1024 * 1024, segment_bytes: int = 1024 * 1024
    ) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = min(segment_bytes, max(4096, max_bytes // 4))
        self.stats = SpoolStats()
        self._segments: list[int] = sorted(int(p.stem) for p in self.dir.glob("*.seg"))
        self._sizes: dict[int, int] = {n: self._path(n).stat().st_size for n in self._segments}
        self._count: dict[int, int] = {}
        self._min_kind: dict[int, int] = {}  # lowest kind in a segment (unknown: 0), to skip shed-free ones
        self._writer: BinaryIO | None = None
        self._writing: int | None = None

    # --- layout ---------------------------------------------------------------------------------

    def _path(self, n: int) -> Path:
        return self.dir / f"{n:012d}.seg"

    @property
    def bytes(self) -> int:
        return sum(self._sizes.values())

    def __len__(self) -> int:
        """Records held (segments found at start are counted when first read)."""
        return sum(self._count.get(n, 0) for n in self._segments)

    def empty(self) -> bool:
        return not self._segments

    # --- writing --------------------------------------------------------------------------------

    def append(self, records: list[Record]) -> None:
        if not records:
            return
        for r in records:
            data = _enc.encode(r)
            w = self._open_for_write(len(data) + 4)
            w.write(_LEN.pack(len(data)))
            w.write(data)
            assert self._writing is not None
            self._sizes[self._writing] += len(data) + 4
            self._count[self._writing] = self._count.get(self._writing, 0) + 1
            self._min_kind[self._writing] = min(self._min_kind.get(self._writing, r.kind), r.kind)
        self.stats.spooled += len(records)
        if self._writer is not None:
            self._writer.flush()
        self._enforce_limit()

    def _open_for_write(self, size: int) -> BinaryIO:
        if (
            self._writer is not None
            and self._writing is not None
            and self._sizes[self._writing] + size > self.segment_bytes
        ):
            self._close_writer()
        if self._writer is None:
            n = (self._segments[-1] + 1) if self._segments else 1
            self._segments.append(n)
            self._sizes[n] = 0
            self._count[n] = 0
            self._writer = open(self._path(n), "ab")  # noqa: SIM115 (kept open across appends)
            self._writing = n
        return self._writer

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None
        self._writing = None

    def close(self) -> None:
        self._close_writer()

    # --- shedding -------------------------------------------------------------------------------

    def _enforce_limit(self) -> None:
        for shed in (Kind.SAMPLE, Kind.INVENTORY, Kind.JOB, Kind.FAULT):
            for n in list(self._segments):
                if self.bytes <= self.max_bytes:
                    return
                if self._min_kind.get(n, 0) <= shed:
                    self._shed(n, shed)

    def _shed(self, n: int, kind: Kind) -> None:
        """Rewrite segment n without its records of `kind` and below (oldest first)."""
        if n == self._writing:
            self._close_writer()
        records = self._read(n)
        keep = [r for r in records if r.kind > kind]
        for r in records:
            if r.kind <= kind:
                self.stats.dropped(r.kind)
        if len(keep) == len(records):
            return
        if not keep:
            self._remove(n)
            return
        self._rewrite(n, keep)

    # --- reading and acknowledging ----------------------------------------------------------------

    def oldest(self) -> tuple[int, list[Record]] | None:
        """The oldest segment's records (the segment being written is closed first)."""
        if not self._segments:
            return None
        n = self._segments[0]
        if n == self._writing:
            self._close_writer()
        return n, self._read(n)

    def done(self, n: int, published: int) -> None:
        """The first `published` records of segment n are in the stream: forget them."""
        if n not in self._sizes:
            return
        records = self._read(n)
        self.stats.flushed += min(published, len(records))
        rest = records[published:]
        if not rest:
            self._remove(n)
            return
        self._rewrite(n, rest)

    def _rewrite(self, n: int, records: list[Record]) -> None:
        """Replace segment n with `records` (non-empty), atomically."""
        tmp = self._path(n).with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for r in records:
                data = _enc.encode(r)
                f.write(_LEN.pack(len(data)))
                f.write(data)
        os.replace(tmp, self._path(n))
        self._sizes[n] = self._path(n).stat().st_size
        self._count[n] = len(records)
        self._min_kind[n] = min(r.kind for r in records)

    def _read(self, n: int) -> list[Record]:
        if n == self._writing and self._writer is not None:
            self._writer.flush()
        data = self._path(n).read_bytes()
        out: list[Record] = []
        pos = 0
        while pos + 4 <= len(data):
            (size,) = _LEN.unpack_from(data, pos)
            if pos + 4 + size > len(data):
                break  # a torn write at a crash: the rest of the segment is lost
            try:
                out.append(_dec.decode(data[pos + 4 : pos + 4 + size]))
            except msgspec.DecodeError:
                break
            pos += 4 + size
        self._count[n] = len(out)
        self._min_kind[n] = min((r.kind for r in out), default=int(Kind.FAULT) + 1)
        return out

    def _remove(self, n: int) -> None:
        if n == self._writing:
            self._close_writer()
        self._path(n).unlink(missing_ok=True)
        self._segments.remove(n)
        self._sizes.pop(n, None)
        self._count.pop(n, None)
        self._min_kind.pop(n, None)
