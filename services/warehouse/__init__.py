"""The warehouse: ClickHouse DDL migrations, two backends behind one interface, read-only queries.

Names are imported on first use (PEP 562): the CLI registers its warehouse options in every process,
and the backends pull in Arrow and NumPy, which only the processes that query need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.warehouse.backend import QueryResult, Warehouse, WarehouseError, WarehouseUnavailable
    from services.warehouse.confine import ReadOnlyViolation
    from services.warehouse.migrations import migrate
    from services.warehouse.options import add_warehouse_options, open_from_args, open_warehouse

_WHERE = {
    "QueryResult": "backend",
    "Warehouse": "backend",
    "WarehouseError": "backend",
    "WarehouseUnavailable": "backend",
    "migrate": "migrations",
    "add_warehouse_options": "options",
    "open_from_args": "options",
    "open_warehouse": "options",
    "ReadOnlyViolation": "confine",
}

__all__ = [
    "QueryResult",
    "ReadOnlyViolation",
    "Warehouse",
    "WarehouseError",
    "WarehouseUnavailable",
    "add_warehouse_options",
    "migrate",
    "open_from_args",
    "open_warehouse",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'services.warehouse' has no attribute {name!r}")
    return getattr(importlib.import_module(f"services.warehouse.{module}"), name)
