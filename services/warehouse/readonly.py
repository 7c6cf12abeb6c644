"""Read-only by construction: only one query statement (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN) passes.

The check strips comments and string literals first, so a keyword inside a string cannot fool it,
and refuses a second statement after `;`. The engine then runs the query with `readonly = 2` too.
"""

from __future__ import annotations

import re

ALLOWED = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS")

_STRINGS = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`(?:[^`\\]|\\.)*`", re.S)
_COMMENTS = re.compile(r"--[^\n]*|#[^\n]*|/\*.*?\*/", re.S)
_FORBIDDEN_CLAUSES = {
    "INTO OUTFILE": "INTO OUTFILE writes a file; the results come back to you instead",
    "FORMAT": "FORMAT is chosen by the tool; use --format table|json|csv",
    "SETTINGS": "SETTINGS are not accepted here; the query runs with the warehouse's read-only settings",
}


class ReadOnlyViolation(ValueError):
    """Not a read-only query; the message says what was refused and what is accepted."""


def _skeleton(sql: str) -> str:
    """The SQL with comments removed and every literal or quoted name replaced by a placeholder."""
    out = _COMMENTS.sub(" ", _STRINGS.sub("''", sql))
    return out


def statement_words(sql: str, n: int = 3) -> list[str]:
    """The statement's first `n` words, upper-cased, outside comments and literals."""
    return [w.upper().lstrip("(") for w in _skeleton(sql).split(None, n)[:n]]


def check_read_only(sql: str) -> str:
    """Return the query (without a trailing `;`) or raise ReadOnlyViolation."""
    skeleton = _skeleton(sql).strip()
    while skeleton.endswith(";"):
        skeleton = skeleton[:-1].rstrip()
    if not skeleton:
        raise ReadOnlyViolation("empty query; pass one SELECT, WITH, SHOW, DESCRIBE or EXPLAIN statement")
    if ";" in skeleton:
        raise ReadOnlyViolation("only one statement is accepted; remove everything after the first `;`")
    first = skeleton.split(None, 1)[0].upper().lstrip("(")
    if first not in ALLOWED:
        raise ReadOnlyViolation(
            f"refused: {first} is not a query; the warehouse is read-only here, "
            "only SELECT, WITH, SHOW, DESCRIBE and EXPLAIN are accepted"
        )
    upper = " ".join(skeleton.upper().split())
    for clause, why in _FORBIDDEN_CLAUSES.items():
        if re.search(rf"\b{clause}\b(?!\s*\()", upper):  # `format(...)` is a string function
            raise ReadOnlyViolation(f"refused: {why}")
    text = sql.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    return text
