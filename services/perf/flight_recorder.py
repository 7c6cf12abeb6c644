"""PyTorch Flight Recorder dumps -> the step table (docs/perf-steps.md, "Converting other traces").

Flight Recorder (`TORCH_NCCL_TRACE_BUFFER_SIZE=N`, `TORCH_NCCL_DUMP_ON_TIMEOUT=1`, and
`TORCH_NCCL_ENABLE_TIMING=1` for `duration_ms`) writes one dump per rank, a pickle (or JSON with the
JSON dump handler) of `{"version", "pg_config", "pg_status", "entries": [...]}`. Each entry is one
collective or point-to-point operation: `pg_id`, `process_group` (name, description),
`collective_seq_id`, `profiling_name` (e.g. `nccl:all_reduce`), `time_created_ns`, `duration_ms`
(None without timing), `state` (`scheduled`, `started`, `completed`), `time_discovered_completed_ns`.

The dump has no step numbers. A step ends where the rank's *closing* collective of one process group
completes (by default the data-parallel gradient all-reduce: pass its group and name); the step runs
from the previous closing collective's completion. Its `step` is that collective's
`collective_seq_id`, which is the same on every rank of the group, so ranks line up even when their
ring buffers start at different entries. `comm_wait_s` is the summed `duration_ms` of the group's
operations issued after the previous closing collective, up to and with this one: a collective's
GPU time includes the wait for late peers, so a slow rank waits little and its peers wait long.
Without `duration_ms` only the step's times are known.

    python -m services.perf.flight_recorder --job JOB [--pg NAME] [--closing nccl:all_reduce] DUMP... > steps.jsonl

Each DUMP's rank is the number at the end of its file name (Flight Recorder names them
`<prefix><rank>`, by default `/tmp/nccl_trace_rank_<rank>`).
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import pickle
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

CLOSING = "nccl:all_reduce"
_RANK = re.compile(r"(\d+)(?:\.\w+)?$")


class DumpError(ValueError):
    """A file that is not a Flight Recorder dump; the message names it."""


class _PlainUnpickler(pickle.Unpickler):
    """A dump holds dicts, lists, strings and numbers only: anything that names a class or a function
    (which a hostile pickle would use to run code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a Flight Recorder dump names no class, but this one names {module}.{name}")


def read_dump(path: Path) -> dict[str, Any]:
    """One rank's dump, pickle or JSON."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DumpError(f"{path}: {exc.strerror}") from None
    try:
        doc = json.loads(raw) if raw.lstrip()[:1] == b"{" else _PlainUnpickler(io.BytesIO(raw)).load()
    except (ValueError, pickle.UnpicklingError, EOFError) as exc:
        raise DumpError(f"{path}: not a Flight Recorder dump ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise DumpError(f"{path}: not a Flight Recorder dump (no `entries` list)")
    return doc


def rank_of(path: Path) -> int:
    match = _RANK.search(path.name)
    if match is None:
        raise DumpError(f"{path}: the file name does not end in the rank (nccl_trace_rank_<rank>)")
    return int(match.group(1))


def _in_group(entry: Mapping[str, Any], pg: str | None) -> bool:
    if pg is None:
        return True
    group = entry.get("process_group") or ()
    return pg == str(entry.get("pg_id")) or pg in [str(g) for g in group]


def _completed_ns(entry: Mapping[str, Any]) -> int | None:
    """When the operation completed: its creation plus its GPU time, else when the watchdog saw it
    complete (later by up to the watchdog's poll)."""
    if entry.get("state") != "completed":
        return None
    duration = entry.get("duration_ms")
    if duration is not None:
        return int(entry["time_created_ns"] + duration * 1e6)
    done = entry.get("time_discovered_completed_ns")
    return int(done) if done else None


def rank_steps(
    dump: Mapping[str, Any], *, job: str, rank: int, pg: str | None = None, closing: str = CLOSING
) -> list[dict[str, Any]]:
    """One rank's step rows (docs/perf-steps.md "The step table"), in step order."""
    entries = sorted((e for e in dump["entries"] if _in_group(e, pg)), key=lambda e: e["time_created_ns"])
    ends = [(e, t) for e in entries if e.get("profiling_name") == closing and (t := _completed_ns(e)) is not None]
    rows = []
    for (start, start_ns), (end, end_ns) in itertools.pairwise(ends):
        # the operations issued after the last step's closing collective, up to and with this one's
        inside = [e for e in entries if start["time_created_ns"] < e["time_created_ns"] <= end["time_created_ns"]]
        durations = [e.get("duration_ms") for e in inside]
        row: dict[str, Any] = {
            "job": job,
            "rank": rank,
            "step": int(end["collective_seq_id"]),
            "step_start_s": start_ns / 1e9,
            "step_end_s": end_ns / 1e9,
        }
        if durations and all(d is not None for d in durations):
            row["comm_wait_s"] = sum(durations) / 1e3
        rows.append(row)
    return rows


def steps_from_dumps(
    dumps: Mapping[int, Mapping[str, Any]], *, job: str, pg: str | None = None, closing: str = CLOSING
) -> list[dict[str, Any]]:
    """Every rank's step rows, by step then rank."""
    rows = [r for rank, dump in dumps.items() for r in rank_steps(dump, job=job, rank=rank, pg=pg, closing=closing)]
    return sorted(rows, key=lambda r: (r["step"], r["rank"]))


def convert(paths: Iterable[Path], *, job: str, pg: str | None = None, closing: str = CLOSING) -> list[dict[str, Any]]:
    return steps_from_dumps({rank_of(p): read_dump(p) for p in paths}, job=job, pg=pg, closing=closing)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="PyTorch Flight Recorder dumps -> a JSONL step table")
    parser.add_argument("dumps", nargs="+", type=Path, help="one dump per rank (file names end in the rank)")
    parser.add_argument("--job", required=True, help="the job id to put in the table")
    parser.add_argument("--pg", help="the process group whose collective closes a step (pg_id or name)")
    parser.add_argument("--closing", default=CLOSING, help=f"the collective that closes a step (default {CLOSING})")
    args = parser.parse_args(argv)
    try:
        rows = convert(args.dumps, job=args.job, pg=args.pg, closing=args.closing)
    except DumpError as exc:
        return refuse(str(exc))
    return print_rows(rows, f"no two completed {args.closing} operations in any dump")


def refuse(why: str) -> int:
    print(f"error: {why}", file=sys.stderr)
    return 2


def print_rows(rows: list[dict[str, Any]], why_none: str) -> int:
    """The step table as JSON lines on stdout (what `chamber perf replay --steps` reads)."""
    if not rows:
        return refuse(f"{why_none}: no step to write")
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
