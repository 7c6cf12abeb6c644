"""Times and amounts in text meant for people (pure: `now` is passed in).

Reasons and explanations say when as an ISO time in UTC plus how far from now ("2026-12-01 14:05:03
UTC, in 1 min 9 s"); JSON answers keep epoch seconds. Quantities compared in a sentence are shown
with enough digits to differ, so a reason never reads "0.0 GPU-hours, more than 0.0".
"""

from __future__ import annotations

from datetime import UTC, datetime


def iso(at: float) -> str:
    """`at` (epoch seconds) as `YYYY-MM-DD HH:MM:SS UTC`."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def span(seconds: float) -> str:
    """A duration in the two largest units that matter: `45 s`, `1 min 9 s`, `2 h 5 min`, `3 d 4 h`."""
    s = round(abs(seconds))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def relative(at: float, now: float) -> str:
    """`in 1 min 9 s`, `3 h 2 min ago`, or `now`."""
    delta = at - now
    if abs(delta) < 0.5:
        return "now"
    return f"in {span(delta)}" if delta > 0 else f"{span(delta)} ago"


def when(at: float, now: float) -> str:
    """`2026-12-01 14:05:03 UTC (in 1 min 9 s)`."""
    return f"{iso(at)} ({relative(at, now)})"


def distinct(a: float, b: float, *, digits: int = 1, most: int = 6) -> tuple[str, str]:
    """`a` and `b` with the fewest decimals (at least `digits`) at which they read differently."""
    for d in range(digits, most + 1):
        x, y = f"{a:.{d}f}", f"{b:.{d}f}"
        if x != y:
            return x, y
    return f"{a:.{most}g}", f"{b:.{most}g}"
