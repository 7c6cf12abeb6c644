"""The analytics door: a few query slots of their own, a bounded queue, never the writer's thread.

Each slot is an analytics session (analytics.py) with a thread of its own, so a heavy query waits
for, and uses, only its slot, while ingest keeps its session and its writer thread. A query that
finds every slot busy waits in a queue of `queue_limit`; beyond that, or after `queue_wait_s`, it is
refused at once with "busy: N running, M queued", which a client can act on (retry later), instead
of piling up behind the others until its request times out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from services.warehouse.analytics import AnalyticsSession, Limits, confined_query
from services.warehouse.backend import WarehouseError
from services.warehouse.confine import ReadOnlyViolation

QUEUE_LIMIT = 4
QUEUE_WAIT_S = 10.0


class Busy(ReadOnlyViolation):
    """Every query slot is taken and the queue is full (or the wait ran out); try again shortly."""


@dataclass(frozen=True)
class Answer:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool

    def as_dict(self) -> dict[str, Any]:
        return {"columns": self.columns, "types": self.types, "rows": self.rows, "truncated": self.truncated}


class SqlDoor:
    def __init__(
        self,
        sessions: list[AnalyticsSession],
        *,
        queue_limit: int = QUEUE_LIMIT,
        queue_wait_s: float = QUEUE_WAIT_S,
    ) -> None:
        if not sessions:
            raise ValueError("the door needs at least one analytics session")
        self.limits: Limits = sessions[0].limits
        self.queue_limit = queue_limit
        self.queue_wait_s = queue_wait_s
        self._sessions = sessions
        self._free: asyncio.Queue[AnalyticsSession] | None = None
        self._pool = ThreadPoolExecutor(max_workers=len(sessions), thread_name_prefix="analytics")
        self.running = 0
        self.queued = 0

    @property
    def slots(self) -> int:
        return len(self._sessions)

    def _free_sessions(self) -> asyncio.Queue[AnalyticsSession]:
        if self._free is None:  # made on first use, inside the loop that serves the queries
            self._free = asyncio.Queue()
            for session in self._sessions:
                self._free.put_nowait(session)
        return self._free

    def _busy(self, why: str) -> Busy:
        return Busy(
            f"busy: {self.running} of {self.slots} query slots running, {self.queued} queued{why}; try again shortly"
        )

    async def _acquire(self) -> AnalyticsSession:
        free = self._free_sessions()
        if free.empty() and self.queued >= self.queue_limit:
            raise self._busy(f" (the queue holds {self.queue_limit})")
        self.queued += 1
        try:
            return await asyncio.wait_for(free.get(), self.queue_wait_s)
        except TimeoutError:
            raise self._busy(f"; waited {self.queue_wait_s:g} s for a slot") from None
        finally:
            self.queued -= 1

    async def answer(self, sql: str, max_rows: int) -> Answer:
        """Check and run one query in a slot; ReadOnlyViolation (Busy included) or WarehouseError."""
        max_rows = max(0, max_rows)
        session = await self._acquire()
        self.running += 1
        try:
            result = await self._in_slot(lambda: confined_query(session, sql, max_rows=max_rows))
        except WarehouseError as exc:
            raise WarehouseError(session.limits.explain(str(exc))) from None
        finally:
            self.running -= 1
            self._free_sessions().put_nowait(session)
        rows = result.rows[:max_rows]
        return Answer(result.columns, result.types, rows, len(result.rows) > len(rows))

    async def _in_slot(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for session in self._sessions:
            with contextlib.suppress(Exception):
                session.close()


def open_door(
    warehouse: Any,
    *,
    sql_url: str | None = None,
    slots: int = 1,
    queue_limit: int = QUEUE_LIMIT,
    queue_wait_s: float = QUEUE_WAIT_S,
    limits: Limits | None = None,
) -> SqlDoor:
    """A door with `slots` analytics sessions on `warehouse` (a Warehouse), or, given `sql_url`, on
    that server as its restricted user."""
    from services.warehouse.analytics import ServerAnalytics

    limits = limits or Limits()
    sessions: list[AnalyticsSession] = []
    try:
        for _ in range(max(1, slots)):
            sessions.append(ServerAnalytics(sql_url, limits) if sql_url else warehouse.open_analytics(limits))
    except Exception:
        for session in sessions:
            session.close()
        raise
    return SqlDoor(sessions, queue_limit=queue_limit, queue_wait_s=queue_wait_s)
