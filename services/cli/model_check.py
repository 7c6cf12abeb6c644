"""A GPU model that no GPU of the fleet has is almost always a typo (`H100` for `H100-80GB`): warn."""

from __future__ import annotations

import argparse
import difflib
import sys

from services.cli.errors import UsageError


def models_in_fleet(args: argparse.Namespace) -> set[str] | None:
    """The fleet's GPU models (discovery's view), or None when there is no view to ask."""
    from services.cli.common import with_nats
    from services.cli.fleet import read_fleet

    try:
        nodes = with_nats(args, lambda nc: read_fleet(nc))
    except UsageError:
        return None
    return {str(g["model"]) for n in nodes for g in n.get("gpus", []) if g.get("model")}


def warn_unknown_model(args: argparse.Namespace, model: str | None, what: str) -> None:
    """Matching is exact but for case, as the scheduler's (services/scheduler/core/pools.py)."""
    if not model:
        return
    models = models_in_fleet(args)
    if models is None or not models or model.lower() in {m.lower() for m in models}:
        return
    prefix = getattr(args, "command_path", "chamber")
    close = difflib.get_close_matches(model, sorted(models), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    print(
        f"{prefix}: warning: no GPU in the fleet is a {model!r} (models here: {', '.join(sorted(models))}); "
        f"{hint}{what} matches no GPU until such GPUs join",
        file=sys.stderr,
    )
