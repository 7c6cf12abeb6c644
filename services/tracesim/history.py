"""Recorded history as a trace: the jobs submitted in a window, the quota set then in force, the fleet.

The queries are read-only SQL on the warehouse's audit log (`events`) and `gpu_inventory`; the caller
hands in how to run one (through the recorder that holds chDB, or directly). Folding the rows into
TraceJobs is pure (`fold_jobs`), so it is tested on its own.

How a job's duration is taken (the simulator re-runs it from scratch under the other quota set):
- it ran from each JobScheduled/JobResumed to the next JobPreempted/JobSuspended/JobRequeued or its end;
- work a preemption threw away (`lost_work_gpu_s`) is not progress; after a requeue (a fault) only
  the whole checkpoint intervals of that run are kept (all of it is lost without checkpoints);
- completed, failed and cancelled jobs: the progress they made (a failed job held its GPUs that long);
- still running at the window's end: the progress so far, as if it completed at the window's end
  (a lower bound; counted in `running_at_end`);
- never started by the window's end: its `expected_duration_s` when the user gave one, else it is
  left out (counted in `pending_skipped`), as are jobs that finished without ever running.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from events import (
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobSpec,
    JobSubmitted,
    JobSuspended,
    PriorityClass,
    TeamQuotaSet,
)
from events.upcast import lineage
from services.tracesim.quotas import TeamQuota
from services.tracesim.trace import TraceError, TraceJob

# Runs one read-only query; returns (rows, truncated): truncated when the answer was cut short.
Query = Callable[[str], tuple[list[list[Any]], bool]]

PAGE = 2000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.I)

_START = lineage(JobScheduled.ce_type()) | lineage(JobResumed.ce_type())  # rows recorded as v1 and as v2
_PAUSE = {JobPreempted.ce_type(), JobSuspended.ce_type(), JobRequeued.ce_type()}
_END = {JobCompleted.ce_type(), JobFailed.ce_type(), JobCancelled.ce_type()}


def parse_since(text: str) -> float:
    """`7d`, `36h`, `90m`, `2w`, `600s` as seconds."""
    m = _SINCE.match(text or "")
    if not m or float(m.group(1)) <= 0:
        raise TraceError(f"--since {text!r}: use a positive number and a unit s, m, h, d or w (e.g. 7d, 36h)")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


@dataclass(frozen=True)
class Submitted:
    job_id: str
    at: float
    spec: JobSpec


@dataclass(frozen=True)
class Lifecycle:
    """One recorded lifecycle event of a job: its type, time and (preemptions) the work it threw away."""

    job_id: str
    type: str
    at: float
    lost_work_gpu_s: float = 0.0


@dataclass
class Loaded:
    jobs: list[TraceJob]
    window_start: float
    window_end: float
    completed: int = 0
    ended_early: int = 0  # failed or cancelled after running
    running_at_end: int = 0
    pending_estimated: int = 0
    pending_skipped: int = 0
    never_ran: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "jobs": len(self.jobs),
            "completed": self.completed,
            "failed_or_cancelled": self.ended_early,
            "running_at_end": self.running_at_end,
            "pending_estimated": self.pending_estimated,
            "pending_skipped": self.pending_skipped,
            "finished_without_running": self.never_ran,
        }


def _kept(ran: float, checkpoint_s: float | None) -> float:
    """Progress that survives a fault after running `ran` seconds: whole checkpoint intervals."""
    if not checkpoint_s:
        return 0.0
    return (ran // checkpoint_s) * checkpoint_s


def fold_jobs(submitted: list[Submitted], lifecycle: list[Lifecycle], start: float, end: float) -> Loaded:
    """TraceJobs (submit times relative to the first submit) from the recorded facts, ordered by time."""
    by_job: dict[str, list[Lifecycle]] = {}
    for e in lifecycle:
        by_job.setdefault(e.job_id, []).append(e)
    out = Loaded([], start, end)
    first = min((s.at for s in submitted), default=start)
    for s in sorted(submitted, key=lambda s: (s.at, s.job_id)):
        gpus = s.spec.total_gpus
        progress = 0.0
        since: float | None = None
        ended: str | None = None
        for e in by_job.get(s.job_id, []):
            if e.type in _START and since is None:
                since = e.at
            elif e.type in _PAUSE or e.type in _END:
                if since is not None:
                    ran = max(e.at - since, 0.0)
                    if e.type == JobPreempted.ce_type():
                        ran = max(ran - e.lost_work_gpu_s / gpus, 0.0)
                    elif e.type == JobRequeued.ce_type():
                        ran = _kept(ran, s.spec.checkpoint_interval_s)
                    progress += ran
                    since = None
                if e.type in _END:
                    ended = e.type
                    if e.type == JobCompleted.ce_type():
                        out.completed += 1
                    elif progress > 0:
                        out.ended_early += 1
                    break
        ran_ever = progress > 0 or since is not None
        if not ended and since is not None:
            progress += max(end - since, 0.0)
            out.running_at_end += 1
        elif not ended and not ran_ever:
            if s.spec.expected_duration_s:
                progress = s.spec.expected_duration_s
                out.pending_estimated += 1
            else:
                out.pending_skipped += 1
                continue
        if progress <= 0:
            if ended:
                out.never_ran += 1
                if ended == JobCompleted.ce_type():  # completed instantly: not worth simulating
                    out.completed -= 1
            else:
                out.pending_skipped += 1
            continue
        out.jobs.append(
            TraceJob(
                id=s.job_id,
                submit_s=s.at - first,
                duration_s=progress,
                gpus=gpus,
                team=s.spec.team,
                priority=PriorityClass(s.spec.priority),
                gpu_model=s.spec.gpu_model,
                preemptible=s.spec.preemptible,
                checkpoint_interval_s=s.spec.checkpoint_interval_s,
            )
        )
    if out.running_at_end:
        out.notes.append(
            f"{out.running_at_end} job(s) still running at the window's end: their run so far is their duration"
        )
    if out.pending_skipped:
        out.notes.append(f"{out.pending_skipped} job(s) never started and gave no expected_duration_s: left out")
    return out


def current_quotas(bodies: list[str]) -> dict[str, TeamQuota]:
    """The latest TeamQuotaSet of each team (bodies in recorded order)."""
    out: dict[str, TeamQuota] = {}
    for body in bodies:
        q = msgspec.json.decode(body, type=TeamQuotaSet)
        out[q.team] = TeamQuota(q.team, q.pool, q.guaranteed_gpus, q.borrow_limit, q.lend_limit, q.weight, q.critical)
    return out


def _all(query: Query, sql: str) -> list[list[Any]]:
    """Every row of an ORDER BY query, a page at a time (the recorder answers at most so many)."""
    rows: list[list[Any]] = []
    while True:
        page, truncated = query(f"{sql} LIMIT {PAGE} OFFSET {len(rows)}")
        rows += page
        if not page or (len(page) < PAGE and not truncated):
            return rows


def _ms(ts: float) -> str:
    return f"fromUnixTimestamp64Milli(toInt64({round(ts * 1000)}), 'UTC')"


def _str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class History:
    loaded: Loaded
    quotas: dict[str, TeamQuota]
    fleet_gpus: int
    gpus_per_node: int
    gpu_model: str | None = None  # the model most of the recorded fleet's GPUs are


def load_history(query: Query, start: float, end: float) -> History:
    """Jobs submitted in [start, end), the quotas in force at `end` and the recorded fleet."""
    # A warehouse never migrated has no `events` table; an idle one has no rows: both are "no data".
    tables = query("EXISTS TABLE events")[0]  # analytics SQL may not read `system`
    recorded = query("SELECT count() FROM events")[0] if tables and int(tables[0][0]) else []
    if not recorded or not int(recorded[0][0]):
        raise TraceError(
            "the warehouse holds no recorded events yet; run the stack (`chamber up`) so the recorder "
            "stores job history, or point --data-dir / --clickhouse-url at a warehouse that has some"
        )
    # `stream` leads the table's sort key, so naming it narrows the scan to the jobs' history.
    window = f"stream = 'JOBS' AND at >= {_ms(start)} AND at < {_ms(end)}"
    sub_rows = _all(
        query,
        "SELECT job_id, toUnixTimestamp64Milli(at), JSONExtractRaw(body, 'spec') FROM events "
        f"WHERE type = {_str(JobSubmitted.ce_type())} AND {window} ORDER BY at, job_id, event_id",
    )
    seen: set[str] = set()
    submitted: list[Submitted] = []
    for job_id, at_ms, spec in sub_rows:
        if job_id not in seen:  # a redelivered submit the table has not collapsed yet
            seen.add(job_id)
            submitted.append(Submitted(job_id, int(at_ms) / 1000, msgspec.json.decode(spec, type=JobSpec)))
    if not submitted:
        last = query(f"SELECT max(at) FROM events WHERE type = {_str(JobSubmitted.ce_type())}")[0]
        hint = f"; the latest recorded submit was at {last[0][0]} UTC" if last and last[0][0] else ""
        raise TraceError(f"no jobs were submitted in the window (--since){hint}; widen --since")
    types = ", ".join(_str(t) for t in sorted(_START | _PAUSE | _END))
    life_rows = _all(
        query,
        "SELECT job_id, type, toUnixTimestamp64Milli(at), JSONExtractFloat(body, 'lost_work_gpu_s') FROM events "
        f"WHERE stream = 'JOBS' AND type IN ({types}) AND at >= {_ms(start)} AND at <= {_ms(end)} "
        f"AND job_id IN (SELECT job_id FROM events WHERE type = {_str(JobSubmitted.ce_type())} AND {window}) "
        "ORDER BY job_id, at, stream_seq, event_id",
    )
    lifecycle, ids = [], set()
    for job_id, type_, at_ms, lost in life_rows:
        key = (job_id, type_, at_ms)
        if key not in ids:
            ids.add(key)
            lifecycle.append(Lifecycle(job_id, type_, int(at_ms) / 1000, float(lost or 0.0)))
    loaded = fold_jobs(submitted, lifecycle, start, end)
    if not loaded.jobs:
        raise TraceError(
            f"{len(submitted)} job(s) were submitted in the window but none ran or gave an expected duration; "
            "nothing to replay"
        )
    quota_rows = _all(
        query,
        f"SELECT body FROM events WHERE stream = 'QUOTA' AND type = {_str(TeamQuotaSet.ce_type())} AND at < {_ms(end)} "
        "ORDER BY at, stream_seq, event_id",
    )
    quotas = current_quotas([r[0] for r in quota_rows])
    fleet = query("SELECT cluster, node, count() FROM gpu_inventory FINAL GROUP BY cluster, node")[0]
    gpus = sum(int(r[2]) for r in fleet)
    per_node = max((int(r[2]) for r in fleet), default=0)
    models = query("SELECT model, count() AS n FROM gpu_inventory FINAL GROUP BY model ORDER BY n DESC, model")[0]
    return History(loaded, quotas, gpus, per_node, str(models[0][0]) if models and models[0][0] else None)


def one_model(jobs: list[TraceJob], model: str) -> tuple[list[TraceJob], int]:
    """The simulated fleet is one GPU model: a job that asked for another one runs on it (counted)."""
    other = sum(1 for j in jobs if j.gpu_model and j.gpu_model != model)
    return [replace(j, gpu_model=None) if j.gpu_model and j.gpu_model != model else j for j in jobs], other
