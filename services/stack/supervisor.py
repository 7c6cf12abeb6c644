"""Supervise child processes: start, log to files, restart with back-off when one dies or stalls,
stop all. Children die with the supervisor and are recorded for the next one (`containment`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.runtime.lifecycle import ENV_HEARTBEAT_FILE
from services.stack.backoff import RestartPolicy, next_delay
from services.stack.containment import ChildRecord, die_with_parent, signal_group

STOP_TIMEOUT_S = 5.0  # a child still running this long after SIGTERM is killed


@dataclass
class Component:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    stop_last: bool = False  # infrastructure (the embedded NATS): stopped after everything that uses it
    unset: tuple[str, ...] = ()  # variables of our environment this child must not inherit (secrets)
    # Its event loop touches a file every second (`run_until_stopped`); one that stops doing so for
    # `Supervisor.stall_s` is killed and restarted. Off for programs that are not ours (nats-server).
    heartbeat: bool = True
    restarts: int = 0
    pid: int | None = None


class Supervisor:
    def __init__(
        self,
        log_dir: Path,
        *,
        policy: RestartPolicy | None = None,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
        record: Path | None = None,
        stall_s: float = 30.0,
        first_beat_s: float = 120.0,
    ) -> None:
        """`record`: where children are noted for `containment.clean_up_after_crash`. A child with
        a heartbeat is restarted when it has not beaten for `stall_s` (or not at all within
        `first_beat_s` of its start: imports and a first connection come before the first beat)."""
        self.log_dir = log_dir
        self.policy = policy or RestartPolicy()
        self.record = ChildRecord(record) if record is not None else None
        self.stall_s = stall_s
        self.first_beat_s = first_beat_s
        self.stalls = 0
        self.say = say
        self.components: list[Component] = []
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started: set[str] = set()

    def add(self, component: Component) -> None:
        self.components.append(component)

    async def start(self) -> None:
        """Start every component added since the last call, in order."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for component in self.components:
            if component.name in self._started:
                continue
            self._started.add(component.name)
            started = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._keep_running(component, started)))
            await started.wait()

    def heartbeat_file(self, component: Component) -> Path:
        return self.log_dir / f"{component.name}.heartbeat"

    async def _spawn(self, component: Component) -> asyncio.subprocess.Process:
        log = open(self.log_dir / f"{component.name}.log", "ab")  # noqa: ASYNC230, SIM115 - tiny, local; the child owns it
        env = {k: v for k, v in {**os.environ, **component.env}.items() if k not in component.unset}
        env.pop(ENV_HEARTBEAT_FILE, None)
        if component.heartbeat:
            beat = self.heartbeat_file(component)
            beat.unlink(missing_ok=True)
            env[ENV_HEARTBEAT_FILE] = str(beat)
        try:
            proc = await asyncio.create_subprocess_exec(
                *component.argv,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C goes to us; we stop children in order
                preexec_fn=die_with_parent(os.getpid()),  # runs between fork and exec: one prctl, one getppid
            )
        finally:
            log.close()
        component.pid = proc.pid
        self._procs[component.name] = proc
        if self.record is not None:
            self.record.note(component.name, proc.pid)
        return proc

    async def _watch_heartbeat(self, component: Component, proc: asyncio.subprocess.Process) -> None:
        """Kill `proc` (its whole group) when its heartbeat goes stale: the wait in `_keep_running`
        then sees it exit and restarts it. SIGKILL also ends a stopped (SIGSTOP) process."""
        beat = self.heartbeat_file(component)
        began = time.time()
        while proc.returncode is None:
            await asyncio.sleep(min(1.0, self.stall_s / 4))
            try:
                last = beat.stat().st_mtime
                limit = self.stall_s
            except FileNotFoundError:
                last, limit = began, self.first_beat_s
            silent = time.time() - last
            if silent > limit and proc.returncode is None and not self._stopping.is_set():
                self.stalls += 1
                self.say(f"  {component.name:<11}stalled (no heartbeat for {silent:.0f}s); restarting")
                signal_group(proc.pid, signal.SIGKILL)
                return

    async def _keep_running(self, component: Component, started: asyncio.Event) -> None:
        delay = 0.0
        while not self._stopping.is_set():
            began = time.monotonic()
            proc = await self._spawn(component)
            if not started.is_set():
                self.say(f"  {component.name:<11}running (pid {proc.pid}, log {self.log_dir / component.name}.log)")
                started.set()
            watchdog = asyncio.create_task(self._watch_heartbeat(component, proc)) if component.heartbeat else None
            code = await proc.wait()
            if watchdog is not None:
                watchdog.cancel()
            if self._stopping.is_set():
                return
            delay = next_delay(self.policy, delay, time.monotonic() - began)
            component.restarts += 1
            self.say(f"  {component.name:<11}exited with {code}; restarting in {delay:g}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)

    def running(self, name: str) -> bool:
        proc = self._procs.get(name)
        return proc is not None and proc.returncode is None

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every child (they drain), then SIGKILL what is left after the timeout; the
        `stop_last` ones (the bus the others drain into) only once the others are gone."""
        self._stopping.set()
        last = {c.name for c in self.components if c.stop_last}
        for phase in (False, True):
            procs = [p for name, p in self._procs.items() if (name in last) == phase]
            await _terminate(procs, timeout_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.record is not None:
            for name in list(self._procs):
                self.record.forget(name)


async def _terminate(procs: list[asyncio.subprocess.Process], timeout_s: float) -> None:
    """SIGTERM to each child's process group (its own children too), SIGKILL after `timeout_s`."""
    for proc in procs:
        if proc.returncode is None:
            signal_group(proc.pid, signal.SIGTERM)
            signal_group(proc.pid, signal.SIGCONT)  # a stopped child could not act on it
    waits = [proc.wait() for proc in procs if proc.returncode is None]
    if waits:
        await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=timeout_s)
        for proc in procs:
            if proc.returncode is None:
                signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
