"""The `chamber` command line. Each sub-command lives in its own module with a `register` function."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from services.cli import schemas, up, version
from services.cli.errors import UsageError

# Later issues add their modules here; each registers one or more sub-commands.
COMMAND_MODULES = (version, up, schemas)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chamber",
        description="Chamber: make a shared GPU fleet run near its limit.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"chamber {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
