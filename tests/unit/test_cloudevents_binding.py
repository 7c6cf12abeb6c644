"""The CloudEvents NATS binding (issue 16, finding 13): `ce-` values percent-encoded where the binding
asks, and header names read case-insensitively."""

from __future__ import annotations

import pytest

from events.codec import H_ID, H_MSG_ID, H_SOURCE, decode, encode
from tests.builders import a_job_submitted


@pytest.mark.parametrize("event_id", ["job 1 submitted", "jöb-ü-1", 'say "hi" 100%', "任务-7", "plain-id-1"])
def test_an_id_with_spaces_quotes_percent_or_non_ascii_is_percent_encoded_and_comes_back_whole(
    event_id: str,
) -> None:
    headers, body = encode(a_job_submitted(), source="chamber/test service", id=event_id)
    sent = headers[H_ID]
    assert all(0x21 <= ord(c) <= 0x7E and c not in '"' for c in sent)  # printable ASCII, no quote
    assert " " not in headers[H_SOURCE]
    assert headers[H_MSG_ID] == sent  # JetStream de-duplicates on what consumers decode
    envelope = decode(headers, body)
    assert envelope.id == event_id
    assert envelope.source == "chamber/test service"
    if event_id == "plain-id-1":
        assert sent == event_id  # plain values travel as they are


def test_upper_case_ce_header_names_are_the_same_headers() -> None:
    headers, body = encode(a_job_submitted("j-9"), source="chamber/test", id="e-1")
    shouted = {k.upper() if k.startswith("ce-") else k: v for k, v in headers.items()}
    shouted["Content-Type"] = shouted.pop("content-type")
    envelope = decode(shouted, body)
    assert envelope.id == "e-1" and envelope.event == a_job_submitted("j-9")


@pytest.mark.parametrize(
    "rename",
    [
        lambda k: k,  # as this codec writes them: read without a copy
        lambda k: k.upper(),
        lambda k: k.title(),
        lambda k: k.upper() if k == "content-type" else k,  # lower-case ce-* names, another content-type
    ],
)
def test_the_fold_decode_checks_what_decode_checks(rename: object) -> None:
    """`decode_event` (the host's fold) and `decode` take and refuse the same messages."""
    from events.codec import DecodeError, decode_event

    headers, body = encode(a_job_submitted("j-3"), source="chamber/test", id="e 3")
    named = {rename(k): v for k, v in headers.items()}  # type: ignore[operator]
    event, event_id = decode_event(named, body)
    assert (event, event_id) == (decode(named, body).event, "e 3")
    wrong_type = {**named, next(k for k in named if k.lower() == "content-type"): "text/plain"}
    for decoder in (decode, decode_event):
        with pytest.raises(DecodeError) as refused:
            decoder(wrong_type, body)
        assert refused.value.reason == "content_type"
