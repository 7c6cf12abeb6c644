"""The bulk decode of node samples against the strict per-message decode it stands in for: the same
columns for every batch it accepts, and a refusal for anything the strict decode would refuse."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events import GpuSample, NodeSample, encode
from services.recorder.bulk_samples import BatchRefused, sample_table
from services.recorder.rows import LeanNodeSample, Recorded, sample_columns

_strict = msgspec.json.Decoder(LeanNodeSample)


def strict_table(bodies: list[bytes], ids: list[str]):  # type: ignore[no-untyped-def]
    items = [
        Recorded(event=_strict.decode(b), id=i, source="s", time="", stream="TELEMETRY", subject="x", stream_seq=n)
        for n, (b, i) in enumerate(zip(bodies, ids, strict=True))
    ]
    return sample_columns(items)


maybe_float = st.none() | st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)
maybe_int = st.none() | st.integers(min_value=0, max_value=2**40)
gpus = st.builds(
    GpuSample,
    index=st.integers(min_value=0, max_value=15),
    uuid=st.text(max_size=20),
    utilization_pct=maybe_float,
    memory_used_mib=maybe_float,
    power_w=maybe_float,
    temperature_c=maybe_float,
    sm_clock_mhz=maybe_float,
    throttle_reasons=st.lists(st.sampled_from(["sw_power_cap", "hw_slowdown", "sw_thermal"]), max_size=3),
    ecc_sbe_volatile=maybe_int,
    ecc_dbe_volatile=maybe_int,
    pcie_replay_count=maybe_int,
)
samples = st.builds(
    NodeSample,
    cluster=st.sampled_from(["c1", "eu-west"]),
    node=st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True),
    seq=st.integers(min_value=0, max_value=2**53),
    observed_at=st.floats(min_value=1.6e9, max_value=2.0e9, allow_nan=False),
    interval_s=st.floats(min_value=0.1, max_value=60.0, allow_nan=False),
    gpus=st.lists(gpus, min_size=1, max_size=8),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(samples, min_size=1, max_size=12))
def test_the_bulk_decode_stores_exactly_what_the_per_message_decode_stores(batch: list[NodeSample]) -> None:
    bodies = [encode(s, source="agent")[1] for s in batch]
    ids = [f"id-{n}" for n in range(len(batch))]
    bulk = sample_table(bodies, ids)
    strict = strict_table(bodies, ids)
    assert bulk.schema == strict.schema
    assert bulk.equals(strict), (bulk.to_pylist()[:2], strict.to_pylist()[:2])


GOOD = (
    b'{"cluster":"c1","node":"n1","seq":1,"observed_at":1.7e9,"interval_s":10,'
    b'"gpus":[{"index":0,"uuid":"u","throttle_reasons":[]}]}'
)
REFUSED_BY_BOTH = [
    b'{"cluster":"c1"}',  # required fields missing
    b'["not", "an", "object"]',
    b'{"cluster":"c1","node":"n1","seq":1,"observed_at":1.7e9,"interval_s":10,"gpus":"not a list"}',
    b'{"cluster":"c1","node":"n1","seq":1,"observed_at":1.7e9,"interval_s":10,"gpus":[null]}',
    b'{"cluster":"c1","node":null,"seq":1,"observed_at":1.7e9,"interval_s":10,"gpus":[{"index":0,"uuid":"u"}]}',
    b'{"cluster":"c1","node":"n1","seq":1,"observed_at":1.7e9,"interval_s":10,"gpus":[{"uuid":"u"}]}',
    b'{"cluster":"c1","node":"n1","seq":1,"observed_at":1.7e9,"interval_s":10,"gpus":[{"index":1.5,"uuid":"u"}]}',
    b'{"cluster":"c1","node":"n1","seq":1,"observed_at":1.7e9,"interval_s":10,'
    b'"gpus":[{"index":0,"uuid":"u","power_w":"high"}]}',
    b'{"cluster":"c1","node":"n1","seq":1,"observed_at":1.7e9,"interval_s":10,'
    b'"gpus":[{"index":0,"uuid":"u","throttle_reasons":null}]}',
    GOOD + b'{"cluster":"c1"}',  # two objects where one belongs: every later id would shift
    GOOD[:-5],  # truncated
    b"",
]
# The strict decode takes these; the bulk one hands them to it rather than guess.
LEFT_TO_THE_STRICT_DECODE = [
    GOOD.replace(b",", b",\n"),  # pretty-printed: one body over several lines
    GOOD.replace(b'"seq":1', b'"seq":-1'),  # negative where the column is unsigned
]


@pytest.mark.parametrize("body", REFUSED_BY_BOTH + LEFT_TO_THE_STRICT_DECODE)
def test_a_batch_with_one_sample_the_bulk_decode_cannot_vouch_for_is_refused_whole(body: bytes) -> None:
    with pytest.raises(BatchRefused):
        sample_table([GOOD, body, GOOD], ["a", "b", "c"])


@pytest.mark.parametrize("body", REFUSED_BY_BOTH)
def test_the_strict_decode_refuses_them_too_so_they_are_dead_lettered(body: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        _strict.decode(body)


def test_fields_the_warehouse_does_not_keep_are_skipped_whatever_their_shape() -> None:
    body = GOOD.replace(b'"uuid":"u"', b'"uuid":"u","nvlink":[{"link":0,"crc":[1,2]}],"processes":[{"pid":7}]')
    body = body.replace(b'"seq":1', b'"seq":1,"labels":{"a":"b"},"type":"io.chamber.telemetry.node_sample.v1"')
    table = sample_table([body], ["a"])
    assert table.equals(strict_table([body], ["a"]))
    assert table.num_rows == 1 and table.column("gpu_uuid").to_pylist() == ["u"]


def test_full_precision_readings_round_to_the_same_float32_and_milliseconds() -> None:
    rng = random.Random(7)
    batch = [
        NodeSample(
            cluster="c1",
            node="n1",
            seq=i,
            observed_at=rng.uniform(1.6e9, 2.0e9),
            interval_s=rng.uniform(0.1, 60.0),
            gpus=[
                GpuSample(index=g, uuid="u", utilization_pct=rng.uniform(0, 100), power_w=rng.expovariate(0.01))
                for g in range(8)
            ],
        )
        for i in range(500)
    ]
    bodies = [encode(s, source="agent")[1] for s in batch]
    ids = [str(i) for i in range(len(batch))]
    assert sample_table(bodies, ids).equals(strict_table(bodies, ids))


def test_a_left_out_throttle_reasons_is_the_empty_default_in_both_decodes() -> None:
    compact = GOOD.replace(b',"throttle_reasons":[]', b"")  # the compact form leaves defaults out
    table = sample_table([GOOD, compact], ["a", "b"])
    assert table.equals(strict_table([GOOD, compact], ["a", "b"]))
    assert table.column("throttle_reasons").to_pylist() == [[], []]


def test_a_subject_rate_counts_per_subject_and_minute_of_the_servers_clock() -> None:
    from services.recorder.samples import SubjectRate

    minute = 60 * 10**9
    rate = SubjectRate(per_minute=3)
    t0 = 1_800_000_000 * 10**9 // minute * minute
    assert [rate.admit("a", t0 + i) for i in range(5)] == [True, True, True, False, False]
    assert rate.admit("b", t0)  # another subject: its own count
    assert rate.admit("a", t0 - minute)  # an older message arriving late is not held against this minute
    assert [rate.admit("a", t0 + minute + i) for i in range(4)] == [True, True, True, False]
    assert rate.refused == {"a": 3}
