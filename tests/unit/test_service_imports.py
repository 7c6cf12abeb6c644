"""Services do not import the command line (issue 14's review): the CLI is one client of the services,
and a service that imports it drags argparse front ends and their dependencies into every process."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# `chamber up`'s supervisor (services/stack) is the CLI's own machinery, not a service
CLI_SIDE = ("services/cli/", "services/stack/")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_no_service_imports_the_cli() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in _imports(path) if m == "services.cli" or m.startswith("services.cli.")
        )
        for path in sorted((ROOT / "services").rglob("*.py"))
        if not str(path.relative_to(ROOT)).startswith(CLI_SIDE)
    }
    assert {p: m for p, m in offenders.items() if m} == {}
    assert len(offenders) > 50  # the walk saw the services (a wrong root would pass vacuously)


def test_a_service_process_imports_only_its_own_service_and_no_warehouse_engine() -> None:
    """`chamber service quota` builds its parser with quota's module alone: not the recorder's Arrow,
    NumPy, pandas or chDB, which every process of the demo paid for before (bench/footprint.py)."""
    import subprocess
    import sys

    probe = (
        "import sys; import services.cli.service as s; s.focus(['quota']); "
        "from services.cli import build_parser; build_parser(); "
        "heavy = sorted(m for m in ('pyarrow', 'numpy', 'pandas', 'chdb', 'matplotlib') if m in sys.modules); "
        "others = sorted(m for m in sys.modules if m.endswith('.service') and not m.startswith('services.cli')); "
        "print(heavy, others)"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] ['services.quota.service']", done.stdout


def test_focus_narrows_the_parser_only_and_chamber_up_still_finds_every_service() -> None:
    from services.cli import service

    try:
        service.focus([])  # what `chamber up` sets for its own process
        assert {"quota", "scheduler", "recorder", "gateway"} <= set(service.discover())
        # idle's decider runs inside perf's process: no process (nor NATS user) of its own
        assert "idle" not in service.discover()
        assert service.discover(["quota"]).keys() == {"quota"}
    finally:
        service._FOCUS.clear()


def test_chamber_up_reads_every_service_module_without_the_recorders_engine() -> None:
    """The supervisor of `chamber up` imports every service's module (names, roles, options) and the
    agent's and workload's processes their own command's module: none loads Arrow, pandas or chDB
    (the recorder's light front, services/recorder/service.py), nor the other commands' modules, nor
    rich for tracebacks."""
    import subprocess
    import sys

    probe = (
        "import sys; from services.cli import lighten_logging, build_parser; lighten_logging(); "
        "import services.cli.service as s; s.focus([]); build_parser('up'); s.discover(); "
        "from services.stack.credentials import stack_users; stack_users('local', list(s.discover())); "
        "heavy = sorted(m for m in ('pyarrow', 'numpy', 'pandas', 'chdb', 'rich') if sys.modules.get(m)); "
        "cli = sorted(m for m in sys.modules if m in ('services.cli.sim', 'services.cli.jobs', 'services.cli.sql')); "
        "print(heavy, cli)"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] []", done.stdout


def test_asking_the_recorders_front_for_an_absent_name_loads_nothing() -> None:
    import subprocess
    import sys

    probe = (
        "import sys; import services.recorder.service as r; getattr(r, 'RUNS_IN_UP', True); "
        "print('services.recorder.pipeline' in sys.modules, r.setup_recorder.__module__)"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False services.recorder.pipeline", done.stderr
