"""Every command that talks to NATS fails fast, naming the URL and the fix, when NATS is not there
(issue 16, finding 3: they used to hang forever)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.nats_server import free_port

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")
COMMANDS = [
    ["queue"],
    ["fleet"],
    ["quota", "list"],
    ["submit", "--team", "vision", "--gpus", "1"],
    ["explain", "some-job"],
    ["cancel", "some-job"],
    ["sim-fault", "node-1", "xid", "--xid", "79"],
    ["health", "held"],
]


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A port that takes TCP connections (the kernel completes the handshake) and never says a word:
    what a wedged server or a wrong port behind a proxy looks like."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"nats://127.0.0.1:{sock.getsockname()[1]}"


def run(args: list[str], url: str) -> subprocess.CompletedProcess[str]:
    # the timeout only turns a hang into a failure; the commands answer within about 2 s
    return subprocess.run([CHAMBER, *args, "--nats", url], capture_output=True, text=True, timeout=30)


def assert_says_why(result: subprocess.CompletedProcess[str], url: str) -> None:
    assert result.returncode == 2, result.stderr
    assert f"cannot reach NATS at {url}" in result.stderr
    assert "chamber up" in result.stderr and "--nats" in result.stderr and "CHAMBER_NATS_URL" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0] if a[0] != "quota" else "quota-list")
def test_a_command_without_nats_fails_fast_naming_the_url_and_the_fix(args: list[str]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
    assert_says_why(run(args, url), url)


def test_a_server_that_never_answers_fails_the_command_within_the_deadline(silent_server: str) -> None:
    result = run(["queue"], silent_server)
    assert_says_why(result, silent_server)
    assert "no answer within 2 s" in result.stderr
