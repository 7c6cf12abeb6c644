"""The SQL door against smuggling, on the real chDB engine: a corpus of forms that try to run a second
statement, write, change settings or reach outside, and random mixtures of them. Each must be
refused, and the proof that nothing ran is the world afterwards: no table created, dropped or
changed, no file written, no HTTP request made, the analytics session still read-only in `chamber`,
ingest's session untouched and still storing."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.warehouse import WarehouseError, migrate
from services.warehouse.analytics import AnalyticsSession, Limits, confined_query
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.confine import SAFE_TABLE_FUNCTIONS, ReadOnlyViolation

pytestmark = pytest.mark.integration


@dataclass
class World:
    """What an executed smuggled statement would change, and how to see it."""

    warehouse: ChdbWarehouse  # ingest's session
    session: AnalyticsSession
    outside: Path  # where the corpus aims its files (the "site-packages" included)
    base: str  # a loopback HTTP server
    seen: list[str]  # the requests it got
    table_functions: list[str]

    def tables(self) -> list[list[object]]:
        return self.warehouse.query(
            "SELECT database, name, total_rows FROM system.tables "
            "WHERE database NOT IN ('system', 'INFORMATION_SCHEMA', 'information_schema') ORDER BY database, name"
        ).rows

    def files(self) -> list[Path]:
        return sorted(p for p in self.outside.rglob("*") if p.is_file())

    def session_state(self) -> list[list[object]]:
        return self.session.run(
            "SELECT currentDatabase(), getSetting('readonly'), getSetting('max_execution_time'), "
            "getSetting('max_threads')",
            1,
        ).rows


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("smuggling")
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"secret\n")

        do_HEAD = do_POST = do_PUT = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    warehouse = ChdbWarehouse(root / "data")
    migrate(warehouse)
    warehouse.command("INSERT INTO budgets (team, amount) VALUES ('vision', 100)")  # a DROP or TRUNCATE would show
    session = warehouse.open_analytics(Limits())
    outside = root / "outside"
    (outside / "site-packages").mkdir(parents=True)
    names = [str(r[0]) for r in warehouse.query("SELECT name FROM system.table_functions ORDER BY name").rows]
    try:
        yield World(warehouse, session, outside, f"http://127.0.0.1:{server.server_address[1]}", seen, names)
    finally:
        session.close()
        warehouse.close()
        server.shutdown()
        server.server_close()


def smuggled(out: Path, base: str) -> list[str]:
    """Forms that ride a second statement past a text check (comments, quotes, dollar quotes)."""
    site = out / "site-packages"
    payloads = [
        "CREATE TABLE chamber.x ENGINE = MergeTree ORDER BY tuple() AS SELECT * FROM file('/etc/hostname', "
        "'LineAsString')",
        f"INSERT INTO FUNCTION file('{out}/pwn', 'LineAsString') SELECT 'owned'",
        f"INSERT INTO FUNCTION file('{site}/pwn.pth', 'LineAsString') SELECT 'import os; os.system(\"id\")'",
        "DROP TABLE chamber.budgets",
        "TRUNCATE TABLE chamber.budgets",
        "USE default",
        "SET readonly = 0",
        "SET max_execution_time = 3600",
        f"SELECT * FROM url('{base}/second', 'LineAsString')",
    ]
    # the exact forms seen: a `--` comment hiding a quote, and a dollar-quoted string hiding one
    carriers = [
        "SELECT 1 -- '\n; {p}; SELECT 1 -- '",
        "SELECT $$'$$; {p}; SELECT 'x'",
        "SELECT 1 # '\n; {p}; SELECT 1 # '",
        "SELECT 1 /* ' */ ; {p}; /* ' */",
        "SELECT 1 /* /* nested */ ' */ ; {p}",
        "SELECT $tag$ ' $tag$; {p}; SELECT $tag$ ' $tag$",
        "SELECT 'it\\'s'; {p}",
        "SELECT 'a''b'; {p}",
        'SELECT "col"; {p}',
        "SELECT `a;b`; {p}",
        "SELECT 1;\n{p}",
        "SELECT 1;{p};",
        "{p}; SELECT 1",
        "{p}",
        "SELECT 1 \u037e {p}",  # Greek question mark, looks like `;`
        "SELECT 1 \uff1b {p}",  # fullwidth semicolon
        "SELECT 1\u200b; {p}",  # zero-width space
        "SELECT '\u202e'; {p}",  # right-to-left override
        "SELECT 'ü日本'; {p}",
        "SELECT * FROM ({p})",
        "SELECT (SELECT 1; {p})",
        "WITH x AS ({p}) SELECT * FROM x",
        "EXPLAIN {p}",
        "EXPLAIN AST {p}",
    ]
    return [c.replace("{p}", p) for c in carriers for p in payloads]


def statements(out: Path, base: str) -> list[str]:
    """Statements other than a query, settings, USE, and other ways out."""
    return [
        f"INSERT INTO FUNCTION file('{out}/f.csv', 'CSV') SELECT 1",
        "INSERT INTO chamber.budgets (team, amount) VALUES ('x', 1)",
        "INSERT INTO chamber.budgets FORMAT CSV 'x',1\n; DROP TABLE chamber.budgets",
        "INSERT INTO chamber.budgets SELECT * FROM chamber.budgets",
        "CREATE TABLE chamber.y ENGINE = Memory AS SELECT 1 AS a",
        "CREATE TABLE chamber.y AS chamber.budgets",
        "CREATE TEMPORARY TABLE y (a Int8)",
        "CREATE VIEW chamber.v AS SELECT * FROM file('/etc/passwd', 'LineAsString')",
        "CREATE MATERIALIZED VIEW chamber.mv ENGINE = Memory AS SELECT * FROM chamber.budgets",
        "CREATE FUNCTION f AS x -> x + 1",
        "CREATE DATABASE z",
        "CREATE DICTIONARY chamber.d (a UInt64) PRIMARY KEY a SOURCE(FILE(path '/etc/passwd' format 'CSV')) "
        "LAYOUT(FLAT()) LIFETIME(0)",
        f"ATTACH TABLE chamber.a FROM '{out}/a' (a Int8) ENGINE = MergeTree ORDER BY a",
        "ATTACH TABLE chamber.budgets",
        "ATTACH DATABASE z ENGINE = Atomic",
        "DETACH TABLE chamber.budgets",
        "DROP TABLE chamber.budgets",
        "DROP DATABASE chamber",
        "UNDROP TABLE chamber.budgets",
        "TRUNCATE chamber.budgets",
        "ALTER TABLE chamber.budgets DELETE WHERE 1",
        "ALTER TABLE chamber.budgets ADD COLUMN z Int8",
        "DELETE FROM chamber.budgets WHERE 1",
        "UPDATE chamber.budgets SET amount = 0 WHERE 1",
        "RENAME TABLE chamber.budgets TO chamber.b2",
        "EXCHANGE TABLES chamber.budgets AND chamber.events",
        "OPTIMIZE TABLE chamber.budgets FINAL",
        "SYSTEM FLUSH LOGS",
        "SYSTEM SHUTDOWN",
        "SYSTEM RELOAD CONFIG",
        "SYSTEM DROP DNS CACHE",
        "SYSTEM STOP MERGES",
        "KILL QUERY WHERE 1",
        "KILL MUTATION WHERE 1",
        "GRANT ALL ON *.* TO default",
        "CREATE USER u IDENTIFIED WITH no_password",
        f"BACKUP TABLE chamber.budgets TO File('{out}/backup')",
        f"RESTORE TABLE chamber.budgets FROM File('{out}/backup')",
        "SET readonly = 0",
        "SET max_execution_time = 3600",
        "SELECT 1 SETTINGS readonly = 0",
        "SELECT 1 SETTINGS max_execution_time = 3600, max_memory_usage = 0",
        "SELECT * FROM chamber.events SETTINGS max_threads = 64",
        "WITH 1 AS a SELECT a SETTINGS max_result_rows = 0",
        "EXPLAIN indexes = 1 SELECT 1",
        "USE default",
        "USE system",
        f"SELECT 1 INTO OUTFILE '{out}/outfile'",
        f"SELECT 1 INTO OUTFILE '{out}/outfile' FORMAT CSV",
        "SELECT 1 FORMAT CSV",
        "SHOW DATABASES",
        "SHOW TABLES FROM system",
        "SHOW CREATE TABLE chamber.budgets",
        "SHOW GRANTS",
        "SHOW PROCESSLIST",
        "SHOW SETTINGS LIKE '%'",
        "DESCRIBE TABLE system.users",
        "DESCRIBE TABLE file('/etc/passwd', 'LineAsString')",
        "EXISTS TABLE system.users",
        "EXPLAIN INSERT INTO chamber.budgets SELECT * FROM chamber.budgets",
        "EXPLAIN PIPELINE SELECT * FROM file('/etc/passwd', 'LineAsString')",
        "SELECT * FROM system.tables",
        "SELECT * FROM information_schema.tables",
        "SELECT * FROM default.x",
        "SELECT 1 IN system.one",
        "SELECT hostName()",
        "SELECT hostname()",
        "SELECT FQDN()",
        "SELECT fullHostName()",
        "SELECT getServerSetting('path')",
        "SELECT getMergeTreeSetting('index_granularity')",
        "SELECT getOSKernelVersion()",
        "SELECT uptime()",
        "SELECT serverUUID()",
        "SELECT displayName()",
        "SELECT currentUser()",
        "SELECT filesystemAvailable()",
        "SELECT tcpPort()",
        "SELECT showCertificate()",
        "SELECT buildId()",
        "SELECT file('/etc/passwd')",
        "SELECT dictGet('d', 'a', toUInt64(1))",
        "SELECT joinGet('chamber.budgets', 'amount', 'x')",
        "SELECT aiGenerate('hello')",
        "SELECT addressToSymbol(toUInt64(1))",
        "SELECT * APPLY getServerSetting FROM (SELECT 'path' AS p)",
        "SELECT * APPLY(x -> hostName()) FROM (SELECT 1 AS p)",
        "SELECT COLUMNS('p') APPLY file FROM (SELECT '/etc/passwd' AS p)",
        "SELECT * FROM Python(arrow)",
        "SELECT * FROM executable('id', 'LineAsString', 'a String')",
    ]


def table_function_forms(world: World) -> list[str]:
    """Every table function the engine lists that does more than generate rows (files, network,
    processes, other tables), read, written and described; aimed at the outside dir and loopback."""
    forms = []
    for name in world.table_functions:
        if name.lower() in SAFE_TABLE_FUNCTIONS:
            continue
        for target in (f"{world.outside}/{name}.csv", f"{world.base}/{name}"):
            args = f"'{target}', 'CSV', 'a String'"
            forms += [
                f"SELECT * FROM {name}({args})",
                f"SELECT count() FROM chamber.events WHERE event_id IN (SELECT a FROM {name}({args}))",
                f"INSERT INTO FUNCTION {name}({args}) SELECT 'owned'",
                f"DESCRIBE TABLE {name}({args})",
            ]
    return forms


def corpus(world: World) -> list[str]:
    return smuggled(world.outside, world.base) + statements(world.outside, world.base) + table_function_forms(world)


def assert_refused_and_nothing_ran(world: World, sql: str, before: tuple[object, ...]) -> None:
    with pytest.raises(ReadOnlyViolation) as refused:
        confined_query(world.session, sql, max_rows=10)
    assert str(refused.value).startswith(("refused:", "empty query")), (sql, str(refused.value))
    assert (world.tables(), world.files(), list(world.seen), world.session_state()) == before, sql


def snapshot(world: World) -> tuple[object, ...]:
    return (world.tables(), world.files(), list(world.seen), world.session_state())


def test_every_smuggling_form_is_refused_and_nothing_runs(world: World) -> None:
    forms = corpus(world)
    listed = {name.lower() for name in world.table_functions}
    assert {"file", "url", "s3", "remote", "executable", "mysql", "postgresql", "hdfs", "python"} <= listed
    assert len(forms) > 600  # the size the closing note reports comes from this list
    before = snapshot(world)
    assert before[0] and before[3] == [["chamber", 1, 30, Limits().settings()["max_threads"]]]
    for sql in forms:
        assert_refused_and_nothing_ran(world, sql, before)
    # ingest's own session: still in chamber, still writable, its settings its own
    assert world.warehouse.query("SELECT currentDatabase(), getSetting('readonly')").rows == [["chamber", 0]]
    world.warehouse.insert("budgets", pa.table({"team": ["after"], "amount": [1.0]}))
    assert world.warehouse.count("budgets", "team = 'after'") == 1
    world.warehouse.command("DELETE FROM budgets WHERE team = 'after'")


def test_the_queries_around_the_smuggled_ones_still_run_alone(world: World) -> None:
    """The corpus is refused for what it smuggles, not for its carriers."""
    for sql in [
        "SELECT 1 -- '",
        "SELECT $$'$$",
        "SELECT 'ü日本', '\u202e' AS `名`",
        "SELECT `a;b` FROM (SELECT 1 AS `a;b`)",
    ]:
        assert confined_query(world.session, sql, max_rows=10).rows, sql


FRAGMENTS = [
    "SELECT 1",
    "SELECT count() FROM chamber.budgets",
    "DROP TABLE chamber.budgets",
    "CREATE TABLE chamber.h ENGINE = Memory AS SELECT 1",
    "INSERT INTO FUNCTION file('{out}/h', 'CSV') SELECT 1",
    "INSERT INTO chamber.budgets FORMAT CSV 'h',1\n",
    "USE default",
    "SET readonly = 0",
    "SETTINGS readonly = 0",
    "SYSTEM FLUSH LOGS",
    "KILL QUERY WHERE 1",
    "ATTACH TABLE chamber.budgets",
    "SELECT * FROM url('{base}/h', 'LineAsString')",
    "SELECT hostName()",
    "FROM file('/etc/passwd')",
    ";",
    "--",
    "#",
    "/*",
    "*/",
    "'",
    '"',
    "`",
    "$$",
    "$t$",
    "\\",
    "\n",
    "\u037e",
    "\uff1b",
    "\u200b",
    "(",
    ")",
    "ü",
]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8), st.sampled_from([" ", "", "\n", " ; "]))
def test_random_mixtures_never_change_anything(world: World, parts: list[str], glue: str) -> None:
    """Whatever a mixture is (refused, a syntax error, or a query that runs), it changes nothing."""
    sql = glue.join(parts).replace("{out}", str(world.outside)).replace("{base}", world.base)
    before = snapshot(world)
    with contextlib.suppress(ReadOnlyViolation, WarehouseError):  # refused, or ran (or failed) as a query
        confined_query(world.session, sql, max_rows=10)
    assert snapshot(world) == before, sql
