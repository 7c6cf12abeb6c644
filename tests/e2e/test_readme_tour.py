"""The README's tour, run as written against a real stack, so an example in it cannot rot.

`chamber up` (the demo: 16 simulated nodes x 8 GPUs and the three teams' workload) starts in a fresh
directory, as `make up` runs it; every ```sh block of the README's tour then runs in one bash session
in that directory, in order, as a reader would type them into a second terminal. The only changes to
the text are the ports (the test's free ones instead of 8080), and `.venv/bin/chamber` in that
directory being this checkout's CLI. Each command must succeed, and what the tour says it shows is
checked on its output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.runtime.nats_server import free_port
from tests.e2e.test_gateway_fullstack import drain, read_until
from tests.integration.test_runtime import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TOUR_HEADING = "## A ten-minute tour"


def tour_blocks(text: str) -> list[str]:
    """The ```sh blocks of the README's tour section, in order."""
    start = text.index(TOUR_HEADING)
    end = text.find("\n## ", start + len(TOUR_HEADING))
    section = text[start : end if end != -1 else len(text)]
    return re.findall(r"^```sh\n(.*?)^```$", section, flags=re.S | re.M)


def test_the_tour_has_a_block_for_each_step() -> None:
    blocks = tour_blocks(README.read_text())
    text = "\n".join(blocks)
    for command in ("chamber quota set", "chamber submit", "chamber explain", "chamber sim-fault", "chamber sql"):
        assert command in text, command
    assert "billing report" in text and "curl" in text
    assert len(README.read_text().splitlines()) <= 300


def _run_block(block: str, cwd: Path, env: dict[str, str], state: Path) -> str:
    """One block in bash, carrying exported variables from the blocks before (as one terminal would)."""
    script = f"set -e\n[ -f {state} ] && . {state}\n{block}\nexport -p > {state}\n"
    done = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"block failed ({done.returncode}):\n{block}\n--- output:\n{out}"
    assert "Traceback" not in out, out
    return out


@pytest.mark.skipif(shutil.which("jq") is None or shutil.which("curl") is None, reason="the tour uses jq and curl")
async def test_every_command_of_the_readme_tour_runs_against_a_real_stack(tmp_path: Path) -> None:
    port, nats_port = free_port(), free_port()
    home = tmp_path / "chamber"  # the checkout a reader runs `make up` in
    (home / ".venv" / "bin").mkdir(parents=True)
    shim = home / ".venv" / "bin" / "chamber"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m services.cli "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")}
    env["PYTHONPATH"] = str(ROOT)
    up = await asyncio.create_subprocess_exec(
        *[str(shim), "up", "--port", str(port), "--nats-port", str(nats_port)],
        cwd=home,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert up.stdout is not None
    console: list[str] = []
    reader: asyncio.Task[None] | None = None
    # the tour's commands use the default ports; the stack listens on the test's
    bus_env = {**env, "CHAMBER_NATS_URL": f"nats://127.0.0.1:{nats_port}"}
    try:
        await read_until(up.stdout, "chamber is up", console, within=90)
        reader = asyncio.create_task(drain(up.stdout, console))

        def chamber(*args: str) -> str:
            done = subprocess.run(
                [str(shim), *args], cwd=home, env=bus_env, capture_output=True, text=True, timeout=60, check=False
            )
            return done.stdout if done.returncode == 0 else ""

        # the tour starts on a busy fleet: the workload has filled it and jobs queue
        await eventually(lambda: '"state": "pending"' in chamber("queue", "--json"), within=180)

        blocks = tour_blocks(README.read_text())
        state = tmp_path / "shell-state"
        outputs = []
        for block in blocks:
            text = block.replace("localhost:8080", f"localhost:{port}").replace("127.0.0.1:8080", f"127.0.0.1:{port}")
            outputs.append(await asyncio.to_thread(_run_block, text, home, bus_env, state))
        seen = dict(zip(blocks, outputs, strict=True))

        def output_of(command: str) -> str:
            return next(out for block, out in seen.items() if command in block)

        assert "chamber 0." in output_of("chamber version")
        quotas = output_of("chamber quota set research")
        assert "research" in quotas and "critical" in quotas
        submitted = output_of("chamber submit")
        assert "tour-urgent" in submitted and "running" in submitted, submitted
        # step 4: the job left the node whose GPU fell off the bus
        moved = json.loads(chamber("explain", "tour-urgent", "--json"))
        fault_step = output_of("chamber sim-fault")
        node = next(line.split()[0].split("/")[-1] for line in fault_step.splitlines() if "ISOLATED" in line)
        assert node not in (moved.get("placement") or {}), (node, moved)
        assert "xid-79" in fault_step
        http = output_of("curl")
        assert '"job_id"' in http and '"ok":true' in http.replace(" ", ""), http
        cost = output_of("billing report")
        assert "vision" in cost and "total" in cost
        sql = output_of("chamber sql")
        assert "rows)" in sql and "io.chamber.jobs.submitted" in sql, sql

        up.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(up.wait(), 60) == 0, "".join(console)
    finally:
        if up.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(up.pid, signal.SIGKILL)
            await up.wait()
        if reader is not None:
            reader.cancel()
