"""Analytics SQL sees the `chamber` database and nothing else.

`readonly.py` keeps the text to one read-only statement; this module checks what the engine itself
parsed. ClickHouse's own parser (`EXPLAIN AST`, which parses and runs nothing) gives the tree the
query would run, so no second parser can disagree with the engine about what a query means. The
tree is refused when it:

- names a table of another database (`system.tables`, `information_schema...`, `default.x`),
- calls a table function other than a few that generate rows (`file`, `url`, `remote`, `s3`, `mysql`,
  `executable`, `cluster`, `merge`, `dictionary`, ... and any the engine adds later: allow-list),
- calls a function that reaches outside the query (`file()`, `dictGet*`, `joinGet`, ...),
- carries SETTINGS, or is a statement other than SELECT / DESCRIBE / EXISTS / EXPLAIN / SHOW TABLES.

The query then runs with `readonly = 1` (the engine refuses table functions that read or write
outside it, and any change of settings) and limits on time, memory and result rows (`Limits`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from services.warehouse.backend import DATABASE, QueryResult, Warehouse
from services.warehouse.readonly import ReadOnlyViolation, statement_words

# Table functions that only generate rows from their arguments; every other one is refused.
SAFE_TABLE_FUNCTIONS = frozenset(
    {"numbers", "numbers_mt", "zeros", "zeros_mt", "values", "generate_series", "generateseries", "primes"}
)
# Scalar functions named like a table function that only format a string.
_SCALAR_NAMESAKES = frozenset({"format"})
# Scalar functions that read files, dictionaries (external sources), Join tables or other databases.
OUTSIDE_FUNCTIONS = frozenset(
    {"file", "joinget", "joingetornull", "hascolumnintable", "catboostevaluate", "evalmlmethod", "fuzzquery"}
)
_ROOTS = {
    "SelectWithUnionQuery": "SELECT",
    "DescribeQuery": "DESCRIBE",
    "ExistsTableQuery": "EXISTS",
    "Explain": "EXPLAIN",
    "ShowTables": "SHOW TABLES",
}
_LINE = re.compile(r"^( *)([A-Za-z]+)(?: (.*))?$")
_ACCEPTED = "SELECT / WITH, DESCRIBE, EXISTS, EXPLAIN and SHOW TABLES"


class OutsideTheWarehouse(ReadOnlyViolation):
    """The query reaches beyond the `chamber` database; the message says what and why."""


@dataclass(frozen=True)
class Limits:
    """What every analytics query may spend. `max_rows` more rows than asked are not even read."""

    max_execution_time_s: int = 30
    max_memory_bytes: int = 2 * 1024**3
    max_rows: int = 100_000

    def settings(self, rows: int | None = None) -> dict[str, Any]:
        wanted = self.max_rows if rows is None else max(0, min(rows, self.max_rows))
        return {
            "readonly": 1,
            "max_execution_time": self.max_execution_time_s,
            "max_memory_usage": self.max_memory_bytes,
            # one row more than returned, so the caller can say "truncated"; `break` stops reading
            # there instead of failing (subqueries are not limited by it)
            "max_result_rows": wanted + 1,
            "result_overflow_mode": "break",
        }


@dataclass(frozen=True)
class Catalog:
    """What the engine offers, read once: its table functions and its other databases."""

    table_functions: frozenset[str]
    other_databases: frozenset[str]
    views: frozenset[str]  # the chamber database's (parameterized views are called like functions)

    @classmethod
    def read(cls, warehouse: Warehouse) -> Catalog:
        functions = warehouse.query("SELECT name FROM system.table_functions").rows
        databases = warehouse.query("SELECT name FROM system.databases").rows
        views = warehouse.query(f"SELECT name FROM system.tables WHERE database = '{DATABASE}'").rows
        return cls(
            frozenset(str(r[0]).lower() for r in functions),
            frozenset(str(r[0]) for r in databases if r[0] != DATABASE),
            frozenset(str(r[0]) for r in views),
        )


@dataclass(frozen=True)
class Node:
    depth: int
    kind: str
    text: str  # what follows the kind: a name, `(alias x)`, `(children n)`

    @property
    def name(self) -> str:
        return self.text.split(" ", 1)[0] if self.text else ""


def parse_tree(lines: list[str]) -> list[Node]:
    """`EXPLAIN AST` output, one node per line, indented one space per level."""
    nodes = []
    for i, line in enumerate(lines):
        match = _LINE.match(line)
        if match is None or (i > 0 and not match.group(1)) or (i == 0 and match.group(1)):
            # only a quoted name with a line break in it makes such a line
            raise OutsideTheWarehouse("refused: names with line breaks are not accepted")
        nodes.append(Node(len(match.group(1)), match.group(2), match.group(3) or ""))
    if not nodes:
        raise OutsideTheWarehouse("empty query")
    return nodes


def _refuse(what: str) -> OutsideTheWarehouse:
    return OutsideTheWarehouse(f"refused: {what}; analytics SQL reads the {DATABASE} database only")


def check_tree(nodes: list[Node], catalog: Catalog, words: list[str]) -> None:
    """Raise OutsideTheWarehouse unless the parsed query stays inside the `chamber` database.
    `words`: the statement's leading keywords (SHOW TABLES and SHOW DATABASES parse alike)."""
    root = nodes[0]
    if root.kind not in _ROOTS:
        raise OutsideTheWarehouse(f"refused: {' '.join(words[:2]) or root.kind} is not accepted here; use {_ACCEPTED}")
    if root.kind == "ShowTables" and (words[1:2] != ["TABLES"] or len(nodes) > 1):
        raise OutsideTheWarehouse(
            f"refused: of the SHOW statements only SHOW TABLES (this database) is accepted; {_ACCEPTED}"
        )
    if root.kind == "SelectWithUnionQuery" and [n.kind for n in nodes if n.depth == 1] != ["ExpressionList"]:
        # what follows the selects at the top: a FORMAT name or an INTO OUTFILE path
        raise OutsideTheWarehouse("refused: FORMAT and INTO OUTFILE are not accepted; the tool formats the results")
    external = catalog.table_functions - SAFE_TABLE_FUNCTIONS - _SCALAR_NAMESAKES
    parents: list[Node] = []
    for node in nodes:
        del parents[node.depth :]
        parent = parents[-1] if parents else None
        parents.append(node)
        name = node.name
        if node.kind == "Set":
            raise OutsideTheWarehouse(
                "refused: SETTINGS are not accepted; every query runs with the warehouse's limits"
            )
        if node.kind in ("ExistsTableQuery", "ShowCreateTableQuery"):
            database = node.text.split(" ", 1)[0]
            if database not in ("", DATABASE):
                raise _refuse(f"database {database!r} is out of reach")
        if node.kind == "TableIdentifier" and "." in name and name.split(".", 1)[0] != DATABASE:
            raise _refuse(f"table {name} is in another database")
        if node.kind == "Identifier" and "." in name and name.split(".", 1)[0] in catalog.other_databases:
            raise _refuse(f"{name} is in another database")
        if node.kind != "Function":
            continue
        lowered = name.lower()
        own = name.removeprefix(f"{DATABASE}.") in catalog.views
        if parent is not None and parent.kind == "TableExpression" and not (lowered in SAFE_TABLE_FUNCTIONS or own):
            raise _refuse(
                f"table function {name}() reads outside the warehouse (files, URLs, other servers or processes)"
            )
        if not own and (lowered in external or lowered in OUTSIDE_FUNCTIONS or lowered.startswith("dict")):
            raise _refuse(f"function {name}() reaches outside the warehouse (files, URLs, dictionaries, other servers)")


def confined_query(warehouse: Warehouse, sql: str, *, max_rows: int, limits: Limits | None = None) -> QueryResult:
    """Check `sql` (already one read-only statement: `check_read_only`) on the engine's own parse
    tree, then run it under `limits`. Blocking: call it where the warehouse's calls run."""
    limits = limits or Limits()
    catalog = getattr(warehouse, "_confine_catalog", None)
    if catalog is None:
        catalog = Catalog.read(warehouse)
        warehouse._confine_catalog = catalog  # type: ignore[attr-defined]  # fixed for an engine's life
    tree = warehouse.query(f"EXPLAIN AST {sql}")
    check_tree(parse_tree([str(r[0]) for r in tree.rows]), catalog, statement_words(sql))
    return warehouse.query(sql, readonly=True, settings=limits.settings(max_rows))
