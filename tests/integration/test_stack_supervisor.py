"""The supervisor behind `chamber up`, with real child processes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from services.stack.backoff import RestartPolicy
from services.stack.supervisor import Component, Supervisor
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer


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


async def test_a_killed_nats_server_is_restarted_on_its_port_and_store_and_clients_come_back(tmp_path: Path) -> None:
    """Issue 16, finding 7: kill -9 of the embedded nats-server under `chamber up`."""
    from services.runtime import connect
    from services.runtime.nats_server import NatsServerProcess

    lines: list[str] = []
    supervisor = Supervisor(tmp_path / "logs", policy=RestartPolicy(first_delay_s=0.1), say=lines.append)
    # No service connects here: the test restarts nats-server itself, so it needs no generated users.
    server = NatsServerProcess(tmp_path / "js")
    nats = Component("nats", server.argv(), stop_last=True)
    supervisor.add(nats)
    await supervisor.start()
    try:
        await eventually(server.ready, within=60)
        nc = await connect(server.url, name="survivor")
        js = nc.jetstream()
        await js.add_stream(name="KEPT", subjects=["kept.>"])
        await js.publish("kept.1", b"before")
        first = nats.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await eventually(lambda: nats.restarts == 1 and nats.pid != first, within=60)
        await eventually(server.ready, within=60)
        await eventually(lambda: nc.is_connected, within=60)
        await js.publish("kept.2", b"after")  # same store: the stream is still there
        assert (await js.stream_info("KEPT")).state.messages == 2
        assert any("nats       exited with -9; restarting" in line for line in lines)
        await nc.close()
    finally:
        await asyncio.wait_for(supervisor.stop(timeout_s=5), 15)
    assert not supervisor.running("nats")


def test_reconnect_warnings_are_rate_limited() -> None:
    from services.runtime.connection import Throttled

    now = [0.0]
    warn = Throttled("nats error", every_s=30.0, clock=lambda: now[0])
    for _ in range(60):  # a dead bus: nats-py calls back twice a second for 30 s
        warn(error="connection refused")
        now[0] += 0.5
    assert warn.logged == 1 and warn.left_out == 59
    warn(error="connection refused")
    assert warn.logged == 2 and warn.left_out == 0


async def test_a_connection_closed_on_purpose_warns_of_no_disconnect(nats_server: SecuredNatsServer) -> None:
    """A stop drains and closes each connection, and nats-py calls back "disconnected" for that too:
    every service logged a warning at a clean stop. Only a lost server warns."""
    from services.runtime import connection

    before = connection._disconnected.logged + connection._disconnected.left_out
    nc = await connection.connect(nats_server.url, name="closer")
    await nc.drain()
    assert connection._disconnected.logged + connection._disconnected.left_out == before


async def test_a_child_does_not_inherit_the_secrets_it_has_no_use_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16, finding 2: an API token exported in the shell of `chamber up` reaches the gateway only."""
    import argparse

    from services.cli.up import _components

    monkeypatch.setenv("CHAMBER_API_TOKEN", "exported-in-the-shell")
    args = argparse.Namespace(port=8080, nodes=1, gpus_per_node=1, no_workload=False)
    components = {c.name: c for c in _components(args, "nats://127.0.0.1:4222", tmp_path, secured=True)}
    assert components["gateway"].unset == () and components["scheduler"].unset == ("CHAMBER_API_TOKEN",)
    assert "CHAMBER_API_TOKEN" not in components["scheduler"].env
    assert components["scheduler"].env["CHAMBER_NATS_USER"] == "svc-scheduler"
    assert components["workload"].env["CHAMBER_NATS_USER"] == "workload"
    assert not any(
        "exported" in v or ("password" in k.lower() and "FILE" not in k)
        for c in components.values()
        for k, v in c.env.items()
    )

    supervisor = Supervisor(tmp_path / "logs", say=lambda line: None)
    show = [sys.executable, "-c", "import os; print('token:', os.environ.get('CHAMBER_API_TOKEN'))"]
    supervisor.add(Component("child", show, unset=("CHAMBER_API_TOKEN",)))
    await supervisor.start()
    await eventually(lambda: "token:" in (tmp_path / "logs" / "child.log").read_text(), within=60)
    await supervisor.stop(timeout_s=5)
    assert "token: None" in (tmp_path / "logs" / "child.log").read_text()
