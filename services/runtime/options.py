"""Command-line options that services and the CLI share (services never import the CLI)."""

from __future__ import annotations

import argparse
import os

DEFAULT_CLUSTER = "local"


def add_cluster_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cluster",
        default=os.environ.get("CHAMBER_CLUSTER", DEFAULT_CLUSTER),
        help=f"cluster name (default: $CHAMBER_CLUSTER or {DEFAULT_CLUSTER})",
    )
