"""The on-disk spool: ordered, bounded, sheds samples before faults, survives an agent restart."""

from __future__ import annotations

from pathlib import Path

from node_agent.spool import Kind, Record, Spool


def rec(kind: Kind, n: int, size: int = 100) -> Record:
    return Record(int(kind), f"chamber.x.{n}", {"Nats-Msg-Id": f"{kind.name}-{n}"}, b"x" * size)


def drain(spool: Spool) -> list[str]:
    out = []
    while (oldest := spool.oldest()) is not None:
        n, records = oldest
        out += [r.msg_id for r in records]
        spool.done(n, len(records))
    return out


def test_records_come_back_in_order_across_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10_000_000, segment_bytes=4096)
    records = [rec(Kind.FAULT if i % 7 == 0 else Kind.SAMPLE, i) for i in range(200)]
    for i in range(0, 200, 10):
        spool.append(records[i : i + 10])
    assert len(list(tmp_path.glob("*.seg"))) > 3
    assert drain(spool) == [r.msg_id for r in records]
    assert spool.empty() and list(tmp_path.glob("*.seg")) == []
    assert spool.stats.spooled == spool.stats.flushed == 200


def test_a_partly_published_segment_keeps_the_rest(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([rec(Kind.SAMPLE, i) for i in range(10)])
    n, _ = spool.oldest()  # type: ignore[misc]
    spool.done(n, 4)
    assert [r.msg_id for r in spool.oldest()[1]] == [f"SAMPLE-{i}" for i in range(4, 10)]  # type: ignore[index]


def test_when_full_the_oldest_samples_go_first_and_faults_stay(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=20_000, segment_bytes=4096)
    appended = []
    for i in range(400):  # ~50 KB offered to a 20 KB spool
        r = rec(Kind.FAULT if i % 10 == 0 else Kind.SAMPLE, i)
        appended.append(r)
        spool.append([r])
    assert spool.bytes <= 20_000
    kept = drain(spool)
    faults = [r.msg_id for r in appended if r.kind == Kind.FAULT]
    assert [m for m in kept if m.startswith("FAULT")] == faults  # every fault kept, in order
    samples = [m for m in kept if m.startswith("SAMPLE")]
    assert samples == [r.msg_id for r in appended if r.kind == Kind.SAMPLE][-len(samples) :]  # the newest ones
    assert spool.stats.dropped_samples == 360 - len(samples) and spool.stats.dropped_faults == 0


def test_faults_are_dropped_only_when_nothing_else_is_left(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=8_000, segment_bytes=4096)
    spool.append([rec(Kind.SAMPLE, 0)])
    for i in range(200):
        spool.append([rec(Kind.FAULT, i)])
    kept = drain(spool)
    assert "SAMPLE-0" not in kept and kept == [f"FAULT-{i}" for i in range(200 - len(kept), 200)]
    assert spool.stats.dropped_samples == 1 and spool.stats.dropped_faults == 200 - len(kept) > 0


def test_a_restarted_agent_finds_its_spool_and_a_torn_last_write_is_cut(tmp_path: Path) -> None:
    first = Spool(tmp_path, segment_bytes=4096)
    first.append([rec(Kind.SAMPLE, i) for i in range(60)])
    first.close()
    last = sorted(tmp_path.glob("*.seg"))[-1]
    last.write_bytes(last.read_bytes() + b"\x00\x00\x01\x00garbage")  # a crash in the middle of a write
    again = Spool(tmp_path, segment_bytes=4096)
    assert not again.empty()
    again.append([rec(Kind.FAULT, 99)])
    assert drain(again) == [f"SAMPLE-{i}" for i in range(60)] + ["FAULT-99"]
