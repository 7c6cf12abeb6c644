"""What `chamber up` says it will keep on disk, from the agent's own sample size and the limits set."""

from __future__ import annotations

import pytest

from events.streams import ENV_TELEMETRY_MAX_AGE, ENV_TELEMETRY_MAX_BYTES
from services.cli.disk_budget import describe, sample_bytes


def test_the_stream_budget_follows_the_fleet_and_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TELEMETRY_MAX_AGE, raising=False)
    monkeypatch.delenv(ENV_TELEMETRY_MAX_BYTES, raising=False)
    small, _, others = describe(16, 8)
    assert small.startswith("TELEMETRY keeps 15 min, at most 1 GiB: about ") and "for 16 nodes x 8 GPUs" in small
    # every other stream has its cap, and says what happens when it is reached
    assert "FAULTS 256 MiB (oldest dropped first, 2,000 per subject)" in others
    assert "JOBS 4 GiB (then refuses new events)" in others and "DEAD 512 MiB" in others
    monkeypatch.setenv(ENV_TELEMETRY_MAX_AGE, "120")
    monkeypatch.setenv(ENV_TELEMETRY_MAX_BYTES, str(10 * 2**20))
    capped, _, _ = describe(10_000, 8)
    assert capped.startswith("TELEMETRY keeps 2 min, at most 10 MiB: about 10 MiB for 10000 nodes")


def test_the_sample_size_is_the_agents_compact_one() -> None:
    eight = sample_bytes(8)
    assert 2000 < eight < 4096 + 400  # the compact 8-GPU sample with its envelope, not the old 17.5 KB
    assert sample_bytes(2) < eight


@pytest.mark.parametrize("partitions", [1, 4])
def test_every_stream_has_a_byte_cap_and_a_message_limit_and_each_gate_fits_its_target(partitions: int) -> None:
    """Every stream the set-up makes is bounded in bytes and per message; a gate's message limit is
    no larger than the stream that copies it (the server refuses the source otherwise), and the
    gates' refusals bound a node per subject and window."""
    from events.partitions import stream_specs
    from events.streams import GATE_PER_WINDOW, GATE_WINDOW_S

    specs = {s.name: s for s in stream_specs(partitions)}
    assert all(s.max_bytes and s.max_msg_size for s in specs.values())
    fed = [(t, specs[src.stream]) for t in specs.values() for src in t.sources]
    assert {t.name.split("_P")[0] for t, _ in fed} == {"TELEMETRY", "FAULTS"}
    assert len(fed) == (partitions + 1 if partitions > 1 else 1) + 1  # each telemetry stream, and FAULTS
    for target, gate in fed:
        assert gate.max_msg_size <= target.max_msg_size, gate.name
        assert gate.discard_new and gate.discard_new_per_subject
        assert (gate.max_msgs_per_subject, gate.max_age_s) == (GATE_PER_WINDOW, GATE_WINDOW_S)
        assert gate.duplicate_window_s <= gate.max_age_s  # the server's rule
    names = list(specs)
    assert all(names.index(g.name) < names.index(t.name) for t, g in fed)  # a gate is made first
