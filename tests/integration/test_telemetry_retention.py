"""TELEMETRY's disk budget against a real nats-server: minutes and a byte cap, set by the operator
through the environment, and the oldest samples dropped first when the cap is reached."""

from __future__ import annotations

import pytest
from nats.js import JetStreamContext

from events.streams import ENV_TELEMETRY_MAX_AGE, ENV_TELEMETRY_MAX_BYTES, telemetry_retention
from services.runtime import ensure_streams

pytestmark = pytest.mark.integration


async def test_the_operator_sets_telemetrys_age_and_byte_cap_and_every_service_applies_them(
    js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_TELEMETRY_MAX_AGE, "300")
    monkeypatch.setenv(ENV_TELEMETRY_MAX_BYTES, str(64 * 1024))
    assert await ensure_streams(js) == ["updated TELEMETRY"]
    config = (await js.stream_info("TELEMETRY")).config
    assert (config.max_age, config.max_bytes) == (300, 64 * 1024)
    assert await ensure_streams(js) == []  # a second service with the same settings changes nothing


async def test_at_the_byte_cap_the_oldest_samples_go_first(
    js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_TELEMETRY_MAX_BYTES, str(64 * 1024))
    await ensure_streams(js)
    body = b"x" * 1000
    for i in range(200):  # about 200 KB into a 64 KB stream
        await js.publish(f"chamber.telemetry.sample.c1.n{i}", body)
    state = (await js.stream_info("TELEMETRY")).state
    assert state.bytes <= 64 * 1024
    assert state.last_seq == 200 and state.first_seq > 100  # the newest kept, the oldest dropped


def test_a_retention_that_is_not_a_positive_number_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=ENV_TELEMETRY_MAX_AGE):
        telemetry_retention({ENV_TELEMETRY_MAX_AGE: "15m"})
    with pytest.raises(ValueError, match=ENV_TELEMETRY_MAX_BYTES):
        telemetry_retention({ENV_TELEMETRY_MAX_BYTES: "-1"})
    assert telemetry_retention({}) == (900.0, 1024**3)
