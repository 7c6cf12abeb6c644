"""What the runtime's batched pull (services/runtime/pull.py) relies on from nats-py. pyproject pins
nats-py's minor version; this fails when an upgrade moves one of these, before a service does."""

from __future__ import annotations

import inspect
from importlib.metadata import version

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.runtime.pull import Position, position


def test_nats_py_is_the_pinned_minor() -> None:
    major, minor = version("nats-py").split(".")[:2]
    assert (int(major), int(minor)) == (2, 16), "pull.py was checked against nats-py 2.16: re-check, then re-pin"


def test_the_client_calls_the_puller_makes_exist_with_their_parameters() -> None:
    assert "cb" in inspect.signature(Client.subscribe).parameters
    assert "reply" in inspect.signature(Client.publish).parameters
    assert callable(Client.new_inbox)


def test_a_message_exposes_subject_reply_headers_and_data() -> None:
    msg = Msg(_client=None, subject="s", reply="r", data=b"d", headers={"a": "b"})  # type: ignore[arg-type]
    assert (msg.subject, msg.reply, msg.data, msg.headers) == ("s", "r", b"d", {"a": "b"})


def test_a_position_is_read_from_the_jetstream_ack_subject() -> None:
    reply = "$JS.ACK.JOBS.c1.2.41.40.1700000000123456789.7"
    msg = Msg(_client=None, subject="chamber.jobs.a", reply=reply, data=b"")  # type: ignore[arg-type]
    assert position(msg) == Position(stream_seq=41, delivered=2, timestamp_ns=1700000000123456789, pending=7)


def test_a_pull_requests_status_arrives_in_the_headers_the_puller_reads() -> None:
    """nats-py puts an inline status line (`NATS/1.0 404 No Messages`) into these header names."""
    from nats.js.api import Header

    from services.runtime import pull

    assert (Header.STATUS.value, Header.DESCRIPTION.value) == (pull._STATUS, pull._DESCRIPTION)
