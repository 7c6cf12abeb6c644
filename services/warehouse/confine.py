"""Analytics SQL is decided on what ClickHouse itself parsed, and sees the `chamber` database only.

No second parser: the engine parses the text and the check reads the engine's tree. On chDB that is
`parseQueryToJSON('…')`, where the user's text travels as one string literal (so nothing of it runs
while it is checked); the function refuses a second statement ("Multi-statements are not allowed")
and inline INSERT data, so the text that passes is exactly one statement, and that same text is what
runs afterwards. A ClickHouse server (24.8 has no parseQueryToJSON) gives `EXPLAIN AST`; its HTTP
interface runs one statement per request, so a second statement cannot ride along there either.

The tree is accepted when its root is a SELECT (with WITH / UNION) or an EXPLAIN of one, and:
- every table it names is in `chamber` (no `system.*`, `information_schema.*`, `default.*`),
- every table function only generates rows (`numbers`, `values`, ...: an allow-list, so one the
  engine adds later is refused),
- no function reaches outside the query or tells host facts (`file()`, `dictGet*`, `hostName()`,
  `getServerSetting()`, `getOSKernelVersion()`, the AI, dictionary and introspection categories),
- it carries no SETTINGS, FORMAT or INTO OUTFILE.
Three statements without a tree of their own (parseQueryToJSON has none for them) pass when the
whole text is exactly their plain form: `SHOW TABLES`, `DESCRIBE [TABLE] name`, `EXISTS [TABLE] name`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from services.warehouse.backend import DATABASE

MAX_QUERY_CHARS = 64 * 1024  # well below the engine's max_query_size, so it never cuts a text short

ACCEPTED = "SELECT / WITH, EXPLAIN of a SELECT, SHOW TABLES, DESCRIBE TABLE name and EXISTS TABLE name"

# Table functions that only generate rows from their arguments; every other one is refused.
SAFE_TABLE_FUNCTIONS = frozenset(
    {"numbers", "numbers_mt", "zeros", "zeros_mt", "values", "generate_series", "generateseries", "primes"}
)
# Scalar functions that read files, Join tables, models or other tables by name.
OUTSIDE_FUNCTIONS = frozenset(
    {"file", "joinget", "joingetornull", "hascolumnintable", "catboostevaluate", "evalmlmethod", "fuzzquery"}
)
# Scalar functions that tell facts about the host, the server or other sessions: names, paths,
# kernel, disks, users, certificates, ports, query ids.
HOST_FACT_FUNCTIONS = frozenset(
    {
        "hostname", "fqdn", "fullhostname", "getserversetting", "getmergetreesetting", "getoskernelversion",
        "uptime", "serveruuid", "displayname", "getmacro", "tcpport", "getserverport", "filesystemavailable",
        "filesystemcapacity", "filesystemunreserved", "currentuser", "authenticateduser", "user",
        "current_user", "session_user", "authuser", "currentprofiles", "enabledprofiles", "defaultprofiles",
        "currentroles", "enabledroles", "defaultroles", "zookeepersessionuptime", "getclienthttpheader",
        "currentrequesturl", "currenthandler", "showcertificate", "buildid", "revision", "connectionid",
        "connection_id", "initialqueryid", "queryid", "currentqueryid", "initialquerystarttime",
        "hasthreadfuzzer", "globalvariable", "transactionid", "transactionlatestsnapshot",
        "transactionoldestsnapshot", "shardnum", "shardcount", "pggetuserbyid", "pg_get_userbyid",
        "getmaxtablenamelengthfordatabase", "currentschemas", "current_schemas",
    }
)  # fmt: skip
# Whole categories of system.functions that reach outside: models, dictionaries (external sources),
# AI calls (network), the process's own memory.
DENIED_CATEGORIES = frozenset({"AI", "Dictionary", "Embedded Dictionary", "Introspection", "Machine Learning"})

# Statements that have no JSON tree; accepted only as exactly this plain text.
_SIMPLE = re.compile(
    rf"\s*(?:SHOW\s+TABLES|(?:DESCRIBE|DESC|EXISTS)(?:\s+TABLE)?\s+(?:{DATABASE}\.)?[A-Za-z_][A-Za-z0-9_]*)\s*;?\s*",
    re.IGNORECASE,
)
# JSON types named as EXPLAIN AST names them, so one check reads both trees.
_JSON_KINDS = {"SetQuery": "Set", "ExplainQuery": "Explain", "ShowTablesQuery": "ShowTables"}
_EXPLAIN_KINDS = frozenset(
    {"EXPLAIN", "EXPLAIN AST", "EXPLAIN SYNTAX", "EXPLAIN QUERY TREE", "EXPLAIN PLAN", "EXPLAIN PIPELINE",
     "EXPLAIN ESTIMATE"}
)  # fmt: skip
# Keys of the JSON tree that send results elsewhere or in a chosen form.
_OUTPUT_KEYS = frozenset({"format_ast", "out_file", "compression", "compression_level"})
_LINE = re.compile(r"^( *)([A-Za-z]+)(?: (.*))?$")


class ReadOnlyViolation(ValueError):
    """Not an accepted read-only query; the message says what was refused and what is accepted."""


class OutsideTheWarehouse(ReadOnlyViolation):
    """The query reaches beyond the `chamber` database; the message says what and why."""


@dataclass(frozen=True)
class Catalog:
    """What the engine offers, read once: table functions, other databases, the chamber database's
    tables and views (parameterized views are called like functions), and the functions refused."""

    table_functions: frozenset[str]
    other_databases: frozenset[str]
    views: frozenset[str]
    denied_functions: frozenset[str] = OUTSIDE_FUNCTIONS | HOST_FACT_FUNCTIONS

    @classmethod
    def from_rows(
        cls,
        table_functions: Iterable[str],
        databases: Iterable[str],
        tables: Iterable[str],
        functions: Iterable[tuple[str, str, str]],
    ) -> Catalog:
        """`functions`: (name, alias_to, categories) from system.functions."""
        functions = list(functions)
        denied = set(OUTSIDE_FUNCTIONS | HOST_FACT_FUNCTIONS)
        denied |= {n.lower() for n, _, cats in functions if DENIED_CATEGORIES & set(cats.split(", "))}
        denied |= {n.lower() for n, _, _ in functions if n.lower().startswith("dict")}
        denied |= {n.lower() for n, alias, _ in functions if alias and alias.lower() in denied}
        return cls(
            frozenset(t.lower() for t in table_functions),
            frozenset(d for d in databases if d != DATABASE),
            frozenset(tables),
            frozenset(denied),
        )


@dataclass(frozen=True)
class Node:
    """One node of the engine's tree: its kind, its name (a function, table or identifier), how deep
    it sits, the kind of its parent and, from the JSON tree, the key it sits under."""

    depth: int
    kind: str
    name: str = ""
    parent: str = ""
    key: str = ""
    detail: str = ""  # the EXPLAIN kind; in the JSON tree a flag that sends output elsewhere


def refused_text(sql: str) -> str | None:
    """Why the text cannot even be handed to the parser, or None."""
    if not sql.strip().strip(";").strip():
        return f"empty query; pass one statement: {ACCEPTED}"
    if len(sql) > MAX_QUERY_CHARS:
        return f"refused: the query is {len(sql)} characters, more than {MAX_QUERY_CHARS}"
    if "\x00" in sql:
        return "refused: NUL characters are not accepted"
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError:
        return "refused: the text is not valid UTF-8"
    return None


def is_simple_statement(sql: str) -> bool:
    """SHOW TABLES, DESCRIBE / EXISTS of a plain table name of `chamber`: the whole text, nothing else."""
    return _SIMPLE.fullmatch(sql) is not None


def sql_literal(text: str) -> str:
    """`text` as one ClickHouse string literal: every backslash and quote escaped, so it cannot end early."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def nodes_from_json(tree: Any) -> list[Node]:
    """The nodes of parseQueryToJSON's tree, parents before children."""

    def walk(node: dict[str, Any], depth: int, parent: str, key: str) -> Iterator[Node]:
        kind = _JSON_KINDS.get(str(node["type"]), str(node["type"]))
        if kind == "Explain":
            detail = str(node.get("kind", ""))
        elif node.get("is_into_outfile_with_stdout"):
            detail = "outfile"
        else:
            detail = "attach" if node.get("attach") is True else ""
        # `* APPLY f` names its function in `func_name`, not as a Function node
        name = node.get("func_name") if kind == "ColumnsApplyTransformer" else node.get("name")
        yield Node(depth, kind, name if isinstance(name, str) else "", parent, key, detail)
        for child_key, value in node.items():
            children = value if isinstance(value, list) else [value]
            for child in children:
                if isinstance(child, dict) and "type" in child:
                    yield from walk(child, depth + 1, kind, child_key)

    if not isinstance(tree, dict) or "type" not in tree:
        raise ReadOnlyViolation("refused: the engine gave no tree for this query")
    return list(walk(tree, 0, "", ""))


