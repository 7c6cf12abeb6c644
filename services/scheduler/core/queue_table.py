"""The queued jobs as numpy columns, kept beside `Derived.queued` by the fold once a full cycle first
asks for them: a full cycle then orders the queue and answers the jobs whose shape already failed
column-wise, instead of reading every queued job's entry in Python (at 100,000 pending jobs that read
was most of a cycle). Built from the entries, so it holds exactly what `queued_entries` holds; its
rows are in no particular order (a job that leaves frees its row for the next that joins)."""

from __future__ import annotations

from typing import Any

import numpy as np

from services.scheduler.core.policy import QueueKey

QueueEntry = tuple[QueueKey, int, float]  # as state.QueueEntry: key, shape number, queued since


class QueueTable:
    def __init__(self, entries: dict[str, QueueEntry]) -> None:
        size = max(64, 2 * len(entries))
        self.row: dict[str, int] = {}
        self.free: list[int] = []
        self.end = 0  # rows in use or freed: live rows are below it
        self.keys = np.empty(size, dtype=object)
        self.ids = np.empty(size, dtype=object)
        self.rank = np.zeros(size)  # as float64, like the columns sorted_queue builds
        self.share = np.zeros(size)
        self.submitted = np.zeros(size)
        self.since = np.zeros(size)
        self.shape = np.zeros(size, dtype=np.intp)
        self.live = np.zeros(size, dtype=bool)
        for jid, entry in entries.items():
            self.add(jid, entry)

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
            self.live[r] = False
            self.keys[r] = self.ids[r] = None
            self.free.append(r)

    def _new_row(self) -> int:
        if self.end == len(self.live):
            grown = 2 * len(self.live)
            for name in ("keys", "ids", "rank", "share", "submitted", "since", "shape", "live"):
                old = getattr(self, name)
                new = np.zeros(grown, dtype=old.dtype) if old.dtype != object else np.empty(grown, dtype=object)
                new[: len(old)] = old
                setattr(self, name, new)
        self.end += 1
        return self.end - 1

    def rows(self) -> Any:
        """The live rows' numbers, in row order."""
        return np.flatnonzero(self.live[: self.end])
