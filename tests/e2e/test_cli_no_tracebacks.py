"""A user's mistake, or a reader that stops reading, gets a message, never a traceback (issue 16,
finding 16)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHAMBER, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [["version"], ["sim", "--jobs", "20", "--gpus", "64"]], ids=["version", "sim"])
def test_a_reader_that_went_away_ends_the_command_quietly(args: list[str]) -> None:
    """`chamber ... | head`: the pipe is closed before the command writes (head already exited)."""
    proc = subprocess.Popen([CHAMBER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(120) == 141, stderr  # 128 + SIGPIPE, as a shell reports a command cut off by `head`
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr


@pytest.mark.parametrize("command", [["report", "efficiency"], ["billing", "report"]])
def test_a_window_that_reaches_before_1970_is_a_message(command: list[str]) -> None:
    result = run(*command, "--since", "99999999d")
    assert result.returncode == 2
    assert "before 1970" in result.stderr and "Traceback" not in result.stderr


def test_a_binary_trace_is_refused_with_a_message(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_bytes(bytes(range(256)) * 8)
    result = run("sim", "--gpus", "8", "--trace", str(trace))
    assert result.returncode == 2
    assert "is not a UTF-8 text (CSV) file" in result.stderr and "Traceback" not in result.stderr


def test_a_trace_saved_by_a_spreadsheet_with_a_bom_and_crlf_line_ends_is_read(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_bytes(b"\xef\xbb\xbfjob_id,submit_time_s,duration_s,num_gpus,team\r\nj1,0,100,1,a\r\nj2,5,50,2,b\r\n")
    result = run("sim", "--gpus", "8", "--trace", str(trace), "--json")
    assert result.returncode == 0, result.stderr
    assert '"jobs": 2' in result.stdout and '"bad_rows": 0' in result.stdout
