"""The one way the CLI prints a table: columns as wide as their widest cell, two spaces apart."""

from __future__ import annotations

from collections.abc import Sequence


def table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1, align: str = "") -> str:
    """The first `left` columns left-aligned (names), the rest right-aligned (numbers); or `align`, one
    letter a column (`l` or `r`). No trailing blanks, so a last free-text column is not padded."""
    align = align or "l" * left + "r" * (len(header) - left)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        cols = zip(cells, widths, align, strict=True)
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in cols)

    return "\n".join(line(r).rstrip() for r in [header, *rows])
