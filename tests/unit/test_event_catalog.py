"""Every event type round-trips through the wire codec, and bad input fails with a clear reason."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from events import ALL_EVENTS, DecodeError, Event, JobSpec, JobSubmitted, UnknownEventType, decode, encode
from events.channels import CHANNELS
from events.codec import stable_id
from events.streams import STREAMS, stream_for
from events.subjects import subject_for, token
from tests.strategies import any_event


@settings(max_examples=300, deadline=None)
@given(any_event(ALL_EVENTS))
def test_every_event_type_round_trips_through_the_codec(event: Event) -> None:
    headers, body = encode(event, source="test/roundtrip", id="id-1", time=1_700_000_000.0)
    envelope = decode(headers, body)
    assert envelope.event == event
    assert envelope.type == type(event).ce_type()
    assert envelope.id == headers["Nats-Msg-Id"] == "id-1"
    assert envelope.time == "2023-11-14T22:13:20Z"


@settings(max_examples=200, deadline=None)
@given(any_event(ALL_EVENTS))
def test_every_event_has_a_subject_on_its_channel_and_stream(event: Event) -> None:
    subject = subject_for(event)
    channel = next(c for c in CHANNELS if type(event) in c.events)
    assert channel.stream.covers(subject)
    assert stream_for(subject) is channel.stream
    assert all(tok for tok in subject.split("."))


def test_each_event_type_is_on_exactly_one_channel() -> None:
    on_channels = [cls for c in CHANNELS for cls in c.events]
    assert sorted(c.__name__ for c in on_channels) == sorted(c.__name__ for c in ALL_EVENTS)


def test_streams_do_not_overlap() -> None:
    for s in STREAMS:
        for other in STREAMS:
            if s is not other:
                assert not any(other.covers(p.replace(">", "x.y")) for p in s.subjects)


def test_subject_tokens_are_lower_case_and_safe() -> None:
    assert token("GPU-Node.example.com") == "gpu-node_example_com"
    assert token("a b*c>") == "a_b_c_"
    with pytest.raises(ValueError, match="empty"):
        token(" ")


def _submitted() -> tuple[dict[str, str], bytes]:
    event = JobSubmitted(job_id="j1", at=1.0, spec=JobSpec(team="vision", gpus_per_replica=8))
    return encode(event, source="test", id="j1-submitted", time=1.0)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda h, b: (h, b"{not json"), "malformed"),
        (lambda h, b: (h, b.replace(b'"vision"', b"42")), "invalid"),
        (lambda h, b: (h, b.replace(b'"gpus_per_replica":8', b'"gpus_per_replica":0')), "invalid"),
        (lambda h, b: ({**h, "ce-type": "io.chamber.jobs.submitted.v9"}, b), "unknown_version"),
        (lambda h, b: ({k: v for k, v in h.items() if k != "ce-type"}, b), "envelope"),
        (lambda h, b: ({**h, "ce-specversion": "0.3"}, b), "envelope"),
        (lambda h, b: ({**h, "content-type": "text/plain"}, b), "content_type"),
        (lambda h, b: (h, b + b" " * 300_000), "oversized"),
        (lambda h, b: (None, b), "envelope"),
    ],
)
def test_bad_input_raises_one_error_type_naming_the_problem(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    headers, body = mutate(*_submitted())
    with pytest.raises(DecodeError) as info:
        decode(headers, body)
    assert info.value.reason == reason
    assert info.value.detail


def test_an_unknown_event_type_is_a_skippable_decode_error() -> None:
    headers, body = _submitted()
    with pytest.raises(UnknownEventType) as info:
        decode({**headers, "ce-type": "io.chamber.jobs.teleported.v1"}, body)
    assert info.value.reason == "unknown_type"


def test_fields_added_with_defaults_stay_compatible_with_old_payloads() -> None:
    # An old producer that did not send optional fields still decodes.
    headers, _ = _submitted()
    body = b'{"type":"io.chamber.jobs.submitted.v1","job_id":"j","at":1,"spec":{"team":"t","gpus_per_replica":1}}'
    event = decode(headers, body).event
    assert isinstance(event, JobSubmitted)
    assert event.spec.replicas == 1 and event.spec.preemptible


def test_stable_ids_are_deterministic_and_distinct() -> None:
    # the same facts give the same id in every process and release (JetStream de-duplicates replayed
    # decisions by it), so the value itself is pinned, not compared with a second call
    assert stable_id("sched", 3, "j1") == "1ac9d6cc-ed5d-5fcc-8b30-3680eb08d3a2"
    assert stable_id("sched", 3, "j1") != stable_id("sched", 3, "j2")
