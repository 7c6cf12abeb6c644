"""Supervise child processes: start, log to files, restart with back-off when one dies, stop all."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.stack.backoff import RestartPolicy, next_delay


@dataclass
class Component:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    stop_last: bool = False  # infrastructure (the embedded NATS): stopped after everything that uses it
    unset: tuple[str, ...] = ()  # variables of our environment this child must not inherit (secrets)
    restarts: int = 0
    pid: int | None = None


class Supervisor:
    def __init__(
        self,
        log_dir: Path,
        *,
        policy: RestartPolicy | None = None,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
    ) -> None:
        self.log_dir = log_dir
        self.policy = policy or RestartPolicy()
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

    async def _spawn(self, component: Component) -> asyncio.subprocess.Process:
        log = open(self.log_dir / f"{component.name}.log", "ab")  # noqa: ASYNC230, SIM115 - tiny, local; the child owns it
        try:
            proc = await asyncio.create_subprocess_exec(
                *component.argv,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env={k: v for k, v in {**os.environ, **component.env}.items() if k not in component.unset},
                start_new_session=True,  # Ctrl-C goes to us; we stop children in order
            )
        finally:
            log.close()
        component.pid = proc.pid
        self._procs[component.name] = proc
        return proc

    async def _keep_running(self, component: Component, started: asyncio.Event) -> None:
        delay = 0.0
        while not self._stopping.is_set():
            began = time.monotonic()
            proc = await self._spawn(component)
            if not started.is_set():
                self.say(f"  {component.name:<11}running (pid {proc.pid}, log {self.log_dir / component.name}.log)")
                started.set()
            code = await proc.wait()
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

    async def stop(self, timeout_s: float = 15.0) -> None:
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


async def _terminate(procs: list[asyncio.subprocess.Process], timeout_s: float) -> None:
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    waits = [proc.wait() for proc in procs if proc.returncode is None]
    if waits:
        await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=timeout_s)
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
