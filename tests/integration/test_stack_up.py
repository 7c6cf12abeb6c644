"""`chamber up` failing fast and keeping what the user set (issue 16, findings 7, 8 and 10)."""

from __future__ import annotations

import argparse
import asyncio
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from services.cli import main
from services.cli.up import DEMO_SETUP_MARKER, mark_demo_setup
from services.cli.workload import _main as workload
from services.runtime.commands import CommandServer
from tests.integration.test_gateway_api import start_gateway
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("option", ["--port", "--nats-port"])
def test_up_refuses_a_port_in_use_before_starting_anything(
    tmp_path: Path, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = "--nats-port" if option == "--port" else "--port"
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        free_port = free.getsockname()[1]
        free.close()
        data = tmp_path / "data"
        assert main(["up", "--data-dir", str(data), option, str(port), other, str(free_port)]) == 2
    err = capsys.readouterr().err
    assert f"port {port}" in err and "already in use" in err and option in err and "Traceback" not in err
    assert sorted(p.name for p in data.iterdir()) == ["up.lock"]  # nothing started, nothing written


def test_the_demo_sets_up_only_on_a_new_data_directory(tmp_path: Path) -> None:
    assert mark_demo_setup(tmp_path, quota_events=0)  # new: the demo will set its price and quotas
    (tmp_path / DEMO_SETUP_MARKER).unlink()  # ... which it did
    assert not mark_demo_setup(tmp_path, quota_events=4)  # a restart: the user's quotas stay
    (tmp_path / DEMO_SETUP_MARKER).touch()  # a first start interrupted before the setup was done
    assert mark_demo_setup(tmp_path, quota_events=1)


async def _run_workload(bus: SecuredNatsServer, marker: Path) -> dict[str, list[Any]]:
    """The real workload (as the `workload` user) against recording stand-ins of billing, quota and
    scheduler (each as its service's user); until it submits."""
    seen: dict[str, list[Any]] = {"price": [], "set": [], "submit": []}
    servers = []
    for service, verb in (("billing", "price"), ("quota", "set"), ("scheduler", "submit")):
        server = CommandServer(bus.url_for(service), service)

        async def record(request: dict[str, Any], verb: str = verb) -> str:
            seen[verb].append(request)
            return "ok"

        server.register(verb, dict, record)
        await server.start()
        servers.append(server)
    args = argparse.Namespace(nats=bus.url_for("workload"), gpus=16, gpu_model="H100-80GB", price=3.5, load=1.1, seed=7)
    args.setup_marker = marker
    stop = asyncio.Event()
    task = asyncio.create_task(workload(args, stop))
    try:
        await eventually(lambda: bool(seen["submit"]), within=60)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        for server in servers:
            await server.stop()
    return seen


async def test_a_restarted_workload_submits_without_touching_quotas(
    nats_server: SecuredNatsServer, tmp_path: Path
) -> None:
    marker = tmp_path / DEMO_SETUP_MARKER
    marker.touch()
    first = await _run_workload(nats_server, marker)
    assert first["price"] and len(first["set"]) == 3 and not marker.exists()
    again = await _run_workload(nats_server, marker)
    assert again["price"] == [] and again["set"] == [] and again["submit"]


async def test_healthz_answers_503_while_the_bus_is_down(nats_server: SecuredNatsServer) -> None:
    stop, task, url = await start_gateway(nats_server.url_for("gateway"))

    async def status() -> tuple[int, dict[str, Any]]:
        try:
            async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as r:
                return r.status, await r.json()
        except aiohttp.ClientError:
            return 0, {}

    try:
        await eventually(lambda: _is(status, 200), within=60)
        nats_server.kill()
        await eventually(lambda: _is(status, 503), within=60)
        code, body = await status()
        assert code == 503
        assert body["ok"] is False and body["nats_connected"] is False
        nats_server.start()
        await eventually(lambda: _is(status, 200), within=60)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def _is(status: Any, code: int) -> bool:
    return bool((await status())[0] == code)


async def test_a_gpu_model_that_matches_no_gpu_of_the_fleet_is_warned_about(
    nats_server: SecuredNatsServer, js: Any, tmp_path: Path
) -> None:
    """Issue 16, finding 17: `--gpu-model H100` on a fleet of H100-80GB matched nothing, silently."""
    import json
    import sys

    kv = await js.create_key_value(bucket="chamber_fleet")
    node = {"cluster": "local", "node": "sim-000", "status": "ready", "gpus": [{"index": 0, "model": "H100-80GB"}]}
    await kv.put("local.sim-000", json.dumps(node).encode())
    scheduler = CommandServer(nats_server.url_for("scheduler"), "scheduler")

    async def submit(request: dict[str, Any]) -> dict[str, str]:
        return {"id": "j-1"}

    scheduler.register("submit", dict, submit)
    await scheduler.start()

    async def chamber_submit(model: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "services.cli", "submit", "--team", "vision", "--gpus", "1"],
            *["--gpu-model", model, "--nats", nats_server.url],
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0 and out.decode().strip() == "j-1", err.decode()
        return err.decode()

    try:
        warned = await chamber_submit("H100")
        assert "no GPU in the fleet is a 'H100'" in warned and "H100-80GB" in warned
        assert "warning" not in await chamber_submit("h100-80gb")
    finally:
        await scheduler.stop()


async def test_up_does_not_call_another_process_answering_on_its_port_ready(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 16, finding 10: the readiness check wants *our* gateway (its pid), not any /healthz."""
    import http.server
    import json
    import threading

    from services.cli.up import _wait_for_gateway
    from services.stack.supervisor import Component

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"ok": True, "pid": 1}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ours = argparse.Namespace(components=[Component("gateway", [], pid=424242)])
    try:
        await _wait_for_gateway(server.server_address[1], asyncio.Event(), ours, Path("api-token"), timeout_s=10)
    finally:
        server.shutdown()
        server.server_close()
    out = capsys.readouterr().out
    assert "NOT ready: another process answers" in out and "dashboard  ready" not in out
