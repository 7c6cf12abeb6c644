"""The SQL door's checks on the engine's tree (pure: trees as the engine gives them, recorded)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.warehouse.confine import (
    Catalog,
    ReadOnlyViolation,
    check_tree,
    explain_parse_error,
    is_simple_statement,
    nodes_from_explain,
    nodes_from_json,
    refused_text,
    sql_literal,
)

CATALOG = Catalog.from_rows(
    ["file", "numbers", "url", "format"],
    ["chamber", "system", "default"],
    ["events", "efficiency"],
    [("hostName", "", "Other"), ("hostname", "hostName", ""), ("aiGenerate", "", "AI"), ("plus", "", "Arithmetic")],
)


def select(*items: dict[str, object], **top: object) -> dict[str, object]:
    """parseQueryToJSON's shape of `SELECT items`."""
    query = {"type": "SelectQuery", "select": {"type": "ExpressionList", "children": list(items)}}
    return {"type": "SelectWithUnionQuery", "list_of_selects": {"type": "ExpressionList", "children": [query]}, **top}


def function(name: str, **more: object) -> dict[str, object]:
    return {"type": "Function", "name": name, "arguments": {"type": "ExpressionList"}, **more}


def from_table(tree: dict[str, object], table: dict[str, object]) -> dict[str, object]:
    element = {"type": "TablesInSelectQueryElement", "table_expression": {"type": "TableExpression", **table}}
    tree["list_of_selects"]["children"][0]["tables"] = {"type": "TablesInSelectQuery", "children": [element]}  # type: ignore[index]
    return tree


def refusal(tree: dict[str, object]) -> str:
    with pytest.raises(ReadOnlyViolation) as refused:
        check_tree(nodes_from_json(tree), CATALOG)
    return str(refused.value)


def test_a_plain_select_on_chamber_passes() -> None:
    tree = from_table(
        select(function("plus")), {"database_and_table_name": {"type": "TableIdentifier", "name": "events"}}
    )
    check_tree(nodes_from_json(tree), CATALOG)
    check_tree(nodes_from_json(from_table(select(), {"table_function": function("numbers")})), CATALOG)
    check_tree(nodes_from_json(from_table(select(), {"table_function": function("efficiency")})), CATALOG)


def test_what_reaches_outside_is_refused() -> None:
    assert "table function file()" in refusal(from_table(select(), {"table_function": function("file")}))
    system: dict[str, object] = {"database_and_table_name": {"type": "TableIdentifier", "name": "system.users"}}
    assert "system.users is in another database" in refusal(from_table(select(), system))
    assert "another database" in refusal(select({"type": "Identifier", "name": "default.x"}))
    for name in ("hostName", "hostname", "HOSTNAME", "aiGenerate", "dictGet", "getServerSetting", "url"):
        assert f"function {name}()" in refusal(select(function(name))), name


def test_a_function_called_through_apply_is_checked_like_any_other() -> None:
    def applying(transformer: dict[str, object]) -> dict[str, object]:
        columns = {"type": "ColumnsTransformerList", "children": [{"type": "ColumnsApplyTransformer", **transformer}]}
        return select({"type": "Asterisk", "transformers": columns})

    assert "function hostName()" in refusal(applying({"func_name": "hostName"}))
    assert "function hostName()" in refusal(applying({"lambda": function("hostName")}))
    check_tree(nodes_from_json(applying({"func_name": "plus"})), CATALOG)
    server_tree = ["SelectWithUnionQuery (children 1)", " ExpressionList (children 1)", "  SelectQuery (children 1)"]
    server_tree += ["   ExpressionList (children 1)", "    Asterisk (children 1)", "     ColumnsTransformerList"]
    server_tree += ["      ColumnsApplyTransformer"]
    with pytest.raises(ReadOnlyViolation, match="APPLY is not accepted on a ClickHouse server"):
        check_tree(nodes_from_explain(server_tree), CATALOG)


def test_statements_settings_and_output_clauses_are_refused() -> None:
    assert "DROP is not accepted" in refusal({"type": "DropQuery"})
    assert "ATTACH is not accepted" in refusal({"type": "CreateQuery", "attach": True})
    assert "CREATE is not accepted" in refusal({"type": "CreateQuery", "attach": False})
    assert "SYSTEM is not accepted" in refusal({"type": "SystemQuery"})
    assert "USE is not accepted" in refusal({"type": "UseQuery"})
    assert "SETTINGS" in refusal(select(settings={"type": "SetQuery", "changes": []}))
    assert "FORMAT" in refusal(select(format_ast={"type": "Identifier", "name": "CSV"}))
    assert "INTO OUTFILE" in refusal(select(out_file={"type": "Literal"}))
    assert "only EXPLAIN of a SELECT" in refusal(
        {"type": "ExplainQuery", "kind": "EXPLAIN", "query": {"type": "InsertQuery"}}
    )
    check_tree(nodes_from_json({"type": "ExplainQuery", "kind": "EXPLAIN PIPELINE", "query": select()}), CATALOG)


def test_the_engines_parse_errors_become_refusals_a_person_can_act_on() -> None:
    multi = "Code: 62. DB::Exception: Syntax error (Multi-statements are not allowed): failed at position 9"
    assert "only one statement" in str(explain_parse_error(multi))
    assert "DESCRIBE is not accepted" in str(
        explain_parse_error("AST node of type 'DescribeQuery' does not support JSON serialization")
    )
    assert "SHOW CREATE TABLE is not accepted" in str(
        explain_parse_error("AST node of type 'ShowCreateTableQuery_system_users' does not support JSON")
    )


@pytest.mark.parametrize(
    "sql", ["SHOW TABLES", " show tables; ", "DESCRIBE TABLE events", "desc events", "EXISTS chamber.x"]
)
def test_plain_statements_without_a_tree_are_matched_whole(sql: str) -> None:
    assert is_simple_statement(sql)


@pytest.mark.parametrize(
    "sql",
    ["SHOW TABLES FROM system", "DESCRIBE TABLE system.users", "DESCRIBE file('/etc/passwd')", "SHOW TABLES -- x",
     "EXISTS TABLE x; DROP TABLE y", "DESCRIBE `events`"],
)  # fmt: skip
def test_anything_more_than_the_plain_form_goes_to_the_parser(sql: str) -> None:
    assert not is_simple_statement(sql)


def test_texts_the_parser_is_not_given() -> None:
    assert "empty query" in str(refused_text(" ; "))
    assert "NUL" in str(refused_text("SELECT 1\x00; DROP TABLE x"))
    assert "more than" in str(refused_text("SELECT " + "1" * 70_000))
    assert refused_text("SELECT 'ü'") is None


@given(st.text())
def test_a_literal_holds_any_text_and_ends_only_at_its_own_quote(text: str) -> None:
    literal = sql_literal(text)
    body = literal[1:-1]
    assert literal[0] == literal[-1] == "'"
    # every quote inside is escaped by an odd run of backslashes
    i = 0
    while i < len(body):
        if body[i] == "\\":
            i += 2
            continue
        assert body[i] != "'"
        i += 1
