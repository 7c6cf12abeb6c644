"""Liveness and readiness over HTTP (aiohttp), for Kubernetes probes.

- `GET /livez`  200 while the event loop answers (a hung loop times the probe out; a crashed consumer
  or ticker ends the whole process, see host.serve). It does NOT look at NATS: a NATS outage must not
  make Kubernetes restart every pod (nats-py reconnects).
- `GET /readyz` 200 when NATS is connected, every consumer is bound to its stream and the decider
  host (if any) has caught up; 503 otherwise, e.g. "replaying: folded 120000 of 500000" while it
  folds the log at start, or while a new leader re-syncs.
- `GET /metrics` Prometheus text: `chamber_replaying{service="..."}` 1 while replaying, else 0.
The probes answer a small JSON report: NATS connectivity, replay progress and each consumer's
progress (handled, skipped, dead, retried, last acked stream sequence, seconds since it last acked).

A service turns it on with `--health-port` / `CHAMBER_HEALTH_PORT` (see `port_from_env`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from services.runtime.logs import get_logger

log = get_logger("chamber.runtime.health")

ENV_PORT = "CHAMBER_HEALTH_PORT"
ENV_HOST = "CHAMBER_HEALTH_HOST"
_MAX_REQUEST_BYTES = 8192
REPLAYING_GAUGE = ("chamber_replaying", "1 while the service folds its log (at start, or a new leader re-syncing)")


def port_from_env() -> int | None:
    """The health port from $CHAMBER_HEALTH_PORT; unset, empty or 0 means no health server."""
    raw = os.environ.get(ENV_PORT, "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_PORT} must be a port number, got {raw!r}") from None
    return port or None


@dataclass
class HealthState:
    """What the probes look at; the host fills in the connection and consumers as they appear."""

    service: str
    nc: Any = None  # a nats-py Client: only `is_connected` is read
    consumers: Sequence[Any] = ()
    # Each returns why the process cannot do its job now (None: fine), e.g. the agent's "no stream
    # takes this node's samples"; any problem makes it not ready, and the report says which.
    checks: list[Callable[[], str | None]] = field(default_factory=list)
    # The decider host's progress: "replaying: folded N of M" until caught up, None once it is.
    replaying: Callable[[], str | None] = field(default=lambda: None)
    started_at: float = field(default_factory=time.monotonic)
    _progress: dict[str, tuple[int, float]] = field(default_factory=dict)

    def report(self) -> tuple[bool, bool, dict[str, Any]]:
        """(live, ready, body)."""
        now = time.monotonic()
        connected = bool(self.nc is not None and self.nc.is_connected)
        consumers = [self._consumer_report(c, now) for c in self.consumers]
        bound = all(c["bound"] for c in consumers)
        live = True  # answering at all is the liveness signal
        replaying = self.replaying()
        problems = [p for check in self.checks if (p := check())]
        if replaying:
            problems.append(replaying)
        ready = connected and bound and not problems
        body: dict[str, Any] = {
            "service": self.service,
            "live": live,
            "ready": ready,
            "nats": "connected" if connected else "disconnected",
            "uptime_s": round(now - self.started_at, 1),
            "consumers": consumers,
            "replaying": replaying,
        }
        if problems:
            body["problems"] = problems
        return live, ready, body

    def _consumer_report(self, consumer: Any, now: float) -> dict[str, Any]:
        stats = consumer.stats
        key = f"{consumer.options.stream}/{consumer.name}"
        last_seq, since = self._progress.get(key, (-1, self.started_at))
        if stats.last_acked_seq != last_seq:  # progress is noticed when probed; fine at probe rates
            self._progress[key] = (stats.last_acked_seq, now)
            since = now
        return {
            "stream": consumer.options.stream,
            "consumer": consumer.name,
            "bound": consumer.bound,
            "handled": stats.handled,
            "skipped": stats.skipped,
            "dead": stats.dead,
            "retried": stats.retried,
            "last_acked_seq": stats.last_acked_seq,
            "idle_s": round(now - since, 1),
        }


class HealthServer:
    """The probes on aiohttp (the gateway's HTTP server too): one catch-all route, so a wrong path
    or method gets the same small JSON answer as the probes."""

    def __init__(self, state: HealthState, *, port: int, host: str | None = None) -> None:
        self.state = state
        self.port = port
        self.host = host or os.environ.get(ENV_HOST, "0.0.0.0")  # probes come from the kubelet, not localhost
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=_MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])  # port 0 picks a free one (tests)
        log.info("health server listening", host=self.host, port=self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        if request.method in ("GET", "HEAD") and request.path == "/metrics":
            return web.Response(text=self.metrics(), content_type="text/plain", charset="utf-8")
        status, body = self._route(request.method, request.path)
        return web.json_response(body, status=status)

    def metrics(self) -> str:
        """Prometheus text format: whether this service is still folding its log."""
        name = self.state.service.replace("\\", "").replace('"', "")
        replaying = 1 if self.state.replaying() else 0
        return (
            f"# HELP {REPLAYING_GAUGE[0]} {REPLAYING_GAUGE[1]}\n# TYPE {REPLAYING_GAUGE[0]} gauge\n"
            f'{REPLAYING_GAUGE[0]}{{service="{name}"}} {replaying}\n'
        )

    def _route(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        if method not in ("GET", "HEAD"):
            return 405, {"error": "use GET"}
        if path not in ("/livez", "/readyz", "/healthz"):
            return 404, {"error": "try /livez, /readyz or /metrics"}
        live, ready, body = self.state.report()
        ok = live if path == "/livez" else ready
        return (200 if ok else 503), body
