"""Job traces: CSV with `job_id,submit_time_s,duration_s,num_gpus,team` and optional `priority`,
`gpu_model`, `preemptible`, `checkpoint_interval_s`. Bad rows are reported with their line number."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from events import PriorityClass

REQUIRED = ("job_id", "submit_time_s", "duration_s", "num_gpus", "team")
_TRUE = {"1", "true", "yes", "y"}
_FALSE = {"0", "false", "no", "n", ""}


class TraceError(ValueError):
    """The trace cannot be used at all (missing file or columns), or a bad row under --strict."""


@dataclass(frozen=True)
class TraceJob:
    id: str
    submit_s: float
    duration_s: float
    gpus: int
    team: str
    priority: PriorityClass = PriorityClass.NORMAL
    gpu_model: str | None = None
    preemptible: bool = True
    checkpoint_interval_s: float | None = None


@dataclass(frozen=True)
class BadRow:
    line: int
    problem: str


@dataclass(frozen=True)
class Trace:
    jobs: list[TraceJob]
    bad_rows: list[BadRow]

    @property
    def teams(self) -> list[str]:
        return sorted({j.team for j in self.jobs})


def _row(fields: dict[str, str]) -> TraceJob:
    def num(name: str) -> float:
        raw = (fields.get(name) or "").strip()
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{name} is {raw!r}, not a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{name} is {raw!r}, not a finite number")
        return value

    job_id = (fields.get("job_id") or "").strip()
    team = (fields.get("team") or "").strip()
    if not job_id:
        raise ValueError("job_id is empty")
    if not team:
        raise ValueError("team is empty")
    submit, duration, gpus = num("submit_time_s"), num("duration_s"), num("num_gpus")
    if submit < 0:
        raise ValueError(f"submit_time_s is {submit:g}; it must be 0 or more")
    if duration <= 0:
        raise ValueError(f"duration_s is {duration:g}; it must be more than 0")
    if gpus < 1 or gpus != int(gpus):
        raise ValueError(f"num_gpus is {gpus:g}; it must be a whole number of at least 1")
    priority_raw = (fields.get("priority") or "normal").strip().lower() or "normal"
    try:
        priority = PriorityClass(priority_raw)
    except ValueError:
        allowed = ", ".join(p.value for p in PriorityClass)
        raise ValueError(f"priority is {priority_raw!r}; use one of {allowed}") from None
    preemptible_raw = (fields.get("preemptible") or "").strip().lower()
    if preemptible_raw not in _TRUE | _FALSE:
        raise ValueError(f"preemptible is {preemptible_raw!r}; use true or false")
    ckpt_raw = (fields.get("checkpoint_interval_s") or "").strip()
    ckpt = num("checkpoint_interval_s") if ckpt_raw else None
    if ckpt is not None and ckpt <= 0:
        raise ValueError(f"checkpoint_interval_s is {ckpt:g}; it must be more than 0")
    return TraceJob(
        id=job_id,
        submit_s=submit,
        duration_s=duration,
        gpus=int(gpus),
        team=team,
        priority=priority,
        gpu_model=(fields.get("gpu_model") or "").strip() or None,
        preemptible=preemptible_raw in _TRUE or preemptible_raw == "",
        checkpoint_interval_s=ckpt,
    )


def parse(lines: Iterable[str], *, strict: bool = False, source: str = "trace") -> Trace:
    reader = csv.DictReader(lines)
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(f"{source}: missing column(s) {', '.join(missing)}; the header needs {','.join(REQUIRED)}")
    jobs: list[TraceJob] = []
    bad: list[BadRow] = []
    seen: set[str] = set()
    for fields in reader:
        line = reader.line_num
        try:
            job = _row(fields)
            if job.id in seen:
                raise ValueError(f"job_id {job.id!r} appears twice")
        except ValueError as exc:
            if strict:
                raise TraceError(f"{source}:{line}: {exc}") from None
            bad.append(BadRow(line, str(exc)))
            continue
        seen.add(job.id)
        jobs.append(job)
    jobs.sort(key=lambda j: (j.submit_s, j.id))
    return Trace(jobs, bad)


def load(path: Path, *, strict: bool = False, limit: int | None = None) -> Trace:
    try:
        # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name;
        # newline="": the csv module handles CRLF line ends itself
        with path.open(newline="", encoding="utf-8-sig") as f:
            lines = f if limit is None else _head(f, limit + 1)
            return parse(lines, strict=strict, source=str(path))
    except FileNotFoundError:
        raise TraceError(f"trace file {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{path} is not a UTF-8 text (CSV) file: byte {exc.object[exc.start]:#04x} at offset {exc.start}"
        ) from None
    except (IsADirectoryError, PermissionError) as exc:
        raise TraceError(f"cannot read trace file {path}: {exc.strerror}") from None
    except csv.Error as exc:
        raise TraceError(f"{path} is not a CSV file: {exc}") from None


def _head(f: Iterable[str], n: int) -> Iterable[str]:
    for i, line in enumerate(f):
        if i >= n:
            return
        yield line
