"""`chamber scheduler replay --positions FILE [--now T]`: re-run a logged scheduling cycle.

FILE holds the scheduler's `cycle` log line (or a log: its last line with `positions`). The command
folds the scheduler's streams from the start up to those positions, as the service does, runs the
cycle again at T (default: the line's `at`) from the mark the line names, and prints the decisions
with their event ids: the ones the scheduler published. Give it the settings the scheduler ran with
after `--` (the options of `chamber service scheduler`). It reads the log as the operator (admin).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from services.cli.common import add_nats_option, with_nats
from services.cli.errors import UsageError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("scheduler", help="the scheduler's own tools: re-run a logged cycle")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    replay = verbs.add_parser(
        "replay",
        help="re-run a logged cycle from the positions it logged; prints the same decisions and ids",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replay.add_argument("--positions", type=Path, required=True, metavar="FILE", help="the logged `cycle` line")
    replay.add_argument(
        "--now", type=_when, metavar="T", help="the cycle's time: epoch seconds or ISO 8601 (default: the line's `at`)"
    )
    add_nats_option(replay)
    replay.add_argument(
        "settings",
        nargs=argparse.REMAINDER,
        metavar="-- SETTINGS",
        help="after `--`: the options `chamber service scheduler` ran with (e.g. -- --topology-key rack)",
    )
    replay.set_defaults(func=run)


def service_settings(settings: list[str]) -> argparse.Namespace:
    """The scheduler service's own options and defaults, parsed from what followed `--` (the
    service's module is imported here only: every other `chamber` command starts without it)."""
    from services.scheduler.service import add_arguments

    parser = argparse.ArgumentParser(prog="chamber scheduler replay ... --", add_help=False, exit_on_error=False)
    add_arguments(parser)
    given = settings[1:] if settings[:1] == ["--"] else settings
    try:
        parsed, unknown = parser.parse_known_args(given)
    except argparse.ArgumentError as exc:
        raise UsageError(f"the scheduler's settings after `--` do not read: {exc}") from None
    if unknown:
        raise UsageError(f"not an option of `chamber service scheduler`: {' '.join(unknown)}")
    return parsed


def _when(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither epoch seconds nor an ISO 8601 time") from None


def run(args: argparse.Namespace) -> int:
    from services.scheduler.replay import ReplayError, cycle_record

    try:
        text = args.positions.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {args.positions}: {exc.strerror}") from None
    try:
        record = cycle_record(text)
    except ReplayError as exc:
        raise UsageError(f"{args.positions}: {exc}") from None
    settings = service_settings(args.settings)
    now = args.now if args.now is not None else record.get("at")
    if not isinstance(now, int | float):
        raise UsageError(f"{args.positions} names no cycle time (`at`): give one with --now T")
    print(json.dumps(with_nats(args, lambda nc: _replay(nc, settings, record, float(now))), indent=2))
    return 0


async def _replay(nc: Any, settings: argparse.Namespace, record: dict[str, Any], now: float) -> dict[str, Any]:
    from services.scheduler.replay import ReplayError, fold_to, mark_from_record, rerun
    from services.scheduler.service import Scheduler

    positions = {str(k): int(v) for k, v in record["positions"].items()}
    scheduler = Scheduler(settings)
    try:
        since = mark_from_record(record.get("since"))
    except ReplayError as exc:
        raise UsageError(str(exc)) from None
    state, folded = await fold_to(nc, scheduler.manifest(), positions)
    return {"positions": positions, "folded": folded, **rerun(state, now, since, scheduler.policy)}
