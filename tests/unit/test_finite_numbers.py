"""NaN and infinity are refused in every number a person or a client gives: on the command line and
in a command's request (the gateway's JSON, a service's door)."""

from __future__ import annotations

import math

import msgspec
import pytest

from events.names import InvalidName, decode_request
from services.cli import main


class Budget(msgspec.Struct):
    team: str
    amount: float | None = None
    weights: list[float] = []


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_request_with_a_non_finite_number_is_refused_naming_the_field(value: float) -> None:
    with pytest.raises(InvalidName, match="not a finite number") as refused:
        decode_request({"team": "vision", "amount": value}, Budget)
    assert refused.value.field == "amount"
    with pytest.raises(InvalidName, match="not a finite number"):
        decode_request({"team": "vision", "weights": [1.0, value]}, Budget)


def test_finite_numbers_and_absent_ones_pass() -> None:
    assert decode_request({"team": "vision", "amount": 12.5}, Budget).amount == 12.5
    assert decode_request(b'{"team": "vision"}', Budget).amount is None


@pytest.mark.parametrize("flag", ["nan", "inf", "-Infinity"])
def test_the_cli_refuses_a_non_finite_budget_before_sending_anything(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["quota", "set", "vision", "--gpus", "8", f"--budget={flag}", "--nats", "nats://127.0.0.1:1"])
    assert exit_.value.code == 2
    assert "is not a finite number" in capsys.readouterr().err
