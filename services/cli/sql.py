"""`chamber sql "SELECT ..."`: read-only SQL on the warehouse (tables and views: schemas/clickhouse/README.md)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from typing import Any

from services.cli.common import add_nats_option


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from services.warehouse.options import add_warehouse_options

    p = sub.add_parser("sql", help="run a read-only SQL query on the warehouse")
    p.add_argument("query", help="one SELECT, WITH, SHOW, DESCRIBE or EXPLAIN statement")
    p.add_argument("--format", choices=["table", "json", "csv"], default="table", help="output format (table)")
    p.add_argument("--max-rows", type=int, default=10_000, help="at most this many rows (10000)")
    add_nats_option(p)
    add_warehouse_options(p)
    p.set_defaults(func=run)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def render(result: dict[str, Any], fmt: str) -> str:
    columns, rows = result["columns"], result["rows"]
    if fmt == "json":
        return json.dumps({"columns": columns, "rows": rows})
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[_cell(v) if isinstance(v, list | dict) or v is None else v for v in r] for r in rows])
        return out.getvalue().rstrip("\n")
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''}{', truncated' if result.get('truncated') else ''})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from services.warehouse.access import read_query

    result = read_query(args, args.query, max_rows=args.max_rows)
    print(render(result, args.format))
    if result.get("truncated"):
        print(f"chamber sql: only the first {args.max_rows} rows are shown; add LIMIT or --max-rows", file=sys.stderr)
    return 0
