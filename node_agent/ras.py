"""NCCL RAS: an asyncio client for the RAS port of the NCCL job on this node, and parsers of its output.

Protocol (NCCL's user guide, docs/userguide/source/troubleshooting/ras.rst, and the `ncclras` client,
src/ras/client.cc, in github.com/NVIDIA/nccl): a plain-text TCP protocol on localhost:28028
(`NCCL_RAS_ADDR`). The client sends `CLIENT PROTOCOL <n>` and the server answers `SERVER PROTOCOL <n>`;
`TIMEOUT <s>` and `SET FORMAT json` (NCCL >= 2.28.7) are answered `OK`; `STATUS` / `VERBOSE STATUS`
print the job summary and the communicators and close the connection; `MONITOR` (NCCL >= 2.29) streams
events (`PEER_DEAD` when a process is declared dead, after 60 s unreachable) until the job ends;
`diagnostics` prints `<host>:<pid> NCCL DIAG [OK]|[INFO] ...` lines (or `BUSY: ...`).

What is parsed (the rest is ignored, as the guide warns that the text format varies by release):
- JSON STATUS: `communicators[*]` with `hash`, `size`, `missing_ranks_count`, per rank `collective_counts`
  (summed: the communicator's progress) and `status`; `missing_ranks[*].status.considered_dead`.
- Text STATUS: the communicator table (`Status`, `Errors` columns), the MISMATCH detail ("N ranks have
  launched up to operation K"), INCOMPLETE, and the DEAD section's "Process P on node H managing GPU G".
- MONITOR: the text line `[ts] PEER_DEAD: Process P on node H managing GPU G` and the JSON object
  `{"event": "PEER_DEAD", "peer": {"host", "pid", "cuda_devs"}}`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

RAS_PORT = 28028
CLIENT_PROTOCOL = 2  # the server's own number is accepted whatever it is, as `ncclras` does
READ_LIMIT = 8 * 1024 * 1024


class RasError(Exception):
    """The RAS service is unreachable, too old for a command, or answered something unexpected."""


@dataclass(frozen=True)
class CommStatus:
    comm: str  # the communicator hash (RAS prints it in its text output too)
    size: int | None = None
    ops: int | None = None  # collective operations launched, summed over the ranks RAS reached
    status: str = ""  # RUNNING | INIT | FINALIZE | ABORT
    errors: tuple[str, ...] = ()  # MISMATCH | INCOMPLETE | ERROR
    missing_ranks: int = 0


@dataclass(frozen=True)
class Peer:
    host: str
    pid: int | None
    gpus: tuple[int, ...] = ()


@dataclass
class RasStatus:
    comms: list[CommStatus] = field(default_factory=list)
    dead: list[Peer] = field(default_factory=list)
    unresponsive: list[Peer] = field(default_factory=list)
    format: str = "json"


# --- parsers (pure) --------------------------------------------------------------------------------


def parse_status_json(doc: Any) -> RasStatus:
    out = RasStatus(format="json")
    if not isinstance(doc, dict):
        raise RasError("RAS JSON status is not an object")
    for c in doc.get("communicators") or []:
        if not isinstance(c, dict):
            continue
        comm = str(c.get("hash", c.get("commHash", c.get("id", ""))))
        ops = 0
        seen = False
        statuses = set()
        errors = set()
        for r in c.get("ranks") or []:
            if not isinstance(r, dict):
                continue
            counts = r.get("collective_counts")
            if isinstance(counts, dict):
                ops += sum(v for v in counts.values() if isinstance(v, int))
                seen = True
            st = r.get("status") or {}
            if isinstance(st, dict):
                if st.get("abort_flag"):
                    statuses.add("ABORT")
                elif st.get("finalize_called") or st.get("destroy_flag"):
                    statuses.add("FINALIZE")
                elif st.get("init_state") == 7:  # ncclInProgress
                    statuses.add("INIT")
                elif st.get("init_state") not in (0, None):
                    errors.add("ERROR")
                else:
                    statuses.add("RUNNING")
                if st.get("async_error") not in (0, None):
                    errors.add("ERROR")
        missing = c.get("missing_ranks_count", 0)
        for m in c.get("missing_ranks") or []:
            if not isinstance(m, dict):
                continue
            peer = Peer(str(m.get("host", "")), _int(m.get("pid")), _gpus(m.get("cuda_dev")))
            st = m.get("status") or {}
            if isinstance(st, dict) and st.get("considered_dead"):
                out.dead.append(peer)
            elif isinstance(st, dict) and st.get("unresponsive"):
                out.unresponsive.append(peer)
        if isinstance(missing, int) and missing > 0:
            errors.add("INCOMPLETE")
        status = "RUNNING" if statuses == {"RUNNING"} else "/".join(sorted(statuses))
        out.comms.append(
            CommStatus(
                comm,
                size=_int(c.get("size")),
                ops=ops if seen else None,
                status=status,
                errors=tuple(sorted(errors)),
                missing_ranks=missing if isinstance(missing, int) else 0,
            )
        )
    return out


_TABLE_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s+([A-Z]+)\s+([A-Z]+)\s*$")
_COMM_HEAD = re.compile(r"^\s*#(\d+)-(\d+)\s+\(([0-9a-fA-Fx]+)\)\s+([A-Z]+)")
_LAUNCHED = re.compile(r"(\d+) ranks? ha(?:ve|s) launched up to operation (\d+)")
_PROCESS = re.compile(r"Process (\d+) on node (\S+) managing GPUs? ([\d, ]+)")


def parse_status_text(text: str) -> RasStatus:
    """The text STATUS. Communicators are named `#<group>-<index>` (with their hash where RAS prints
    one); a group row with no detail stands for its communicators with the group's status. Counts are
    known only from a MISMATCH detail (the highest operation any rank launched)."""
    out = RasStatus(format="text")
    groups: dict[str, tuple[str, str]] = {}  # group -> (status, errors)
    details: dict[str, dict[str, Any]] = {}  # "#g-i" -> {hash, errors, ops}
    section = ""
    current: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if stripped in ("Errors", "Warnings", "Job summary") or stripped.startswith("Communicators"):
            section = stripped.split("...")[0]
            current = None
            continue
        if set(stripped) == {"="}:
            continue
        if section == "Communicators" and (m := _TABLE_ROW.match(line)):
            groups[m.group(1)] = (m.group(7), m.group(8))
            continue
        if m := _COMM_HEAD.match(line):
            current = f"#{m.group(1)}-{m.group(2)}"
            d = details.setdefault(current, {"hash": m.group(3), "errors": set(), "ops": None})
            d["errors"].add(m.group(4))
            continue
        if stripped in ("DEAD", "INCOMPLETE", "TIMEOUT", "MISMATCH") and not line.startswith("  " * 2):
            current = stripped if stripped == "DEAD" else None
            continue
        if current is not None and current.startswith("#") and (m := _LAUNCHED.search(line)):
            d = details[current]
            d["ops"] = max(d["ops"] or 0, int(m.group(2)))
            continue
        if current == "DEAD" and (m := _PROCESS.search(line)):
            out.dead.append(Peer(m.group(2), int(m.group(1)), _gpu_list(m.group(3))))
    for group, (status, errors) in sorted(groups.items()):
        named = [k for k in details if k.startswith(f"#{group}-")]
        if not named:
            out.comms.append(CommStatus(f"#{group}", status=status, errors=() if errors == "OK" else (errors,)))
        for key in sorted(named):
            d = details[key]
            errs = tuple(sorted(d["errors"] | ({errors} if errors != "OK" else set())))
            out.comms.append(CommStatus(str(d["hash"]), ops=d["ops"], status=status, errors=errs))
    return out


_MONITOR_TEXT = re.compile(r"PEER_DEAD:\s*Process (\d+) on node (\S+) managing GPUs? ([\d, ]+)")


def parse_monitor(item: str | dict[str, Any]) -> Peer | None:
    """A MONITOR event that declares a peer dead (text line or JSON object); None for anything else."""
    if isinstance(item, dict):
        if item.get("event") != "PEER_DEAD":
            return None
        peer = item.get("peer") or {}
        if not isinstance(peer, dict):
            return None
        return Peer(str(peer.get("host", "")), _int(peer.get("pid")), _gpus(peer.get("cuda_devs")))
    m = _MONITOR_TEXT.search(item)
    return Peer(m.group(2), int(m.group(1)), _gpu_list(m.group(3))) if m else None


@dataclass(frozen=True)
class DiagLine:
    source: str  # host:pid of the process that ran the check
    level: str  # OK | INFO
    text: str


_DIAG = re.compile(r"^(\S+) NCCL DIAG \[(OK|INFO)\]\s+(.*)$")


def parse_diagnostics(text: str) -> list[DiagLine]:
    if text.strip().startswith("BUSY"):
        raise RasError(text.strip())
    return [DiagLine(m.group(1), m.group(2), m.group(3)) for line in text.splitlines() if (m := _DIAG.match(line))]


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _gpus(v: Any) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,)
    if isinstance(v, list):
        return tuple(x for x in v if isinstance(x, int))
    return ()


def _gpu_list(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.split(r"[,\s]+", s.strip()) if x)


# --- the client (asyncio) --------------------------------------------------------------------------


@dataclass
class RasClient:
    host: str = "127.0.0.1"
    port: int = RAS_PORT
    timeout_s: float = 5.0

    async def _open(self, fmt: str | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=READ_LIMIT), self.timeout_s
            )
        except (OSError, TimeoutError) as err:
            raise RasError(f"NCCL RAS not reachable on {self.host}:{self.port} ({err})") from None
        try:
            reply = await self._ask(reader, writer, f"CLIENT PROTOCOL {CLIENT_PROTOCOL}")
            if not reply.upper().startswith("SERVER PROTOCOL"):
                raise RasError(f"unexpected RAS handshake reply {reply!r}")
            if fmt is not None and fmt != "text":
                reply = await self._ask(reader, writer, f"SET FORMAT {fmt}")
                if reply.upper() != "OK":
                    raise RasError(f"RAS refused SET FORMAT {fmt} ({reply!r}): NCCL older than 2.28.7?")
        except BaseException:
            writer.close()
            raise
        return reader, writer

    async def _ask(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: str) -> str:
        writer.write(line.encode() + b"\n")
        await writer.drain()
        try:
            reply = await asyncio.wait_for(reader.readline(), self.timeout_s)
        except TimeoutError:
            raise RasError(f"no RAS reply to {line!r} within {self.timeout_s:g}s") from None
        if not reply:
            raise RasError(f"RAS closed the connection after {line!r}")
        return reply.decode(errors="replace").strip()

    async def _read_all(self, reader: asyncio.StreamReader) -> str:
        chunks = []
        size = 0
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), self.timeout_s)
            except TimeoutError:
                raise RasError(f"RAS output not finished within {self.timeout_s:g}s") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > READ_LIMIT:
                raise RasError("RAS output larger than 8 MiB")
        return b"".join(chunks).decode(errors="replace")

    async def _command(self, fmt: str | None, command: str) -> str:
        reader, writer = await self._open(fmt)
        try:
            writer.write(command.encode() + b"\n")
            await writer.drain()
            return await self._read_all(reader)
        finally:
            writer.close()

    async def status(self, fmt: str = "json", verbose: bool = False) -> RasStatus:
        """One STATUS query, parsed; `fmt="json"` needs NCCL >= 2.28.7 (`status_any` falls back)."""
        text = await self._command(fmt, ("VERBOSE " if verbose else "") + "STATUS")
        if fmt == "json":
            try:
                return parse_status_json(json.loads(text))
            except ValueError:
                raise RasError("RAS STATUS in JSON did not parse") from None
        return parse_status_text(text)

    async def status_any(self) -> RasStatus:
        """JSON where the NCCL is new enough, the text format otherwise."""
        try:
            return await self.status("json")
        except RasError as err:
            if "SET FORMAT" not in str(err):
                raise
        return await self.status("text")

    async def diagnostics(self) -> list[DiagLine]:
        return parse_diagnostics(await self._command(None, "diagnostics"))

    async def monitor(self, fmt: str = "json") -> AsyncIterator[Peer]:
        """Peers declared dead, as MONITOR reports them, until the job (or the connection) ends."""
        reader, writer = await self._open(fmt)
        try:
            writer.write(b"MONITOR\n")
            await writer.drain()
            pending = ""
            depth = 0
            while True:
                raw = await reader.readline()
                if not raw:
                    return
                line = raw.decode(errors="replace")
                if fmt == "json" and (depth > 0 or line.lstrip().startswith("{")):
                    # pretty-printed objects span lines: collect until the braces balance
                    pending += line
                    depth += line.count("{") - line.count("}")
                    if depth > 0:
                        continue
                    try:
                        doc = json.loads(pending)
                    except ValueError:
                        doc = None
                    pending, depth = "", 0
                    peer = parse_monitor(doc) if isinstance(doc, dict) else None
                else:
                    peer = parse_monitor(line)
                if peer is not None:
                    yield peer
        finally:
            writer.close()
