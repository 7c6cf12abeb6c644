"""Where the warehouse is: `--clickhouse-url` (a server) or `--data-dir` (embedded chDB)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the backend pulls in Arrow: only processes that open a warehouse need it
    from services.warehouse.backend import Warehouse

DEFAULT_DATA_DIR = ".chamber"


def add_warehouse_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("CHAMBER_DATA_DIR", DEFAULT_DATA_DIR)),
        help=f"embedded warehouse (chDB) lives under DIR/warehouse (default: $CHAMBER_DATA_DIR or {DEFAULT_DATA_DIR})",
    )
    parser.add_argument(
        "--clickhouse-url",
        metavar="URL",
        default=os.environ.get("CHAMBER_CLICKHOUSE_URL") or None,
        help="use this ClickHouse server (http://user:pass@host:8123) instead of chDB "
        "(default: $CHAMBER_CLICKHOUSE_URL)",
    )
    parser.add_argument(
        "--clickhouse-sql-url",
        metavar="URL",
        default=os.environ.get("CHAMBER_CLICKHOUSE_SQL_URL") or None,
        help="run analytics SQL as this more restricted user of the same server (SELECT on `chamber` only; "
        "charts/chamber/files/clickhouse-sql-user.xml); default: $CHAMBER_CLICKHOUSE_SQL_URL, else --clickhouse-url",
    )
    parser.add_argument(
        "--clickhouse-cluster",
        metavar="NAME",
        default=os.environ.get("CHAMBER_CLICKHOUSE_CLUSTER") or None,
        help="a ClickHouse cluster (remote_servers name): replicated tables ON CLUSTER and distributed "
        "tables for queries; needs --clickhouse-url (default: $CHAMBER_CLICKHOUSE_CLUSTER)",
    )


def open_warehouse(
    *, data_dir: Path | str | None = None, clickhouse_url: str | None = None, clickhouse_cluster: str | None = None
) -> Warehouse:
    """A server when a URL is given (on `clickhouse_cluster`, if named), else chDB under `data_dir`."""
    if clickhouse_cluster and not clickhouse_url:
        from services.errors import UsageError

        raise UsageError(
            f"--clickhouse-cluster {clickhouse_cluster} needs a ClickHouse server (--clickhouse-url): "
            "the embedded warehouse (chDB) is one node"
        )
    if clickhouse_url:
        from services.warehouse.server_backend import ServerWarehouse

        return ServerWarehouse(clickhouse_url, cluster=clickhouse_cluster)
    from services.warehouse.chdb_backend import ChdbWarehouse

    return ChdbWarehouse(data_dir or DEFAULT_DATA_DIR)


def open_from_args(args: argparse.Namespace) -> Warehouse:
    return open_warehouse(
        data_dir=args.data_dir,
        clickhouse_url=args.clickhouse_url,
        clickhouse_cluster=getattr(args, "clickhouse_cluster", None),
    )


def open_for_analytics(args: argparse.Namespace) -> Warehouse:
    """Where analytics SQL runs: the restricted user's URL when one is given."""
    url = getattr(args, "clickhouse_sql_url", None) or args.clickhouse_url
    return open_warehouse(
        data_dir=args.data_dir, clickhouse_url=url, clickhouse_cluster=getattr(args, "clickhouse_cluster", None)
    )
