"""Every mistake at the command line reads the same way: `chamber WORDS: error: ...` as the last line
of standard error (argparse's own form, used for the CLI's checks, refusals and a service that will
not start), a non-zero exit, and no traceback."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli import main

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")
NO_NATS = ["--nats", "nats://127.0.0.1:1"]  # refused at once: the error a user without `chamber up` gets

WRONG = [
    (["nosuch"], "chamber: error: argument COMMAND: invalid choice: 'nosuch'"),
    (["quota", "set", "vision", "--gpus", "many"], "chamber quota set: error: argument --gpus: expected a whole"),
    (["quota", "set", "vision"], "chamber quota set: error: nothing to change"),
    (["quota", "set", "vision", "--weight", "0"], "chamber quota set: error: --weight must be above 0"),
    (["quota", "set", "vision", "--replace"], "chamber quota set: error: --replace sets the whole quota"),
    (["quota", "pool", "list", *NO_NATS], "chamber quota pool list: error: cannot reach NATS"),
    (["quota", "pool", "delete", "hopper", *NO_NATS], "chamber quota pool delete: error: cannot reach NATS"),
    (["submit", "--team", "vision", "--gpus", "0"], "chamber submit: error: --gpus must be 1 or more"),
    (["queue", "--limit", "0"], "chamber queue: error: --offset must be 0 or more"),
    (["explain", "train-a", *NO_NATS], "chamber explain: error: cannot reach NATS"),
    (["billing", "price", "set", "H100-80GB", "abc"], "chamber billing price set: error: RATE 'abc' is not a number"),
    (["billing", "price", "list", *NO_NATS], "chamber billing price list: error: cannot reach NATS"),
    (["report", "efficiency", "--since", "99999999d"], "chamber report efficiency: error:"),
    (["sim", "--gpus", "8", "--trace", "/no/such/trace.csv"], "chamber sim: error:"),
    (["sim-fault", "node-1", "nic-down", *NO_NATS], "chamber sim-fault: error:"),
    (["service", "billing", "--price", "bad", *NO_NATS], "chamber service billing: error: --price 'bad'"),
]


def _run(argv: list[str]) -> tuple[int, str]:
    """The CLI in this process: a traceback would fail the test as the exception it is."""
    from io import StringIO
    from unittest import mock

    err = StringIO()
    with mock.patch.object(sys, "stderr", err), mock.patch.object(sys, "stdout", StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors exit
            code = exc.code if isinstance(exc.code, int) else 1
    return code, err.getvalue()


@pytest.mark.parametrize(("argv", "expected"), WRONG, ids=[" ".join(a[:3]) for a, _ in WRONG])
def test_every_cli_error_starts_with_the_same_prefix(argv: list[str], expected: str) -> None:
    code, stderr = _run(argv)
    last = stderr.strip().splitlines()[-1]
    assert code != 0, stderr
    assert re.match(r"^chamber( [a-z][\w-]*)*: error: \S", last), stderr
    assert last.startswith(expected), stderr
    assert "Traceback" not in stderr


def test_a_process_prints_the_prefix_and_no_traceback() -> None:
    done = subprocess.run([CHAMBER, "quota", "pool", "list", *NO_NATS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("chamber quota pool list: error: cannot reach NATS at nats://127.0.0.1:1")
    assert "Traceback" not in done.stderr and done.stdout == ""
