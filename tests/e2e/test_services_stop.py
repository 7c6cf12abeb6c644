"""Every process `chamber up` runs stops on SIGTERM by itself: each service, and the simulated fleet,
started as `chamber up` starts it (its own NATS user on the secured bus), ready, then sent SIGTERM,
exits 0 within 5 s without the backstop that ends a process which did not finish stopping in time.

The backstop (`services/runtime/lifecycle.py`) exits 0 too; the log line it writes is what tells a
clean stop from an abandoned one. And a service whose event loop is frozen (SIGSTOP) is restarted
by the supervisor."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from services.cli.service import discover
from services.runtime.nats_server import free_port
from services.stack.backoff import RestartPolicy
from services.stack.supervisor import STOP_TIMEOUT_S, Component, Supervisor
from tests.integration.test_runtime import eventually
from tests.integration.test_stack_containment import freeze_and_see_restarted
from tests.secured_bus import CLUSTER, SecuredNatsServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BACKSTOP = "did not stop in time"


@dataclass
class Child:
    name: str
    proc: asyncio.subprocess.Process
    health_port: int
    log: Path


def child_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")}
    env |= {"CHAMBER_DATA_DIR": str(tmp / "data"), "CHAMBER_CLUSTER": CLUSTER}
    return env | {"CHAMBER_AGENT_SPOOL": str(tmp / "spool"), "CHAMBER_API_TOKEN_FILE": str(tmp / "api-token")}


def argv_of(name: str, server: SecuredNatsServer, health_port: int) -> list[str]:
    chamber = [sys.executable, "-m", "services.cli"]
    if name == "agent":  # the simulated fleet, as `chamber up` runs it on a machine without GPUs
        url = server.url_for("simulator")
        return [*chamber, "agent", "--simulate", "--nodes", "2", "--nats", url, "--health-port", str(health_port)]
    argv = [*chamber, "service", name, "--nats", server.url_for(name), "--health-port", str(health_port)]
    if name == "gateway":
        argv += ["--port", str(free_port()), "--host", "127.0.0.1"]
    return argv


async def start(name: str, server: SecuredNatsServer, tmp: Path) -> Child:
    port, log = free_port(), tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv_of(name, server, port), cwd=ROOT, env=child_env(tmp), stdout=out, stderr=asyncio.subprocess.STDOUT
        )
    return Child(name, proc, port, log)


async def ready(http: aiohttp.ClientSession, child: Child) -> bool:
    assert child.proc.returncode is None, f"{child.name} exited:\n{child.log.read_text()}"
    try:
        async with http.get(f"http://127.0.0.1:{child.health_port}/readyz") as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):  # not listening yet, or slow to answer on a loaded machine
        return False


async def stop(child: Child) -> tuple[float, int]:
    began = time.monotonic()
    child.proc.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.wait_for(child.proc.wait(), 15)
    except TimeoutError:
        child.proc.kill()
        code = await child.proc.wait()
    return time.monotonic() - began, code


async def test_every_process_of_the_stack_stops_cleanly_within_5_s_of_sigterm(
    nats_server: SecuredNatsServer, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "api-token").write_text("t" * 32)
    names = [n for n, m in discover().items() if getattr(m, "RUNS_IN_UP", True)] + ["agent"]
    children = [await start(name, nats_server, tmp_path) for name in names]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            for child in children:  # each one consuming, caught up and answering commands
                await eventually(lambda c=child: ready(http, c), within=120)
        # all at once, as `chamber up` stops its children on Ctrl-C
        stopped = dict(zip(names, await asyncio.gather(*map(stop, children)), strict=True))
    finally:
        for child in children:
            if child.proc.returncode is None:
                child.proc.kill()
                await child.proc.wait()
    print("seconds from SIGTERM to exit:", json.dumps({n: round(t, 2) for n, (t, _) in stopped.items()}))
    abandoned = [c.name for c in children if BACKSTOP in c.log.read_text()]
    assert abandoned == [], f"stopped only by the backstop: {abandoned}"
    assert {n: code for n, (_, code) in stopped.items() if code != 0} == {}
    assert {n: t for n, (t, _) in stopped.items() if t >= STOP_TIMEOUT_S} == {}


async def test_a_service_whose_event_loop_stalls_is_restarted_by_the_supervisor(
    nats_server: SecuredNatsServer, tmp_path: Path
) -> None:
    """A real service under `chamber up`'s supervisor, stopped with SIGSTOP (its loop no longer
    beats): the supervisor kills it and starts it again (the stall limit is 30 s in `chamber up`,
    3 s here)."""
    (tmp_path / "data").mkdir()
    lines: list[str] = []
    supervisor = Supervisor(tmp_path / "logs", policy=RestartPolicy(first_delay_s=0.05), say=lines.append, stall_s=3)
    argv = [sys.executable, "-m", "services.cli", "service", "perf", "--nats", nats_server.url_for("perf")]
    perf = Component("perf", argv, child_env(tmp_path))
    supervisor.add(perf)
    await supervisor.start()
    try:
        await freeze_and_see_restarted(supervisor, perf, lines, first_beat_within=120)
        beat = supervisor.heartbeat_file(perf)
        beat.unlink(missing_ok=True)
        await eventually(beat.exists, within=120)  # the new process beats
    finally:
        await asyncio.wait_for(supervisor.stop(), 30)
