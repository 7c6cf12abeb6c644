"""The queued jobs as numpy columns, kept beside `Derived.queued` by the fold once a full cycle first
asks for them: a full cycle then orders the queue and answers the jobs whose shape already failed
column-wise, instead of reading every queued job's entry in Python (at 100,000 pending jobs that read
was most of a cycle). Built from the entries, so it holds exactly what `queued_entries` holds; its
rows are in no particular order (a job that leaves frees its row for the next that joins)."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import numpy as np

from services.scheduler.core.policy import QueueKey

QueueEntry = tuple[QueueKey, int, float]  # as state.QueueEntry: key, shape number, queued since


class QueueTable:
    def __init__(self, entries: dict[str, QueueEntry]) -> None:
        n = len(entries)
        size = max(64, 2 * n)
        self.row: dict[str, int] = dict(zip(entries, range(n), strict=True))
        self.free: list[int] = []
        self.end = n  # rows in use or freed: live rows are below it
        keys = np.fromiter(map(itemgetter(0), entries.values()), dtype=object, count=n)
        self.keys = _grown(keys, size)
        self.ids = _grown(np.fromiter(entries, dtype=object, count=n), size)
        # as float64, like the columns sorted_queue builds
        self.rank, self.share, self.submitted = (
            _grown(np.fromiter(map(itemgetter(i), keys), dtype=np.float64, count=n), size) for i in range(3)
        )
        self.since = _grown(np.fromiter(map(itemgetter(2), entries.values()), dtype=np.float64, count=n), size)
        self.shape = _grown(np.fromiter(map(itemgetter(1), entries.values()), dtype=np.intp, count=n), size)
        self.live = _grown(np.ones(n, dtype=bool), size)

    def add(self, jid: str, entry: QueueEntry) -> None:
        """The job joins the queue (or its entry is written again)."""
        r = self.row.get(jid)
        if r is None:
            r = self.row[jid] = self.free.pop() if self.free else self._new_row()
        key, sid, since = entry
        self.keys[r], self.ids[r], self.shape[r], self.since[r], self.live[r] = key, jid, sid, since, True
        self.rank[r], self.share[r], self.submitted[r] = key[0], key[1], key[2]

    def drop(self, jid: str) -> None:
        """The job left the queue."""
        r = self.row.pop(jid, None)
        if r is not None:
            # its key let go (a tuple the collector would otherwise keep walking: at 80,000 placements
            # in a cycle that was a full collection more); the row is taken again by the next to join
            self.live[r], self.keys[r], self.ids[r] = False, None, None
            self.free.append(r)

    def _new_row(self) -> int:
        if self.end == len(self.live):
            grown = 2 * len(self.live)
            for name in ("keys", "ids", "rank", "share", "submitted", "since", "shape", "live"):
                setattr(self, name, _grown(getattr(self, name), grown))
        self.end += 1
        return self.end - 1

    def rows(self) -> Any:
        """The live rows' numbers, in row order."""
        return np.flatnonzero(self.live[: self.end])


def _grown(column: Any, size: int) -> Any:
    """The column with room for `size` rows (the new ones empty: None, 0 or False)."""
    new = np.empty(size, dtype=object) if column.dtype == object else np.zeros(size, dtype=column.dtype)
    new[: len(column)] = column
    return new