def nodes_from_explain(lines: list[str]) -> list[Node]:
    """`EXPLAIN AST` output (a server), one node per line, indented one space per level."""
    nodes: list[Node] = []
    parents: list[str] = []
    for i, line in enumerate(lines):
        match = _LINE.match(line)
        if match is None or (i > 0 and not match.group(1)) or (i == 0 and match.group(1)):
            # only a quoted name with a line break in it makes such a line
            raise OutsideTheWarehouse("refused: names with line breaks are not accepted")
        depth, kind, text = len(match.group(1)), match.group(2), match.group(3) or ""
        del parents[depth:]
        name = text.split(" ", 1)[0] if text else ""
        detail = text.split(" (", 1)[0] if kind == "Explain" else ""
        nodes.append(
            Node(depth, kind, name if not name.startswith("(") else "", parents[-1] if parents else "", "", detail)
        )
        parents.append(kind)
    if not nodes:
        raise OutsideTheWarehouse("empty query")
    return nodes


def _refuse(what: str) -> OutsideTheWarehouse:
    return OutsideTheWarehouse(f"refused: {what}; analytics SQL reads the {DATABASE} database only")


def _statement_name(kind: str, nodes: list[Node]) -> str:
    if kind == "CreateQuery" and nodes and nodes[0].detail == "attach":
        return "ATTACH"
    words = re.sub(r"(Query)+$", "", kind)
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", words).upper() or kind


