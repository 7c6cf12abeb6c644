from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    try:
        return version("chamber")
    except PackageNotFoundError:
        return "0.0.0+unknown"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("version", help="print Chamber's version")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(f"chamber {package_version()}")
    return 0
