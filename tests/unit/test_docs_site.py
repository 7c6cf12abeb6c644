"""The documentation site: it builds with `mkdocs build --strict` (no broken link, no page left out of
the navigation), its command reference covers every command and flag of the CLI, and the user docs
describe the product, not its history (that is CHANGELOG.md's job)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from services.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generated_pages", ROOT / "docs" / "hooks" / "generated_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands(parser: argparse.ArgumentParser, prefix: str = "chamber") -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(prefix, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.extend(_commands(sub, f"{prefix} {name}"))
    return out


def test_the_reference_names_every_command_and_every_flag() -> None:
    parser = build_parser()
    page = _hook().render_cli_reference(parser)
    commands = _commands(parser)
    assert len(commands) > 40  # the walk found the nested verbs (quota pool set, billing price import, ...)
    for name, sub in commands[1:]:
        assert f"`{name}`" in page, name
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in page, (name, flag)


def test_a_flag_added_to_the_cli_shows_in_the_reference() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.choices["queue"].add_argument("--made-up-flag", help="only in this test")
    page = _hook().render_cli_reference(parser)
    assert "`--made-up-flag MADE_UP_FLAG` | only in this test |" in page


def test_the_readme_is_a_guide_of_at_most_300_lines() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    assert "```sh\nmake up\nmake test\n```" in text


# history words in user docs: issue numbers, "the third pass", commit ids
HISTORY = re.compile(r"\bissues? \d+|\b(first|second|third|fourth|fifth) pass\b|\bcommit [0-9a-f]{7,40}\b", re.I)


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: p.name)
def test_user_docs_carry_no_history(path: Path) -> None:
    hits = [line for line in path.read_text().splitlines() if HISTORY.search(line)]
    assert hits == [], f"{path.name}: move this history to CHANGELOG.md: {hits}"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
    home = (tmp_path / "site" / "index.html").read_text()
    assert "A ten-minute tour" in home  # the home page is the README
