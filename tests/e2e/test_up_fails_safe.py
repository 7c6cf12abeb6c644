"""`chamber up` fails safe: every service stops within 5 s of SIGTERM, killing the supervisor
(SIGKILL, no chance to clean up) leaves nothing running, and the next `chamber up` on the same data
directory and ports starts. Throughout, the server refuses no process anything: each role's derived
permissions are all it needs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from services.runtime.nats_server import free_port
from tests.e2e.test_gateway_fullstack import ROOT, drain, read_until
from tests.integration.test_runtime import eventually
from tests.integration.test_stack_containment import running

pytestmark = pytest.mark.e2e


async def start_up(data_dir: Path, port: int, nats_port: int) -> tuple[asyncio.subprocess.Process, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")}
    up = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "services.cli", "up", "--data-dir", str(data_dir), "--no-workload"],
        *["--port", str(port), "--nats-port", str(nats_port), "--nodes", "2"],
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert up.stdout is not None
    console: list[str] = []
    await read_until(up.stdout, "chamber is up", console, within=120)
    return up, console


def children(data_dir: Path) -> dict[str, int]:
    lines = (data_dir / "children.jsonl").read_text().splitlines()
    return {c["name"]: c["pid"] for c in map(json.loads, lines)}


async def stop_time(pid: int, within: float = 10.0) -> float:
    began = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    await eventually(lambda: not running(pid), within=within)
    return time.monotonic() - began


async def test_services_stop_on_sigterm_and_a_killed_up_leaves_nothing_running(tmp_path: Path) -> None:
    data_dir, port, nats_port = tmp_path / "stack", free_port(), free_port()
    up, console = await start_up(data_dir, port, nats_port)
    reader = asyncio.create_task(drain(up.stdout, console))  # type: ignore[arg-type]
    try:
        started = children(data_dir)
        assert {"nats", "gateway", "recorder", "scheduler", "agent"} <= set(started)
        times = {name: await stop_time(pid) for name, pid in started.items() if name != "nats"}
        print("seconds from SIGTERM to exit:", json.dumps({k: round(v, 2) for k, v in times.items()}))
        assert all(t < 5.0 for t in times.values()), times
        await eventually(lambda: set(children(data_dir)) == set(started), within=30)  # the supervisor restarted them
        await eventually(lambda: all(running(p) for p in children(data_dir).values()), within=30)
        left = children(data_dir)
        up.kill()  # the supervisor dies at once, with no chance to stop anything itself
        await up.wait()
        await eventually(lambda: not any(running(p) for p in left.values()), within=10)
        # every process ran under the role `chamber nats-config` derives for it, and needed nothing more
        refused = [line for line in (data_dir / "logs" / "nats.log").read_text().splitlines() if "Violation" in line]
        assert refused == [], "\n".join(refused)
    finally:
        if up.returncode is None:
            up.kill()
        reader.cancel()
    again, console2 = await start_up(data_dir, port, nats_port)  # same ports and data directory
    again.send_signal(signal.SIGINT)
    assert again.stdout is not None
    await asyncio.wait_for(drain(again.stdout, console2), 60)
    assert await again.wait() == 0, "".join(console2)
