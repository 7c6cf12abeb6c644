"""Versioned, idempotent DDL migrations from `schemas/clickhouse/NNNN_name.sql`, applied at start.

Each file runs once, recorded in `schema_migrations`; every statement is itself idempotent
(`IF NOT EXISTS`), so a start that died half-way through a file simply runs it again.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from services.warehouse.backend import Warehouse, WarehouseError
from services.warehouse.cluster import on_cluster

_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


def schema_dir() -> Path:
    override = os.environ.get("CHAMBER_CLICKHOUSE_SCHEMAS")
    return Path(override) if override else Path(__file__).resolve().parents[2] / "schemas" / "clickhouse"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    checksum: str


def split_statements(text: str) -> list[str]:
    """Statements end with `;` at the end of a line; `--` comment lines are dropped."""
    lines = [line for line in text.splitlines() if not line.strip().startswith("--")]
    parts = re.split(r";\s*$", "\n".join(lines), flags=re.M)
    return [p.strip() for p in parts if p.strip()]


def load(directory: Path | None = None) -> list[Migration]:
    found = []
    for path in sorted((directory or schema_dir()).glob("*.sql")):
        match = _FILE.match(path.name)
        if match is None:
            raise WarehouseError(f"migration file {path.name} must be named NNNN_name.sql")
        text = path.read_text()
        found.append(
            Migration(
                int(match["version"]),
                match["name"],
                tuple(split_statements(text)),
                hashlib.sha256(text.encode()).hexdigest()[:16],
            )
        )
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise WarehouseError(f"two migrations share a version in {directory or schema_dir()}")
    return found


def migrate(warehouse: Warehouse, directory: Path | None = None, *, cluster: str | None = None) -> list[str]:
    """Apply the migrations not yet applied; returns their names (empty when up to date). On a
    ClickHouse cluster (`cluster`, default the warehouse's own) every statement runs ON CLUSTER,
    rewritten by `services.warehouse.cluster`; `schema_migrations` stays per node (the DDL is
    idempotent, so a node that has not recorded a file re-runs it harmlessly)."""
    cluster = cluster or getattr(warehouse, "cluster", None)
    warehouse.command(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version UInt32, name String, checksum String, "
        "applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) ENGINE = ReplacingMergeTree ORDER BY version"
    )
    done = {int(r[0]) for r in warehouse.query("SELECT version FROM schema_migrations FINAL").rows}
    applied = []
    for migration in load(directory):
        if migration.version in done:
            continue
        statements = on_cluster(migration.statements, cluster) if cluster else migration.statements
        for statement in statements:
            try:
                warehouse.command(statement)
            except WarehouseError as exc:
                raise WarehouseError(f"migration {migration.version:04d}_{migration.name}: {exc}") from None
        warehouse.command(
            "INSERT INTO schema_migrations (version, name, checksum) VALUES "
            f"({migration.version}, '{migration.name}', '{migration.checksum}')"
        )
        applied.append(f"{migration.version:04d}_{migration.name}")
    return applied
