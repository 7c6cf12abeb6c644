"""Stream set-up on a cluster still forming: an unanswered request is retried until the deadline,
then the timeout is raised (the message says nothing was answered)."""

from __future__ import annotations

import nats.errors
import pytest

from services.runtime.streams import _placed


async def test_an_unanswered_stream_add_is_retried_until_it_is_answered() -> None:
    calls: list[int] = []

    async def add() -> None:
        calls.append(1)
        if len(calls) < 3:  # the meta leader is being elected: the API does not answer yet
            raise nats.errors.TimeoutError

    await _placed(add, "JOBS", 3, wait_s=5.0)
    assert len(calls) == 3


async def test_a_stream_add_never_answered_times_out_at_the_deadline() -> None:
    async def add() -> None:
        raise nats.errors.TimeoutError

    with pytest.raises(nats.errors.TimeoutError):
        await _placed(add, "JOBS", 3, wait_s=0.3)
