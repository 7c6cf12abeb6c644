"""Control characters that reach the CLI's human output (a job name, a dead letter's body, a user's
own typo echoed back) are printed escaped, so they cannot drive the operator's terminal."""

from __future__ import annotations

import io

import pytest

from services.cli import EscapingWriter, main


def test_an_escape_sequence_echoed_in_an_error_is_printed_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nats-config", "--explain", "evil\x1b]0;owned\x07\x1b[2J"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err
    assert "evil\\x1b]0;owned\\x07\\x1b[2J" in err


def test_newlines_and_tabs_stay_and_everything_else_below_space_is_escaped() -> None:
    out = io.StringIO()
    EscapingWriter(out).write("a\tb\nc\rd\x00e\x9bf")
    assert out.getvalue() == "a\tb\nc\\rd\\x00e\\x9bf"
