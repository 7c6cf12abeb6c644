"""mkdocs hook: pages made at build time from what they document, so they cannot drift.

- `index.md` is README.md (its links into `docs/` rewritten to site pages);
- `changelog.md` is CHANGELOG.md;
- `warehouse-tables.md` and `health.md` are the READMEs kept beside their code;
- `reference/cli.md` is every `chamber` command and flag, rendered from the CLI's own argparse parsers.

`render_cli_reference` is also used by the tests (loaded from this file by path).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# site page <- repository file
COPIED = {
    "index.md": "README.md",
    "changelog.md": "CHANGELOG.md",
    "warehouse-tables.md": "schemas/clickhouse/README.md",
    "health.md": "services/health/README.md",
}
CLI_PAGE = "reference/cli.md"


def site_text(page: str, text: str) -> str:
    """A repository file's markdown as a site page: links into docs/ point at the pages themselves,
    the changelog at its page."""
    if page == "index.md":
        text = re.sub(r"\]\(docs/", "](", text)
        text = text.replace("](CHANGELOG.md)", "](changelog.md)")
    return text


# ---- the command reference ------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each sub-command, in the order `--help` lists them."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias
                    continue
                seen.add(id(sub))
                out.append((name, helps.get(name, ""), sub))
    return out


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        metavar = " " + (
            action.metavar
            if isinstance(action.metavar, str)
            else (f"{{{','.join(map(str, action.choices))}}}" if action.choices else action.dest.upper())
        )
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:  # argparse's own interpolation, as --help would show it
        params: dict[str, Any] = dict(vars(action), prog="chamber")
        if action.choices is not None:
            params["choices"] = ", ".join(map(str, action.choices))
        with contextlib.suppress(KeyError, TypeError, ValueError):  # a literal '%' in the text
            text = text % params
    if action.choices and not action.option_strings and "{" not in text:
        text = f"{text} (one of: {', '.join(map(str, action.choices))})".strip()
    default = action.default
    shown = default not in (None, False, argparse.SUPPRESS) and not isinstance(default, (list, dict))
    if shown and "default" not in text.lower() and action.nargs != 0:
        text = f"{text} (default {default})".strip()
    return _cell(text)


def _render(name: str, summary: str, parser: argparse.ArgumentParser, out: list[str], depth: int) -> None:
    subs = _subcommands(parser)
    out.append(f"{'#' * min(depth, 6)} `{name}`\n")
    description = parser.description or summary
    if description:
        out.append(_cell(description) + "\n")
    out.append("```text\n" + parser.format_usage().strip() + "\n```\n")
    rows = [
        a
        for a in parser._actions
        if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction)) and a.help != argparse.SUPPRESS
    ]
    if rows:
        out.append("| argument | what |\n|---|---|")
        out.extend(f"| {_flags(a)} | {_help(a)} |" for a in rows)
        out.append("")
    if subs:
        out.append("| command | what |\n|---|---|")
        out.extend(f"| `{name} {sub}` | {_cell(text)} |" for sub, text, _ in subs)
        out.append("")
    for sub, text, child in subs:
        _render(f"{name} {sub}", text, child, out, depth + 1)


def render_cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Markdown for every command and flag of `chamber`, from its argparse parsers."""
    if parser is None:
        from services.cli import build_parser

        parser = build_parser()
    out = [
        "# Commands and flags\n",
        "Generated from `chamber`'s own argument parsers when the site is built: what `chamber COMMAND "
        "--help` prints, for every command. Flags that talk to NATS default to `$CHAMBER_NATS_URL`, then "
        "`nats://127.0.0.1:4222`.\n",
    ]
    top = _subcommands(parser)
    out.append("| command | what |\n|---|---|")
    out.extend(f"| [`chamber {name}`](#chamber-{name}) | {_cell(text)} |" for name, text, _ in top)
    out.append("")
    for name, text, child in top:
        _render(f"chamber {name}", text, child, out, 2)
    return "\n".join(out) + "\n"


def _cli_reference() -> str:
    # usage lines wrap at the terminal's width: fix it so the page is the same on every machine
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        return render_cli_reference()
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


# ---- the mkdocs hook --------------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for page, source in COPIED.items():
        path = ROOT / source
        files.append(File.generated(config, page, content=site_text(page, path.read_text())))
    files.append(File.generated(config, CLI_PAGE, content=_cli_reference()))
    return files