def check_tree(nodes: list[Node], catalog: Catalog) -> None:
    """Raise ReadOnlyViolation unless the parsed query is one read-only query on `chamber`."""
    root = nodes[0]
    from_explain_ast = all(not n.key for n in nodes)  # a server's tree: no JSON keys
    if root.kind == "Explain":
        explained = [n for n in nodes if n.depth == 1 and n.kind != "Set"]
        if root.detail.upper() not in _EXPLAIN_KINDS:
            raise ReadOnlyViolation(f"refused: {root.detail or 'this EXPLAIN'} is not accepted; use {ACCEPTED}")
        if [n.kind for n in explained] != ["SelectWithUnionQuery"]:
            raise ReadOnlyViolation(f"refused: only EXPLAIN of a SELECT is accepted; use {ACCEPTED}")
    elif root.kind == "ShowTables":
        raise ReadOnlyViolation(f"refused: of the SHOW statements only a plain SHOW TABLES is accepted; use {ACCEPTED}")
    elif root.kind != "SelectWithUnionQuery":
        raise ReadOnlyViolation(
            f"refused: {_statement_name(root.kind, nodes)} is not accepted; the warehouse is read-only here: "
            f"use {ACCEPTED}"
        )
    elif from_explain_ast and [n.kind for n in nodes if n.depth == 1] != ["ExpressionList"]:
        # what follows the selects at the top is a FORMAT name or an INTO OUTFILE path (JSON: their keys)
        raise ReadOnlyViolation("refused: FORMAT and INTO OUTFILE are not accepted; the tool formats the results")
    for node in nodes:
        name, lowered = node.name, node.name.lower()
        if node.key in _OUTPUT_KEYS or node.detail == "outfile":
            raise ReadOnlyViolation("refused: FORMAT and INTO OUTFILE are not accepted; the tool formats the results")
        if node.kind == "Set":
            raise ReadOnlyViolation("refused: SETTINGS are not accepted; every query runs with the warehouse's limits")
        if node.kind in ("TableIdentifier", "Identifier") and "." in name:
            database = name.split(".", 1)[0]
            if database in catalog.other_databases or (node.kind == "TableIdentifier" and database != DATABASE):
                raise _refuse(f"{name} is in another database")
        if node.kind == "ColumnsApplyTransformer" and from_explain_ast:
            # a server's EXPLAIN AST shows neither the function nor the lambda that APPLY calls
            raise ReadOnlyViolation("refused: APPLY is not accepted on a ClickHouse server; call the function by name")
        if node.kind == "ColumnsApplyTransformer" and not name:
            continue  # `APPLY(x -> ...)`: the lambda's own nodes follow and are checked
        if node.kind not in ("Function", "ColumnsApplyTransformer"):
            continue
        own = name.removeprefix(f"{DATABASE}.") in catalog.views
        if node.parent == "TableExpression" and not (lowered in SAFE_TABLE_FUNCTIONS or own):
            raise _refuse(
                f"table function {name}() reads outside the warehouse (files, URLs, other servers or processes)"
            )
        if own:
            continue
        if lowered in catalog.denied_functions or lowered.startswith("dict"):
            raise _refuse(
                f"function {name}() reaches outside the query (files, dictionaries, models, facts about the host "
                "or the server)"
            )
        if node.parent != "TableExpression" and lowered in catalog.table_functions - SAFE_TABLE_FUNCTIONS - {"format"}:
            raise _refuse(f"function {name}() reaches outside the warehouse (files, URLs, other servers)")


_NOT_SERIALIZABLE = re.compile(r"AST node of type '([A-Za-z]+?)(?:_[^']*)?' does not support JSON")


def explain_parse_error(message: str) -> ReadOnlyViolation:
    """What the engine said about a text it would not parse, as a refusal a person can act on."""
    if "Multi-statements are not allowed" in message:
        return ReadOnlyViolation("refused: only one statement is accepted; remove everything after the first `;`")
    if "INSERT with inline data" in message:
        return ReadOnlyViolation(f"refused: INSERT is not accepted; the warehouse is read-only here: use {ACCEPTED}")
    kind = _NOT_SERIALIZABLE.search(message)
    if kind is not None:
        name = _statement_name(kind.group(1), [])
        return ReadOnlyViolation(f"refused: {name} is not accepted here; use {ACCEPTED}")
    text = message.split(": In scope", 1)[0].split(". (SYNTAX_ERROR)", 1)[0]
    text = text.split("DB::Exception: ", 1)[-1].strip()
    return ReadOnlyViolation(f"refused: ClickHouse cannot parse this as one query: {text[:400]}")
