"""Run a service until SIGTERM/SIGINT, then let it finish the batch in hand and drain.

Two promises to a supervisor:
- It stops within `STOP_GRACE_S` of the signal. Draining is tried first; what has not finished by
  then is abandoned (a thread ends the process, as a blocked event loop could not): an unacked
  message comes back to the next process, so only time is lost, never a message.
- With `$CHAMBER_HEARTBEAT_FILE` set, its event loop touches that file every second. A loop that
  stalls (a handler blocking it, a SIGSTOP) stops touching it, and the supervisor restarts the
  process (`services/stack/supervisor.py`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import math
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn

from services.runtime.logs import get_logger

log = get_logger("chamber.runtime.lifecycle")
ENV_HEARTBEAT_FILE = "CHAMBER_HEARTBEAT_FILE"
ENV_STOP_GRACE = "CHAMBER_STOP_GRACE_S"
STOP_GRACE_S = 4.0  # under the supervisor's 5 s: ours is the exit that logs why
HEARTBEAT_EVERY_S = 1.0


def stop_grace_s(default: float | None = STOP_GRACE_S) -> float | None:
    """The grace from `$CHAMBER_STOP_GRACE_S` (0: wait forever), else `default`."""
    raw = os.environ.get(ENV_STOP_GRACE, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value > 0 and math.isfinite(value) else None


async def run_until_stopped(
    main: Callable[[asyncio.Event], Awaitable[None]], *, grace_s: float | None = STOP_GRACE_S
) -> None:
    """Call `main(stop)`; a signal sets `stop`, which every consumer loop watches. `grace_s`: how
    long after the signal the process may take to stop (None: as long as it needs)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    grace = stop_grace_s(grace_s) if grace_s is not None else None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _request_stop, stop, sig, grace)
    beat = os.environ.get(ENV_HEARTBEAT_FILE)
    heart = asyncio.create_task(_heartbeat(Path(beat))) if beat else None
    try:
        await main(stop)
    finally:
        if heart is not None:
            heart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heart
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def exit_stopped(code: int = 0) -> NoReturn:
    """End a process that has stopped cleanly (its messages acked or handed back, its snapshot saved,
    its warehouse closed) without the interpreter's teardown: finalising every module, and chDB's
    engine shutting down at exit, took up to 2 s on a loaded machine, after a drain that had used
    most of the 5 s. Exit handlers (a span exporter's last flush) still run."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _request_stop(stop: asyncio.Event, sig: signal.Signals, grace_s: float | None) -> None:
    log.info("stopping", signal=sig.name)
    if not stop.is_set() and grace_s is not None:
        timer = threading.Timer(grace_s, _abandon, args=(grace_s,))
        timer.daemon = True  # a process that stopped in time exits without waiting for it
        timer.start()
    stop.set()


def _abandon(grace_s: float) -> None:
    log.warning("did not stop in time; exiting without finishing", grace_s=grace_s)
    sys.stderr.flush()
    os._exit(0)  # the way out of a process whose loop may be blocked


async def _heartbeat(path: Path) -> None:
    """Touch `path` every second while the loop runs (and while stopping: draining is alive)."""
    while True:
        try:
            path.touch()  # noqa: ASYNC240 - one tiny local write a second; a thread per beat would cost more
        except OSError as exc:  # the supervisor's directory went away: nothing to tell
            log.debug("heartbeat not written", error=repr(exc))
        await asyncio.sleep(HEARTBEAT_EVERY_S)
