"""The container image's Dockerfile, read as a build would. (No Docker daemon runs on this machine, so
the image is not built here: these check the stages and what reaches the final one.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """[(FROM line, [(INSTRUCTION, arguments)])], continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out: list[tuple[str, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            out.append((args, []))
        else:
            out[-1][1].append((instruction.upper(), args))
    return out


def test_the_image_is_built_in_stages_and_the_final_one_starts_from_a_slim_python() -> None:
    built = stages()
    assert len(built) >= 2
    assert built[0][0].endswith(" AS build")
    final_from, _ = built[-1]
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", final_from)


def test_the_final_stage_runs_chamber_as_a_non_root_user() -> None:
    _, final = stages()[-1]
    [user] = [args for ins, args in final if ins == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000  # numeric, so runAsNonRoot can verify it
    [entrypoint] = [args for ins, args in final if ins == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["chamber"]


def test_the_final_stage_has_no_build_tools_and_installs_nothing() -> None:
    _, final = stages()[-1]
    runs = " ".join(args for ins, args in final if ins == "RUN")
    for tool in ("apt-get install", "gcc", "build-essential", "pip install", "make "):
        assert tool not in runs, tool
    assert "pip uninstall -y pip setuptools wheel" in runs  # the base image's installer goes too
    copies = [args for ins, args in final if ins == "COPY"]
    # the built virtualenv, and the warehouse DDL it reads at start (found through the environment)
    assert copies == ["--from=build /opt/chamber /opt/chamber", "schemas /opt/chamber/share/chamber/schemas"]
    env = " ".join(args for ins, args in final if ins == "ENV")
    assert "CHAMBER_CLICKHOUSE_SCHEMAS=/opt/chamber/share/chamber/schemas/clickhouse" in env


def test_the_build_context_leaves_out_the_virtualenv_and_the_tests() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", ".git", "tests", ".chamber"} <= ignored
    assert "schemas" not in ignored
