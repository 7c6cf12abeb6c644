"""One victim group's running jobs as columns of what their victim cost is computed from, kept by the
fold beside `Derived.victims` (state.py): a search computes the group's costs column-wise (numpy)
instead of reading every job of the group, which on a full fleet was most of a gang's search.

The cost (`preemption.victim_cost`) depends on `now` (the time since the last checkpoint), so it is
computed again for each cycle: what is kept is what it is computed from, which changes only when a
job joins or leaves the group, or starts (`JobStarted` moves its checkpoint clock). Rows are in no
particular order (a job that leaves frees its row for the next that joins); the walk sorts.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from services.scheduler.core.state import Job


class CostColumns:
    def __init__(self) -> None:
        self.row: dict[str, int] = {}
        self.free: list[int] = []
        self.ids: list[str | None] = []
        self.jobs: list[Job | None] = []
        self.since = array("d")  # started, else running since (nan: neither, no work to lose)
        self.every = array("d")  # checkpoint interval (0: none)
        self.gpus = array("d")
        self.times = array("q")  # one more than the times the job was preempted before

    def __len__(self) -> int:
        return len(self.row)

    def add(self, job: Job) -> None:
        """The job runs in the group (or its row is written again)."""
        r = self.row.get(job.id)
        since = job.started_at if job.started_at is not None else job.running_since
        every = job.spec.checkpoint_interval_s or 0.0
        if r is None and not self.free:  # a new row at the end
            self.row[job.id] = len(self.ids)
            self.ids.append(job.id)
            self.jobs.append(job)
            self.since.append(_NAN if since is None else since)
            self.every.append(every)
            self.gpus.append(job.gpus)
            self.times.append(1 + job.preemptions)
            return
        if r is None:
            r = self.row[job.id] = self.free.pop()
        self.ids[r], self.jobs[r] = job.id, job
        self.since[r] = _NAN if since is None else since
        self.every[r], self.gpus[r], self.times[r] = every, job.gpus, 1 + job.preemptions

    def started(self, job: Job) -> None:
        """The job's executor started it: its checkpoint clock runs from then."""
        r = self.row.get(job.id)
        if r is not None:
            self.since[r] = _since(job)

    def drop(self, job_id: str) -> None:
        r = self.row.pop(job_id, None)
        if r is not None:
            self.ids[r] = self.jobs[r] = None
            self.free.append(r)

    def costs(self, now: float) -> list[tuple[float, str, Job]]:
        """(victim cost, id, job) of each job of the group: `preemption._costs`' float operations
        in the same order (max(0, now - since), modulo the interval, times GPUs, times `times`)."""
        n = len(self.ids)
        import numpy as np  # here, not at import: `chamber up` and the CLI read this module without numpy

        since = np.frombuffer(self.since, dtype=np.float64, count=n)
        every = np.frombuffer(self.every, dtype=np.float64, count=n)
        d = now - since
        elapsed = np.where(d > 0.0, d, 0.0)  # nan (no start at all): 0.0
        has = every != 0.0
        elapsed = np.where(has, np.remainder(elapsed, np.where(has, every, 1.0)), elapsed)
        cost = elapsed * np.frombuffer(self.gpus, dtype=np.float64, count=n)
        cost = cost * np.frombuffer(self.times, dtype=np.int64, count=n)
        items = zip(cost.tolist(), self.ids, self.jobs, strict=True)
        kept = [item for item in items if item[1] is not None] if self.free else list(items)
        return cast("list[tuple[float, str, Job]]", kept)


_NAN = float("nan")


def _since(job: Job) -> float:
    since = job.started_at if job.started_at is not None else job.running_since
    return float("nan") if since is None else since
