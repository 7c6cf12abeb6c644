"""The `chamber` command line as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.runtime.nats_server import free_port

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")


def run(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHAMBER, *args], capture_output=True, text=True, timeout=60, **kw)  # type: ignore[call-overload]


def test_help_lists_the_commands() -> None:
    result = run("--help")
    assert result.returncode == 0
    assert "version" in result.stdout and "up" in result.stdout


def test_version_prints_the_package_version() -> None:
    result = run("version")
    assert result.returncode == 0
    assert result.stdout.startswith("chamber 0.")


def test_an_unknown_command_is_a_usage_error_without_traceback() -> None:
    result = run("frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr and "Traceback" not in result.stderr


def _wait_for(proc: subprocess.Popen[str], text: str, timeout: float = 30) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"{text!r} not printed; got:\n{seen}")


def test_up_starts_nats_with_streams_refuses_a_second_instance_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port, web = str(free_port()), str(free_port())
    env = {**os.environ, "CHAMBER_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.Popen(
        [CHAMBER, "up", "--nats-port", port, "--port", web, "--nodes", "2", "--no-workload"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        out = _wait_for(proc, "chamber is up", timeout=90)
        assert "ready   nats:" in out and "added JOBS" in out
        assert "disk       TELEMETRY keeps 15 min, at most 1 GiB: about" in out  # the disk it will use
        assert "gateway    running" in out and "agent      running" in out
        assert f"dashboard  ready   http://127.0.0.1:{web}/" in out
        second = run("up", "--nats-port", str(free_port()), env=env)
        assert second.returncode == 2
        assert "already running" in second.stderr and "Traceback" not in second.stderr
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert proc.stdout is not None
        assert "stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    # State survives: the streams are on disk, a restart finds them.
    proc = subprocess.Popen(
        [CHAMBER, "up", "--nats-port", port, "--port", web, "--nodes", "2", "--no-workload"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert "all present" in _wait_for(proc, "chamber is up", timeout=90)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_up_refuses_a_telemetry_budget_that_is_not_positive_without_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "CHAMBER_DATA_DIR": str(tmp_path / "data")}
    result = run("up", "--telemetry-keep-min", "0", env=env)
    assert result.returncode == 2
    assert "--telemetry-keep-min must be more than 0" in result.stderr and "Traceback" not in result.stderr
