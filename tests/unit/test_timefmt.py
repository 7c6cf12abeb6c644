"""Times and amounts in text for people: ISO in UTC plus a relative form; compared numbers that differ."""

from __future__ import annotations

from services.timefmt import distinct, iso, relative, span, when

T = 1796239017.0  # 2026-12-02 ...


def test_iso_and_relative_times() -> None:
    assert iso(0) == "1970-01-01 00:00:00 UTC"
    assert when(T + 69, T) == f"{iso(T + 69)} (in 1 min 9 s)"
    assert relative(T - 7500, T) == "2 h 5 min ago" and relative(T, T) == "now"
    assert [span(s) for s in (45, 60, 3600, 90000, 86400)] == ["45 s", "1 min", "1 h", "1 d 1 h", "1 d"]


def test_numbers_compared_in_a_sentence_never_read_the_same() -> None:
    assert distinct(0.04, 0.01) == ("0.04", "0.01")
    assert distinct(12.3, 4.5) == ("12.3", "4.5")
    assert distinct(0.0001, 0.0002) == ("0.0001", "0.0002")
    a, b = distinct(1e-9, 2e-9)
    assert a != b
