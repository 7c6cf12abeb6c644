"""`chamber sql` is read-only by construction: only one query statement passes the guard."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.warehouse.readonly import ReadOnlyViolation, check_read_only


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "  select count() from gpu_samples;  ",
        "WITH x AS (SELECT 1) SELECT * FROM x",
        "SHOW TABLES",
        "DESCRIBE TABLE events",
        "EXPLAIN SELECT 1",
        "(SELECT 1) UNION ALL (SELECT 2)",
        "SELECT 'DROP TABLE x; INSERT' AS s",  # keywords inside a literal are data
        "-- a comment\nSELECT 1",
    ],
)
def test_queries_pass(sql: str) -> None:
    assert check_read_only(sql) == sql.strip().rstrip(";").rstrip()


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("DROP TABLE events", "DROP is not a query"),
        ("insert into events select * from events", "INSERT is not a query"),
        ("ALTER TABLE events DELETE WHERE 1", "ALTER is not a query"),
        ("TRUNCATE events", "TRUNCATE is not a query"),
        ("SYSTEM STOP MERGES", "SYSTEM is not a query"),
        ("SELECT 1; DROP TABLE events", "only one statement"),
        ("/* hi */ DELETE FROM events WHERE 1", "DELETE is not a query"),
        ("SELECT * FROM events INTO OUTFILE '/tmp/x'", "INTO OUTFILE"),
        ("SELECT 1 FORMAT CSV", "--format"),
        ("SELECT 1 SETTINGS readonly = 0", "SETTINGS"),
        ("", "empty query"),
        (" ; ", "empty query"),
    ],
)
def test_anything_else_is_refused_with_a_clear_message(sql: str, says: str) -> None:
    with pytest.raises(ReadOnlyViolation, match=says):
        check_read_only(sql)


@given(st.sampled_from(["INSERT", "DROP", "ALTER", "CREATE", "RENAME", "OPTIMIZE", "KILL", "GRANT", "SET"]), st.text())
def test_a_statement_that_starts_with_a_write_is_always_refused(verb: str, rest: str) -> None:
    with pytest.raises(ReadOnlyViolation):
        check_read_only(f"{verb} {rest}")
