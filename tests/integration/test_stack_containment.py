"""The stack fails safe: children die with their supervisor, a new one cleans up after a crashed
one, a stalled child is restarted, and a process stops within its grace after SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from services.stack.backoff import RestartPolicy
from services.stack.containment import ChildRecord, clean_up_after_crash, start_time
from services.stack.supervisor import Component, Supervisor
from tests.integration.test_runtime import eventually

pytestmark = pytest.mark.integration

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
# A child that shrugs off SIGTERM (as a wedged service would).
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ignoring', flush=True);time.sleep(600)",
]


def supervisor_process(tmp_path: Path, *children: tuple[str, list[str]]) -> subprocess.Popen[bytes]:
    """A supervisor in its own process (so the test can kill it), with `children`; it prints each
    child's pid once started."""
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from pathlib import Path
        from services.stack.supervisor import Component, Supervisor

        async def main():
            sup = Supervisor(Path({str(tmp_path / "logs")!r}), record=Path({str(tmp_path / "children.jsonl")!r}),
                             say=lambda line: None)
            for name, argv in {list(children)!r}:
                sup.add(Component(name, argv, heartbeat=False))
            await sup.start()
            print(" ".join(str(c.pid) for c in sup.components), flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
        """
    )
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=os.environ.copy())


def pids_of(proc: subprocess.Popen[bytes]) -> list[int]:
    assert proc.stdout is not None
    return [int(p) for p in proc.stdout.readline().split()]


def running(pid: int) -> bool:
    state = Path(f"/proc/{pid}/stat")
    try:
        return state.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def test_killing_the_supervisor_takes_its_children_with_it(tmp_path: Path) -> None:
    sup = supervisor_process(tmp_path, ("a", SLEEPER), ("b", SLEEPER))
    children = pids_of(sup)
    assert all(running(p) for p in children)
    sup.kill()
    sup.wait()
    await eventually(lambda: not any(running(p) for p in children), within=10)


async def test_a_new_supervisor_stops_what_a_crashed_one_left_running(tmp_path: Path) -> None:
    sup = supervisor_process(tmp_path, ("stubborn", STUBBORN))
    [child] = pids_of(sup)
    log = tmp_path / "logs" / "stubborn.log"
    await eventually(lambda: log.exists() and "ignoring" in log.read_text(), within=20)
    sup.kill()
    sup.wait()
    await asyncio.sleep(0.5)
    assert running(child)  # it ignored the SIGTERM its parent's death sent
    left = ChildRecord(tmp_path / "children.jsonl").left_running()
    assert [(c.name, c.pid) for c in left] == [("stubborn", child)]
    began = time.monotonic()
    stopped = await asyncio.to_thread(clean_up_after_crash, tmp_path / "children.jsonl", 1.0)
    assert [c.pid for c in stopped] == [child] and time.monotonic() - began < 5
    await eventually(lambda: not running(child), within=5)
    assert not (tmp_path / "children.jsonl").exists()


def test_a_pid_the_system_reused_is_not_taken_for_a_child(tmp_path: Path) -> None:
    record = tmp_path / "children.jsonl"
    record.write_text(f'{{"name": "x", "pid": {os.getpid()}, "started": "1"}}\n{{"name": "torn"\n')
    assert ChildRecord(record).left_running() == []  # our own pid with another start time, a torn line
    assert start_time(os.getpid()) is not None


async def test_a_child_whose_event_loop_stalls_is_restarted(tmp_path: Path) -> None:
    lines: list[str] = []
    supervisor = Supervisor(
        tmp_path / "logs", policy=RestartPolicy(first_delay_s=0.05), say=lines.append, stall_s=2.0, first_beat_s=60
    )
    # a real service loop: run_until_stopped beats while main waits for the stop
    argv = [
        sys.executable,
        "-c",
        "import asyncio; from services.runtime.lifecycle import run_until_stopped;"
        "asyncio.run(run_until_stopped(lambda stop: stop.wait()))",
    ]
    beating = Component("beating", argv)
    supervisor.add(beating)
    await supervisor.start()
    try:
        await eventually(supervisor.heartbeat_file(beating).exists, within=30)
        await asyncio.sleep(3)
        assert beating.restarts == 0  # beating: left alone
        await freeze_and_see_restarted(supervisor, beating, lines)
    finally:
        await asyncio.wait_for(supervisor.stop(), 15)


async def freeze_and_see_restarted(
    supervisor: Supervisor, child: Component, said: list[str], first_beat_within: float = 30
) -> None:
    """Once `child` beats, SIGSTOP it: the supervisor must kill it and start a new one."""
    await eventually(supervisor.heartbeat_file(child).exists, within=first_beat_within)
    first = child.pid
    assert first is not None
    os.kill(first, signal.SIGSTOP)
    await eventually(lambda: child.restarts == 1 and child.pid != first, within=30)
    assert any(f"{child.name:<11}stalled (no heartbeat for" in line for line in said), said
    assert not running(first)


def test_a_service_that_ignores_its_stop_still_exits_within_its_grace(tmp_path: Path) -> None:
    code = (
        "import asyncio, time; from services.runtime.lifecycle import run_until_stopped\n"
        "async def main(stop):\n"
        "    print('up', flush=True)\n"
        "    await stop.wait()\n"
        "    time.sleep(60)  # a drain blocking the loop\n"
        "asyncio.run(run_until_stopped(main))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert time.monotonic() - began < 5.0
