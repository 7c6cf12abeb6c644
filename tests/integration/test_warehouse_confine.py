"""Analytics SQL (the recorder's `chamber.cmd.recorder.sql`, `chamber sql`) sees the `chamber`
database and nothing else, on the real chDB engine: what an attacker on the host tried (issue 16)."""

from __future__ import annotations

import argparse
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli.errors import UsageError
from services.gateway.history import efficiency_sql
from services.recorder.service import answer_sql
from services.runtime.commands import CommandRefused
from services.warehouse import WarehouseError, migrate
from services.warehouse.access import read_query
from services.warehouse.analytics import Limits, confined_query
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.confine import Catalog, OutsideTheWarehouse, ReadOnlyViolation, check_tree, nodes_from_explain
from services.warehouse.door import SqlDoor, open_door

pytestmark = pytest.mark.integration


@pytest.fixture
def loopback() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 that records every request it gets."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"secret,1\n")

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def warehouse(tmp_path: Path) -> Iterator[ChdbWarehouse]:
    wh = ChdbWarehouse(tmp_path / "data")
    migrate(wh)
    try:
        yield wh
    finally:
        wh.close()


@pytest.fixture
def door(warehouse: ChdbWarehouse) -> Iterator[SqlDoor]:
    sql_door = open_door(warehouse)
    try:
        yield sql_door
    finally:
        sql_door.close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "api-token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("s3cr3t-token")
    return path


def attacks(base: str, token: Path) -> list[str]:
    return [
        "SELECT * FROM file('/etc/passwd', 'LineAsString')",
        "SELECT * FROM file('/proc/self/environ', 'RawBLOB')",
        f"SELECT * FROM file('{token}', 'RawBLOB')",
        "SELECT * FROM file('/etc/*', 'LineAsString')",
        "SELECT file('/etc/passwd')",  # the scalar function of the same name
        "select * from FILE('/etc/passwd', 'LineAsString')",
        "DESCRIBE TABLE file('/etc/passwd', 'LineAsString')",
        f"SELECT * FROM url('{base}/', 'CSV', 'a String, b Int32')",
        f"SELECT count() FROM events WHERE id IN (SELECT a FROM url('{base}/in', 'CSV', 'a String'))",
        f"WITH leak AS (SELECT * FROM url('{base}/cte', 'LineAsString')) SELECT * FROM leak",
        f"EXPLAIN PIPELINE SELECT * FROM url('{base}/explain', 'LineAsString')",
        "SELECT * FROM remote('127.0.0.1:9000', system.one)",
        "SELECT * FROM remoteSecure('127.0.0.1:9440', system.one)",
        f"SELECT * FROM s3('{base}/bucket/key.csv', 'CSV', 'a String')",
        "SELECT * FROM hdfs('hdfs://127.0.0.1:9000/x', 'CSV', 'a String')",
        "SELECT * FROM mysql('127.0.0.1:3306', 'db', 't', 'u', 'p')",
        "SELECT * FROM postgresql('127.0.0.1:5432', 'db', 't', 'u', 'p')",
        "SELECT * FROM jdbc('jdbc:x', 't')",
        "SELECT * FROM odbc('DSN=x', 't')",
        "SELECT * FROM executable('cat /etc/passwd', 'LineAsString', 'a String')",
        "SELECT * FROM input('a String')",
        "SELECT * FROM cluster('default', system.one)",
        "SELECT * FROM merge('system', '.*')",
        "SELECT * FROM dictionary('d')",
        "SELECT dictGet('d', 'a', toUInt64(1))",
        "SELECT joinGet('system.one', 'dummy', 0)",
        "SELECT * FROM system.tables",
        "SELECT name FROM information_schema.tables",
        "SELECT * FROM chamber.events AS e JOIN system.users AS u ON 1 = 1",
        "SELECT 1 IN system.one",
        "EXISTS TABLE system.tables",
        "SHOW DATABASES",
        "SHOW TABLES FROM system",
        "SHOW CREATE TABLE system.users",
        "SHOW PROCESSLIST",
        "SELECT hostName()",
        "SELECT getServerSetting('path')",
        "SELECT getOSKernelVersion()",
        "SELECT FQDN(), currentUser()",
        "SELECT filesystemAvailable()",
        "SELECT showCertificate()",
        "SELECT aiGenerate('say hi')",
        "SELECT addressToSymbol(toUInt64(1))",
    ]


async def test_every_function_that_reaches_outside_is_refused_with_a_clear_message(
    door: SqlDoor, token_file: Path, loopback: tuple[str, list[str]]
) -> None:
    base, seen = loopback
    for sql in attacks(base, token_file):
        with pytest.raises(CommandRefused) as refused:
            await answer_sql(door, sql)
        message = str(refused.value)
        assert message.startswith("refused:"), (sql, message)
        assert "s3cr3t" not in message and "root:" not in message
    assert seen == []  # not one request reached the loopback server
    # a line break in a name cannot forge nodes of the JSON tree: it stays a name
    assert (await answer_sql(door, "SELECT 1 AS `a\nFunction numbers`"))["columns"] == ["a\nFunction numbers"]


