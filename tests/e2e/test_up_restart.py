"""`chamber up` as an operator runs it, under its own NATS users: it runs a while, stops, starts again,
and every decider restores its state from the snapshot it saved when it stopped instead of folding
the log from the start. The bus refuses no permission on the way."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from services.runtime.nats_server import free_port
from tests.secured_bus import violations_in

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")
DECIDERS = ("scheduler", "quota", "billing", "health", "gateway")  # the services that keep a snapshot


def _records(log: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The JSON log lines of a component from byte `offset` on (the supervisor appends to one file)."""
    if not log.exists():
        return []
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def _events(log: Path, event: str, offset: int = 0) -> list[dict[str, Any]]:
    return [r for r in _records(log, offset) if r.get("event") == event]


def _wait(check: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


class Up:
    def __init__(self, data: Path) -> None:
        self.data, self.port, self.web = data, str(free_port()), str(free_port())
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        env = {**os.environ, "CHAMBER_DATA_DIR": str(self.data), "PYTHONUNBUFFERED": "1"}
        argv = [CHAMBER, "up", "--nats-port", self.port, "--port", self.web, "--nodes", "2", "--gpus-per-node", "4"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert self.proc.stdout is not None
        seen = ""
        for line in self.proc.stdout:
            seen += line
            if "chamber is up" in line:
                return
        raise AssertionError(f"`chamber up` did not come up:\n{seen}")

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            assert self.proc.wait(60) == 0
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def log(self, name: str) -> Path:
        return self.data / "logs" / f"{name}.log"


def test_a_restarted_stack_restores_every_decider_from_its_snapshot(tmp_path: Path) -> None:
    up = Up(tmp_path / "data")
    up.start()
    try:
        _wait(lambda: all(_events(up.log(s), "caught up") for s in DECIDERS), 120, "every decider caught up")
        # the demo workload submits jobs: the scheduler's log moves past its first positions
        _wait(lambda: _events(up.log("scheduler"), "cycle"), 120, "a scheduling cycle")
        # the operator's next terminal: no URL given, a non-default port; the CLI finds this stack
        env = {k: v for k, v in os.environ.items() if k != "CHAMBER_NATS_URL"}
        env["CHAMBER_DATA_DIR"] = str(up.data)
        listed = subprocess.run([CHAMBER, "quota", "list"], env=env, capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
    finally:
        up.stop()
    saved = {}
    for service in DECIDERS:
        snapshots = _events(up.log(service), "snapshot saved")
        assert snapshots, f"{service} saved no snapshot when it stopped"
        saved[service] = snapshots[-1]["positions"]
    assert saved["scheduler"].get("JOBS", 0) > 0

    offsets = {s: up.log(s).stat().st_size for s in DECIDERS}
    up.start()
    try:
        _wait(
            lambda: all(_events(up.log(s), "state restored from snapshot", offsets[s]) for s in DECIDERS),
            120,
            "every decider restored",
        )
    finally:
        up.stop()
    for service in DECIDERS:
        [restored] = _events(up.log(service), "state restored from snapshot", offsets[service])
        assert restored["positions"] == saved[service], service
        assert 0 <= restored["seconds"] < 30 and restored["bytes"] > 0
        again = [r["event"] for r in _records(up.log(service), offsets[service])]
        assert not [e for e in again if "folding from the start" in e], (service, again)
    assert violations_in(up.data / "logs" / "nats.log") == []
