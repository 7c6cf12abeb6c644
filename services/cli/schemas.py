from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("schemas", help="write the JSON Schemas of every event and the AsyncAPI document")
    p.add_argument("--out", type=Path, default=Path("schemas"), help="output folder (default: schemas)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from events.schema_gen import write

    written = write(args.out)
    print(f"wrote {len(written)} files under {args.out}")
    return 0
