"""The outbox writes each record's HPUB command itself (node_agent/outbox.py `_send`): the bytes must be
what nats-py's own `publish` writes for the same record, and a record whose headers nats-py would
rewrite must be left to `publish`."""

from __future__ import annotations

import pytest
from nats.aio.client import Client
from nats.protocol.command import hpub_cmd

from events import subjects
from node_agent.outbox import _header_block
from node_agent.runner import envelope
from tests.builders import a_node_sample


async def nats_py_bytes(subject: str, reply: str, body: bytes, headers: dict[str, str]) -> bytes:
    """What nats-py 2.16's publish hands its pending buffer (no connection needed to build it)."""
    nc = Client()
    got: list[bytes] = []

    async def capture(cmd: bytes, priority: bool = False) -> None:
        got.append(cmd)

    nc._send_command = capture  # type: ignore[method-assign]
    await nc._send_publish(subject, reply, body, len(body), headers)
    assert len(got) == 1
    return got[0]


async def test_a_sample_record_goes_out_as_nats_py_would_send_it() -> None:
    headers, body = envelope(a_node_sample("n1", seq=7, cluster="c1"), "chamber/agent/n1", "c1/n1/7", 1.8e9)
    subject = subjects.ingest(subjects.sample("c1", "n1"))
    hdr = _header_block(headers)
    assert hdr is not None
    assert hpub_cmd(subject, "_INBOX.x.1.0", hdr, body) == await nats_py_bytes(subject, "_INBOX.x.1.0", body, headers)


@pytest.mark.parametrize(
    "headers",
    [
        {"a": "plain", "Nats-Msg-Id": "c1/n1/3"},
        {},  # no headers: the block's first line and the blank line
        {"a": ""},  # an empty value
        {"a": " lead"},  # nats-py strips values
        {"a": "trail "},
        {"a": "two\r\nlines"},  # nats-py turns line breaks into spaces
        {"a": "tab\there"},
        {"a": "naïve"},  # not ASCII
        {" a": "x"},  # nats-py strips keys
        {"a:b": "x"},  # not a header name nats-py accepts (it raises)
        {"a": "x:  y"},
        {"a": "ok", "b": "x "},
    ],
)
async def test_headers_nats_py_would_rewrite_are_left_to_it(headers: dict[str, str]) -> None:
    hdr = _header_block(headers)
    if hdr is None:
        return  # `publish` sends it
    assert hpub_cmd("s", "r", hdr, b"{}") == await nats_py_bytes("s", "r", b"{}", headers)


def test_the_fast_block_covers_what_the_agent_sends() -> None:
    """Every header the agent's envelope makes is sent without nats-py's per-header work."""
    headers, _ = envelope(a_node_sample("n1", seq=1, cluster="c1"), "chamber/agent/n1", "c1/n1/1", 1.0)
    assert _header_block(headers) is not None
    assert _header_block({**headers, "x": "two\nlines"}) is None
