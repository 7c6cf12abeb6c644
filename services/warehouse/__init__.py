"""The warehouse: ClickHouse DDL migrations, two backends behind one interface, read-only queries."""

from services.warehouse.backend import QueryResult, Warehouse, WarehouseError, WarehouseUnavailable
from services.warehouse.confine import ReadOnlyViolation
from services.warehouse.migrations import migrate
from services.warehouse.options import add_warehouse_options, open_from_args, open_warehouse

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
