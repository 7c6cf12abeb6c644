"""The supervisor behind `chamber up`, with real child processes."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from services.stack.backoff import RestartPolicy
from services.stack.supervisor import Component, Supervisor


async def test_a_dying_process_is_restarted_with_back_off_and_stop_ends_every_child(tmp_path: Path) -> None:
    lines: list[str] = []
    supervisor = Supervisor(
        tmp_path / "logs", policy=RestartPolicy(first_delay_s=0.05, max_delay_s=0.2), say=lines.append
    )
    crasher = Component("crasher", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"])
    sleeper = Component("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
    supervisor.add(crasher)
    supervisor.add(sleeper)
    await supervisor.start()
    for _ in range(100):
        if crasher.restarts >= 3:
            break
        await asyncio.sleep(0.05)
    assert crasher.restarts >= 3
    assert any("crasher    exited with 3; restarting" in line for line in lines)
    assert "boom" in (tmp_path / "logs" / "crasher.log").read_text()

    await asyncio.wait_for(supervisor.stop(timeout_s=5), 10)
    assert sleeper.restarts == 0
    for proc in supervisor._procs.values():
        assert proc.returncode is not None
