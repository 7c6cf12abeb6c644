"""While an analytics query runs in this process, its engine threads run under SCHED_IDLE (Linux).

The engine lowers a query's threads to nice 19 (`os_thread_priority`, where it may: CAP_SYS_NICE),
which still gives them a share of a CPU that ingest wants and lets them finish their time slice
before a woken ingest thread runs. SCHED_IDLE threads run only on a CPU nothing else wants: a waking
ingest thread preempts them at once and counts their CPU as free. The engine has no setting for it,
so while a query runs a watcher finds the threads the engine reniced (nice above this process's)
and moves them to SCHED_IDLE, and moves every one of them back as soon as the engine resets its
nice (the query let it go: the thread returns to the engine's pool, which ingest uses too) and when
the query ends. Python threads are never moved: one holding the GIL at idle priority would stall the
others.

Moving a thread back out of SCHED_IDLE needs the same privilege the engine needs to renice
(CAP_SYS_NICE); without it the engine reniced nothing and nothing is moved.
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


def can_leave_idle() -> bool:
    """Whether a thread of this process may be moved from SCHED_IDLE back to normal at nice 0."""
    if SCHED_IDLE is None or SCHED_OTHER is None or not os.path.exists(f"/proc/{os.getpid()}/task"):
        return False
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or soft >= 20:
        return True
    with open("/proc/self/status") as f:
        caps = next((line.split()[1] for line in f if line.startswith("CapEff:")), "0")
    return bool(int(caps, 16) >> CAP_SYS_NICE & 1)


class IdleWatch:
    """One per process: active while any query runs (`during_query`), idle otherwise."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._idle: set[int] = set()  # threads this watch moved to SCHED_IDLE
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._supported: bool | None = None
        self._delays: Iterator[float] = iter(SCAN_DELAYS_S)

    @property
    def idle_threads(self) -> set[int]:
        with self._lock:
            return set(self._idle)

    @contextlib.contextmanager
    def during_query(self) -> Iterator[None]:
        if not self._start():
            yield
            return
        try:
            yield
        finally:
            self._end()

    def _start(self) -> bool:
        with self._lock:
            if self._supported is None:
                self._supported = can_leave_idle()
            if not self._supported:
                return False
            self._users += 1
            self._delays = iter(SCAN_DELAYS_S)  # scan soon: the new query's threads start now
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch, name="analytics-idle", daemon=True)
                self._thread.start()
            self._wake.notify_all()
            return True

    def _end(self) -> None:
        with self._lock:
            self._users -= 1
            self._sweep(stopping=self._users == 0)
            self._wake.notify_all()

    def _watch(self) -> None:
        with self._lock:
            while True:
                if self._users == 0:
                    self._thread = None
                    return
                self._wake.wait(next(self._delays, SCAN_EVERY_S))
                if self._users == 0:
                    continue
                self._sweep(stopping=False)

    def _sweep(self, *, stopping: bool) -> None:
        """Under the lock: move the query threads to SCHED_IDLE, and back those that are not (any more)."""
        assert SCHED_IDLE is not None and SCHED_OTHER is not None
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())
        python = {t.native_id for t in threading.enumerate()}
        seen: set[int] = set()
        for tid, nice, policy in threads():
            seen.add(tid)
            query = nice > base and tid not in python and not stopping
            if query and policy != SCHED_IDLE:
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setscheduler(tid, SCHED_IDLE, os.sched_param(0))
                    self._idle.add(tid)
            elif not query and tid in self._idle:
                self._leave_idle(tid)
        self._idle &= seen  # threads that ended

    def _leave_idle(self, tid: int) -> None:
        assert SCHED_OTHER is not None
        try:
            os.sched_setscheduler(tid, SCHED_OTHER, os.sched_param(0))
        except ProcessLookupError:
            pass
        except PermissionError:  # cannot happen where can_leave_idle(); say so rather than stall quietly
            log.error("cannot move an engine thread out of SCHED_IDLE", thread=tid)
        self._idle.discard(tid)


WATCH = IdleWatch()