async def test_queries_on_the_chamber_database_still_run(door: SqlDoor) -> None:
    for sql in [
        "SELECT count() AS n FROM events",
        "SELECT count() FROM chamber.gpu_samples FINAL",
        efficiency_sql(0.0, 3600.0, 60),  # the gateway's history: a parameterized view
        "SELECT number FROM numbers(3)",
        "SELECT concat('a', 'b'), format('{} of {}', 'a', 'b')",
        "DESCRIBE TABLE events",
        "EXISTS TABLE events",
        "SHOW TABLES",
        "EXPLAIN SELECT count() FROM events",
    ]:
        answer = await answer_sql(door, sql)
        assert answer["columns"], sql
    tables = await answer_sql(door, "SHOW TABLES")
    assert ["events"] in tables["rows"]


def test_chamber_sql_opening_the_warehouse_itself_is_confined_too(
    tmp_path: Path, warehouse: ChdbWarehouse, token_file: Path
) -> None:
    warehouse.close()  # `chamber sql` opens it when no recorder holds it
    args = argparse.Namespace(nats="nats://127.0.0.1:1", clickhouse_url=None, data_dir=tmp_path / "data")
    with pytest.raises(UsageError, match="refused: table function file"):
        read_query(args, f"SELECT * FROM file('{token_file}', 'RawBLOB')")
    assert read_query(args, "SELECT count() AS n FROM events")["rows"] == [[0]]


def test_the_engine_itself_refuses_what_the_parse_check_would_miss(warehouse: ChdbWarehouse) -> None:
    """The second guard: the analytics session runs with readonly = 1, set when it opened: no table
    function that reads outside, no write, no change of a setting, whatever the check let through."""
    session = warehouse.open_analytics(Limits())
    try:
        for sql in [
            "SELECT * FROM file('/etc/passwd', 'LineAsString')",
            "INSERT INTO budgets (team) SELECT 'x'",
            "SET readonly = 0",
            "SET max_execution_time = 3600",
            "SELECT 1 SETTINGS max_memory_usage = 0",
            "CREATE TABLE chamber.x (a Int8) ENGINE = Memory",
        ]:
            with pytest.raises(WarehouseError, match=r"(?i)readonly"):
                session.run(sql, 10)
        session.run("USE system", 10)  # allowed by the engine, and undone before the next query
        assert session.run("SELECT currentDatabase(), getSetting('readonly')", 10).rows == [["chamber", 1]]
    finally:
        session.close()
    assert warehouse.count("budgets") == 0
    assert warehouse.query("SELECT getSetting('readonly')").scalar() == 0  # ingest's session is untouched


def test_every_query_runs_within_rows_time_and_memory(warehouse: ChdbWarehouse) -> None:
    def run(sql: str, limits: Limits) -> list[list[object]]:
        session = warehouse.open_analytics(limits)
        try:
            return confined_query(session, sql, max_rows=10).rows
        finally:
            session.close()

    rows = run("SELECT number FROM numbers(1000000000)", Limits())
    assert 10 < len(rows) < 1_000_000  # stopped near the limit instead of reading a billion rows
    with pytest.raises(WarehouseError, match=r"(?i)timeout|time limit"):
        run(
            "SELECT count() FROM numbers(100000000000) WHERE cityHash64(number) % 7 = 3", Limits(max_execution_time_s=1)
        )
    with pytest.raises(WarehouseError, match=r"(?i)memory limit"):
        run("SELECT length(groupArray(number)) FROM numbers(50000000)", Limits(max_memory_bytes=16 * 1024**2))
    assert run("SELECT 7 AS x", Limits()) == [[7]]


async def test_the_door_names_the_limit_a_query_ran_into(warehouse: ChdbWarehouse) -> None:
    door = open_door(warehouse, limits=Limits(max_execution_time_s=1))
    try:
        with pytest.raises(WarehouseError, match=r"ran past its time limit of 1 s \(max_execution_time\)"):
            await door.answer("SELECT count() FROM numbers(100000000000) WHERE cityHash64(number) % 7 = 3", 10)
        assert (await door.answer("SELECT 7 AS x", 1)).rows == [[7]]  # nothing left behind for the next one
    finally:
        door.close()


CATALOG = Catalog(frozenset({"file", "numbers"}), frozenset({"system"}), frozenset({"events"}))


def test_a_name_with_a_line_break_cannot_forge_nodes_of_the_tree() -> None:
    forged = ["SelectWithUnionQuery (children 1)", " ExpressionList (children 1)", "  Identifier a", "Function x"]
    with pytest.raises(OutsideTheWarehouse, match="line breaks"):
        check_tree(nodes_from_explain(forged), CATALOG)


def test_format_and_into_outfile_are_refused_on_a_servers_tree_too() -> None:
    """What a server's EXPLAIN AST gives for `SELECT 1 INTO OUTFILE '/tmp/x'`."""
    tree = ["SelectWithUnionQuery (children 2)", " ExpressionList (children 1)", "  SelectQuery (children 1)"]
    tree += ["   ExpressionList (children 1)", "    Literal UInt64_1", " Literal '/tmp/x'"]
    with pytest.raises(ReadOnlyViolation, match="INTO OUTFILE"):
        check_tree(nodes_from_explain(tree), CATALOG)
