"""The priority of an analytics query's engine threads in this process: tidied when queries end, and
under SCHED_IDLE while one runs when asked (`Limits.idle`, off by default; Linux).

The engine lowers a query's threads to nice 19 (`os_thread_priority`, where it may: CAP_SYS_NICE),
which still gives them a share of a CPU that ingest wants, and a woken ingest thread may wait behind
them. SCHED_IDLE threads run only on a CPU nothing else wants: a woken ingest thread preempts them at
once, and the scheduler counts their CPU as free when it places one. The engine has no setting for
it, so while a query runs a watcher finds the threads the engine reniced (nice above this process's)
and moves them to SCHED_IDLE, and moves each back as soon as the engine resets its nice (the query
let it go: the thread returns to the engine's pool, which ingest uses too).

When the last query ends, every engine thread is made normal again: back from SCHED_IDLE, and back
to this process's nice. The engine resets the nice of the threads it reniced, but a pool thread
that a query thread started inherits nice 19 and keeps it (seen with `max_threads` above 1), so
ingest work would later run on it at nice 19. This process uses SCHED_IDLE and positive nice values
for nothing else. Python threads are never touched: one holding the GIL at idle priority would stall
the others.

Moving a thread back needs the privilege the engine needs to renice (CAP_SYS_NICE); without it the
engine renices nothing and nothing here runs.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections.abc import Iterator

from services.runtime.logs import get_logger

log = get_logger("chamber.warehouse.idle_threads")

SCHED_IDLE: int | None = getattr(os, "SCHED_IDLE", None)
SCHED_OTHER: int | None = getattr(os, "SCHED_OTHER", None)
CAP_SYS_NICE = 23
# The first scans come soon after a query starts (its threads are attached then), later ones rarely.
SCAN_DELAYS_S = (0.005, 0.01, 0.02, 0.05)
SCAN_EVERY_S = 0.1


def threads() -> Iterator[tuple[int, int, int]]:
    """(thread id, nice, scheduling policy) of each thread of this process."""
    task_dir = f"/proc/{os.getpid()}/task"
    for name in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{name}/stat", "rb") as f:
                text = f.read()
        except OSError:  # the thread ended
            continue
        fields = text[text.rindex(b")") + 2 :].split()
        yield int(name), int(fields[16]), int(fields[38])


def can_make_normal() -> bool:
    """Whether this process may move its threads back from SCHED_IDLE and from a positive nice."""
    if SCHED_IDLE is None or SCHED_OTHER is None or not os.path.exists(f"/proc/{os.getpid()}/task"):
        return False
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or soft >= 20:
        return True
    with open("/proc/self/status") as f:
        caps = next((line.split()[1] for line in f if line.startswith("CapEff:")), "0")
    return bool(int(caps, 16) >> CAP_SYS_NICE & 1)


class QueryThreads:
    """One per process: watches while any query runs (`during_query`), tidies up when the last ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._users = 0
        self._idle_users = 0  # queries that want their threads under SCHED_IDLE
        self._thread: threading.Thread | None = None
        self._supported: bool | None = None
        self._delays: Iterator[float] = iter(SCAN_DELAYS_S)

    @contextlib.contextmanager
    def during_query(self, *, idle: bool) -> Iterator[None]:
        started = self._start(idle)
        try:
            yield
        finally:
            if started:
                self._end(idle)

    def _start(self, idle: bool) -> bool:
        with self._lock:
            if self._supported is None:
                self._supported = can_make_normal()
            if not self._supported:
                return False
            self._users += 1
            self._idle_users += idle
            if idle:
                self._delays = iter(SCAN_DELAYS_S)  # scan soon: the new query's threads start now
                if self._thread is None:
                    self._thread = threading.Thread(target=self._watch, name="analytics-idle", daemon=True)
                    self._thread.start()
                self._wake.notify_all()
            return True

    def _end(self, idle: bool) -> None:
        with self._lock:
            self._users -= 1
            self._idle_users -= idle
            self._sweep()
            self._wake.notify_all()

    def _watch(self) -> None:
        with self._lock:
            while self._idle_users:
                self._wake.wait(next(self._delays, SCAN_EVERY_S))
                if self._idle_users:
                    self._sweep()
            self._thread = None

    def _sweep(self) -> None:
        """Under the lock. While queries run: the reniced threads to SCHED_IDLE (if wanted), the others
        back from it. When none runs: every thread back to normal and to this process's nice."""
        assert SCHED_IDLE is not None and SCHED_OTHER is not None
        try:
            base = os.getpriority(os.PRIO_PROCESS, os.getpid())
            python = {t.native_id for t in threading.enumerate()}
            for tid, nice, policy in threads():
                if tid in python:
                    continue
                reniced = nice > base
                with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
                    if self._users == 0 and reniced:
                        os.setpriority(os.PRIO_PROCESS, tid, base)
                    if reniced and self._idle_users and policy != SCHED_IDLE:
                        os.sched_setscheduler(tid, SCHED_IDLE, os.sched_param(0))
                    elif (not reniced or self._users == 0) and policy == SCHED_IDLE:
                        os.sched_setscheduler(tid, SCHED_OTHER, os.sched_param(0))
        except OSError as exc:  # never fail a query over its threads' priority; say so
            log.error("cannot change the priority of the engine's threads", error=str(exc))


WATCH = QueryThreads()
