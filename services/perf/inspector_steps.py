"""NCCL Inspector's JSON output -> the step table (docs/perf-steps.md, "Converting other traces").

Inspector (NCCL's profiler plugin, `NCCL_INSPECTOR_ENABLE=1`, JSON mode: `NCCL_INSPECTOR_PROM_DUMP=0`)
writes one file per process into `NCCL_INSPECTOR_DUMP_DIR`: a stream of JSON objects, one per
collective and communicator, each `{"header": {"id", "rank", "n_ranks", "nnodes"}, "metadata":
{"dump_timestamp_us", "hostname", "pid", ...}, "coll_perf": {"coll", "coll_sn", "coll_msg_size_bytes",
"coll_exec_time_us", "coll_algobw_gbs", "coll_busbw_gbs", ...}}`. With
`NCCL_INSPECTOR_DUMP_VERBOSE=1`, `coll_perf.event_trace_ts` also holds the kernels' start and stop
times (µs).

A step ends with the rank's closing collective (`--coll`, default AllReduce) on one communicator
(`--comm`, its `header.id`; default: the communicator with the most ranks). `step` is its `coll_sn`,
the same on every rank of the communicator. The step ends when its last kernel stopped (verbose
output), else when Inspector wrote the record (`dump_timestamp_us`, later by up to the dump
interval). It starts where the previous one ended. `comm_wait_s` is the summed `coll_exec_time_us`
of the communicator's collectives after the previous closing one, up to and with this one: a
collective's time includes the wait for late peers.

    python -m services.perf.inspector_steps --job JOB [--comm ID] [--coll AllReduce] FILE... > steps.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from services.perf.flight_recorder import print_rows, refuse

CLOSING = "AllReduce"


class InspectorError(ValueError):
    """A file that is not Inspector JSON output; the message names it."""


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of one file, one per line or pretty-printed one after another."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InspectorError(f"{path}: cannot read ({exc})") from None
    decoder, at = json.JSONDecoder(), 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return
        try:
            doc, at = decoder.raw_decode(text, at)
        except ValueError as exc:
            raise InspectorError(f"{path}: not NCCL Inspector JSON ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("coll_perf"), dict) or "header" not in doc:
            raise InspectorError(f"{path}: a JSON object without `header` and `coll_perf` (not Inspector output)")
        yield doc


def _end_s(record: dict[str, Any]) -> float:
    trace = record["coll_perf"].get("event_trace_ts") or {}
    stops = [k["kernel_stop_ts"] for k in trace.get("kernel_events") or [] if k.get("kernel_stop_ts")]
    return (max(stops) if stops else record["metadata"]["dump_timestamp_us"]) / 1e6


def widest_comm(records: Iterable[dict[str, Any]]) -> str:
    """The communicator with the most ranks (ties: the one with most records): the data-parallel one
    in most jobs."""
    ranks: dict[str, int] = {}
    seen: Counter[str] = Counter()
    for r in records:
        comm = str(r["header"]["id"])
        ranks[comm] = max(ranks.get(comm, 0), int(r["header"].get("n_ranks") or 0))
        seen[comm] += 1
    if not ranks:
        raise InspectorError("no Inspector records")
    return max(ranks, key=lambda c: (ranks[c], seen[c]))


def steps_from_records(
    records: list[dict[str, Any]], *, job: str, comm: str | None = None, coll: str = CLOSING
) -> list[dict[str, Any]]:
    """Every rank's step rows on the communicator, by step then rank."""
    comm = comm or widest_comm(records)
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if str(r["header"]["id"]) == comm:
            by_rank.setdefault(int(r["header"]["rank"]), []).append(r)
    rows = []
    for rank, mine in by_rank.items():
        mine.sort(key=lambda r: r["coll_perf"]["coll_sn"])
        ends = [r for r in mine if r["coll_perf"].get("coll") == coll]
        for start, end in itertools.pairwise(ends):
            first, last = start["coll_perf"]["coll_sn"], end["coll_perf"]["coll_sn"]
            inside = [r for r in mine if first < r["coll_perf"]["coll_sn"] <= last]
            rows.append(
                {
                    "job": job,
                    "rank": rank,
                    "step": int(last),
                    "step_start_s": _end_s(start),
                    "step_end_s": _end_s(end),
                    "comm_wait_s": sum(r["coll_perf"]["coll_exec_time_us"] for r in inside) / 1e6,
                }
            )
    return sorted(rows, key=lambda r: (r["step"], r["rank"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="NCCL Inspector JSON output -> a JSONL step table")
    parser.add_argument("files", nargs="+", type=Path, help="Inspector's output files (one per process)")
    parser.add_argument("--job", required=True, help="the job id to put in the table")
    parser.add_argument("--comm", help="the communicator (header.id) whose collective closes a step")
    parser.add_argument("--coll", default=CLOSING, help=f"the collective that closes a step (default {CLOSING})")
    args = parser.parse_args(argv)
    try:
        records = [r for f in args.files for r in read_records(f)]
        rows = steps_from_records(records, job=args.job, comm=args.comm, coll=args.coll)
    except InspectorError as exc:
        return refuse(str(exc))
    return print_rows(rows, f"no two {args.coll} records on one rank of the communicator")


if __name__ == "__main__":
    raise SystemExit(main())
