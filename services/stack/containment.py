"""Children that cannot outlive their supervisor, and the clean-up after one that crashed.

- Each child asks the kernel for SIGTERM when its parent dies (`PR_SET_PDEATHSIG`, Linux; through
  ctypes, as the standard library has no `prctl`). The request is made between fork and exec, and
  the child checks its parent afterwards: a supervisor that died in between is noticed too.
- Each child leads its own process group (the supervisor starts it in a new session, so Ctrl-C
  reaches only the supervisor), and signals go to the group: a child's own children go with it.
- The supervisor records every child it starts (pid and the kernel's start time, so a pid the
  system reused is never taken for ours); a new supervisor on the same data directory stops
  whatever a crashed one left running before it starts anything.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` for a child of `parent_pid`: the kernel sends `sig` when that parent dies."""

    def arm() -> None:
        if sys.platform == "linux":
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before the request took effect
            os._exit(1)

    return arm


def start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None when it is not running.
    Field 22 of /proc/PID/stat, read after the command name (which may hold spaces)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


@dataclass(frozen=True)
class Child:
    name: str
    pid: int
    started: str  # start_time(pid) when it was recorded

    def alive(self) -> bool:
        return start_time(self.pid) == self.started


class ChildRecord:
    """The file where a supervisor notes its children (one JSON object per line, rewritten whole)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._children: dict[str, Child] = {}

    def note(self, name: str, pid: int) -> None:
        started = start_time(pid)
        if started is None:
            return  # already gone
        self._children[name] = Child(name, pid, started)
        self._write()

    def forget(self, name: str) -> None:
        if self._children.pop(name, None) is not None:
            self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text("".join(json.dumps(c.__dict__) + "\n" for c in self._children.values()))
        os.replace(tmp, self.path)

    def left_running(self) -> list[Child]:
        """The recorded children still running (a previous supervisor's, when it crashed)."""
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                child = Child(**json.loads(line))
            except (ValueError, TypeError):
                continue  # a torn or foreign line: nothing of ours to stop
            if child.pid != os.getpid() and child.alive():
                out.append(child)
        return out


def signal_group(pid: int, sig: int) -> None:
    """`sig` to the process group `pid` leads (the child and its children), else to `pid` alone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_children(children: list[Child], grace_s: float = 5.0, *, clock: Callable[[], float] = time.monotonic) -> None:
    """SIGTERM each (and SIGCONT, in case it was stopped), SIGKILL what is left after `grace_s`."""
    for child in children:
        signal_group(child.pid, signal.SIGTERM)
        signal_group(child.pid, signal.SIGCONT)
    deadline = clock() + grace_s
    while clock() < deadline and any(c.alive() for c in children):
        time.sleep(0.05)
    for child in children:
        if child.alive():
            signal_group(child.pid, signal.SIGKILL)


def clean_up_after_crash(record_path: Path, grace_s: float = 5.0) -> list[Child]:
    """Stop what the supervisor that last used `record_path` left running; returns what it stopped."""
    leftovers = ChildRecord(record_path).left_running()
    if leftovers:
        stop_children(leftovers, grace_s)
    with contextlib.suppress(FileNotFoundError):
        record_path.unlink()
    return leftovers
