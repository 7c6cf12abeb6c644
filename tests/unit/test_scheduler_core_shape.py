"""The scheduler core stays readable: no function over 60 lines (complexity is ruff's C901, configured
in services/scheduler/core/ruff.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "services" / "scheduler" / "core"
MAX_LINES = 60


def long_functions(root: Path) -> list[str]:
    found = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_LINES:
                    found.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_the_scheduler_core_is_over_60_lines() -> None:
    assert long_functions(CORE) == []


def test_the_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"def too_long():\n{body}\n")
    assert long_functions(tmp_path) == ["long.py:1 too_long (61 lines)"]


def test_the_core_folder_selects_the_complexity_rule() -> None:
    config = (CORE / "ruff.toml").read_text()
    assert 'extend-select = ["C901"]' in config and "max-complexity = 15" in config
