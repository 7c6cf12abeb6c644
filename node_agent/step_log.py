"""The agent's reader of a job's JSONL step log (chamber_hooks.StepLog writes it; docs/perf-steps.md):
each interval, the complete lines appended since the last read become one `RankStepTimings` per job
(published on chamber.telemetry.steps.<cluster>.<node>). A line that is not a step row is skipped and
counted, never fatal; a file that shrank (rotated, truncated) is read again from its start."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from events.steps import RankStep, RankStepTimings

MAX_READ = 4 * 1024 * 1024  # per interval: a log that grows faster is read over several intervals
_FIELDS = set(RankStep.__struct_fields__)


@dataclass
class StepLogTail:
    job: str
    path: Path
    offset: int = 0
    skipped: int = 0
    accept: Callable[[dict[str, Any]], bool] | None = None  # rows of this node only (step_log_watch.py)
    # A log the job's workload names is the job's whatever `job` its rows say (a pod's hook may not
    # know the Chamber job id); a log given on the command line keeps only rows of its job.
    any_job: bool = False

    def read(self) -> list[RankStep]:
        try:
            size = self.path.stat().st_size
            if size < self.offset:
                self.offset = 0
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read(MAX_READ)
        except OSError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []  # no complete line yet
        self.offset += end + 1
        rows = []
        for line in chunk[: end + 1].splitlines():
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                if (not self.any_job and doc.get("job", self.job) != self.job) or (
                    self.accept is not None and not self.accept(doc)
                ):
                    continue
                rows.append(msgspec.convert({k: v for k, v in doc.items() if k in _FIELDS}, RankStep))
            except (ValueError, AttributeError, msgspec.ValidationError):
                self.skipped += 1
        return rows

    def event(self, cluster: str, node: str, now: float) -> RankStepTimings | None:
        rows = self.read()
        if not rows:
            return None
        return RankStepTimings(cluster=cluster, node=node, job_id=self.job, observed_at=now, steps=rows, source="log")
