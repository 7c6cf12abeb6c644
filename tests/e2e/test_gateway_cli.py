"""`chamber service gateway` as `chamber up` runs it: serves on the given port, stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from services.runtime.nats_server import free_port
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_gateway_command_serves_the_api_and_stops_on_sigterm(nats_server: SecuredNatsServer) -> None:
    port = free_port()
    env = {**os.environ, "CHAMBER_API_TOKEN": "from-the-environment"}
    proc = subprocess.Popen(
        [CHAMBER, "service", "gateway", "--nats", nats_server.url_for("gateway"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = _get(base + "/healthz")
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "the gateway did not answer /healthz in 30 s"
                time.sleep(0.1)
        assert status == 200 and json.loads(body)["nats_connected"] is True
        assert _get(base + "/")[0] == 200
        assert b"chamber_gpus 0.0" in _get(base + "/metrics")[1]
        request = urllib.request.Request(base + "/api/jobs/x/cancel", method="POST")
        request.add_header("Authorization", "Bearer from-the-environment")
        try:  # the token came from CHAMBER_API_TOKEN; no scheduler runs, so the answer is 503
            urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
        else:
            raise AssertionError("expected 503 without a scheduler")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
