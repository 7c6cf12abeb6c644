"""The same migrations on a ClickHouse cluster (`--clickhouse-cluster NAME`).

Each table of the single-node DDL becomes two, created `ON CLUSTER`:
- `<table>_local`: the Replicated twin of its engine (`ReplacingMergeTree` ->
  `ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/<table>_local', '{replica}')`),
  replicated through ClickHouse Keeper within each shard;
- `<table>`: a `Distributed` table over the shards, under the name every query and insert already
  uses. Its sharding key keeps what must meet on one shard together: a node's samples and their
  minute rollup (the materialized view runs per shard, local table to local table), and every copy of
  one event (so the replacing engine can collapse duplicates).
Views are created `ON CLUSTER` and read the distributed tables; `ALTER TABLE` goes to the local ones.
`DROP VIEW` / `DROP TABLE IF EXISTS` run `ON CLUSTER` (a table: its distributed and local halves);
`INSERT INTO ... SELECT` (a backfill) runs once, through the distributed tables, which send each row
to its shard.

Without a cluster the DDL runs as written. The rewrite is textual and only knows the statement
shapes of `schemas/clickhouse/` (one `CREATE TABLE`, `CREATE [MATERIALIZED] VIEW`, `ALTER TABLE`,
`DROP ... IF EXISTS` or `INSERT INTO ... SELECT` each); anything else is refused rather than guessed.
"""

from __future__ import annotations

import re

from services.warehouse.backend import WarehouseError

# A node's rows on one shard (samples and rollups), other rows by the identity they de-duplicate on.
SHARDING_KEYS = {
    "gpu_samples": "cityHash64(cluster, node)",
    "gpu_minute": "cityHash64(cluster, node)",
    "gpu_minute_rollup": "cityHash64(cluster, node)",  # recomputed from its node's samples, on their shard
    "gpu_minute_pending": "cityHash64(cluster, node)",
    "gpu_minute_progress": "cityHash64(name)",
    "gpu_inventory": "cityHash64(cluster, node)",
    "fleet_events": "cityHash64(cluster, node)",
    "job_events": "cityHash64(job_id)",
    "pools": "cityHash64(pool)",
}
DEFAULT_SHARDING_KEY = "cityHash64(event_id)"

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CREATE_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+)\s*\n", re.I)
_ENGINE = re.compile(r"^ENGINE = (\w*MergeTree)(?:\((.*?)\))?\s*$", re.M)
_CREATE_MV = re.compile(r"^CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+) TO (\w+) AS\b", re.I)
_CREATE_VIEW = re.compile(r"^CREATE VIEW IF NOT EXISTS (\w+) AS\b", re.I)
_ALTER = re.compile(r"^ALTER TABLE (\w+) ", re.I)
_DROP_VIEW = re.compile(r"^DROP VIEW IF EXISTS (\w+)$", re.I)
_DROP_TABLE = re.compile(r"^DROP TABLE IF EXISTS (\w+)$", re.I)
_INSERT_SELECT = re.compile(r"^INSERT INTO \w+\s*\n\s*SELECT\b", re.I)


def check_cluster_name(name: str) -> str:
    if not _NAME.match(name):
        raise WarehouseError(f"ClickHouse cluster name {name!r} must be an identifier (letters, digits, _)")
    return name


def on_cluster(statements: list[str] | tuple[str, ...], cluster: str) -> list[str]:
    """The statements rewritten for `cluster` (see the module docstring)."""
    check_cluster_name(cluster)
    tables: set[str] = set()
    out: list[str] = []
    for statement in statements:
        if match := _CREATE_TABLE.match(statement):
            name = match.group(1)
            tables.add(name)
            out.extend(_table(statement, name, cluster))
        elif match := _CREATE_MV.match(statement):
            view, target = match.groups()
            body = statement[match.end() :]
            for table in tables | set(SHARDING_KEYS):  # an MV fires on inserts into a local table
                body = re.sub(rf"\bFROM {table}\b", f"FROM {table}_local", body)
            out.append(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view} ON CLUSTER {cluster} TO {target}_local AS{body}")
        elif match := _CREATE_VIEW.match(statement):
            out.append(f"CREATE VIEW IF NOT EXISTS {match.group(1)} ON CLUSTER {cluster} AS{statement[match.end() :]}")
        elif match := _ALTER.match(statement):
            out.append(f"ALTER TABLE {match.group(1)}_local ON CLUSTER {cluster} {statement[match.end() :]}")
        elif match := _DROP_VIEW.match(statement):
            out.append(f"DROP VIEW IF EXISTS {match.group(1)} ON CLUSTER {cluster} SYNC")
        elif match := _DROP_TABLE.match(statement):  # the distributed table (or a view), then its local twin
            out.append(f"DROP TABLE IF EXISTS {match.group(1)} ON CLUSTER {cluster} SYNC")
            out.append(f"DROP TABLE IF EXISTS {match.group(1)}_local ON CLUSTER {cluster} SYNC")
        elif _INSERT_SELECT.match(statement):
            out.append(statement)
        else:
            raise WarehouseError(f"cannot run this statement ON CLUSTER {cluster}: {statement.splitlines()[0]}")
    return out


def _table(statement: str, name: str, cluster: str) -> list[str]:
    engine = _ENGINE.search(statement)
    if engine is None:
        raise WarehouseError(f"table {name}: only MergeTree-family engines can be replicated")
    family, args = engine.group(1), (engine.group(2) or "").strip()
    path = f"'/clickhouse/tables/{{shard}}/{{database}}/{name}_local', '{{replica}}'"
    replicated = f"ENGINE = Replicated{family}({path}{', ' + args if args else ''})"
    local = statement[: engine.start()] + replicated + statement[engine.end() :]
    local = _CREATE_TABLE.sub(f"CREATE TABLE IF NOT EXISTS {name}_local ON CLUSTER {cluster}\n", local, count=1)
    key = SHARDING_KEYS.get(name, DEFAULT_SHARDING_KEY)
    distributed = (
        f"CREATE TABLE IF NOT EXISTS {name} ON CLUSTER {cluster} AS {name}_local\n"
        f"ENGINE = Distributed({cluster}, currentDatabase(), {name}_local, {key})"
    )
    return [local, distributed]
