"""`chamber service webhook`: the mutating and validating admission webhook, over HTTPS (aiohttp).

`POST /mutate` holds Chamber's workloads on create (suspended or gated); `POST /validate` refuses
what a namespace may not use; `GET /healthz` for probes. Decisions are `services.webhook.core`.
The certificate and the bindings are files (a Secret and a ConfigMap in the chart): both are read
again when they change on disk, so a rotated certificate (cert-manager, or the chart's CA on
upgrade) and edited bindings apply without a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web

from services.kube.bindings import Bindings, BindingsError
from services.runtime.health import HealthServer, HealthState, port_from_env
from services.runtime.logs import get_logger
from services.webhook.core import MAX_BODY, BadReview, mutate, parse, validate

NAME = "webhook"
DESCRIPTION = "admission webhook: hold team workloads for Chamber, refuse what a namespace may not use"
log = get_logger("chamber.webhook")
DEFAULT_TLS_DIR = "/etc/chamber/webhook-tls"
RUNS_IN_UP = False  # `chamber up` has no API server to call it (and no certificate to serve)


class Files:
    """The certificate and the bindings, reloaded when their files change."""

    def __init__(self, cert: Path, key: Path, bindings: Path | None) -> None:
        self.cert, self.key, self.bindings_path = cert, key, bindings
        self.ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ssl.minimum_version = ssl.TLSVersion.TLSv1_2
        self._cert_stamp: tuple[float, float] | None = None
        self._bindings_stamp: float | None = None
        self.bindings = Bindings.load(None)
        self.refresh()

    def refresh(self) -> None:
        stamp = (self.cert.stat().st_mtime, self.key.stat().st_mtime)
        if stamp != self._cert_stamp:
            self.ssl.load_cert_chain(self.cert, self.key)  # new connections get the new certificate
            if self._cert_stamp is not None:
                log.info("certificate reloaded", cert=str(self.cert))
            self._cert_stamp = stamp
        if self.bindings_path is not None:
            mtime = self.bindings_path.stat().st_mtime
            if mtime != self._bindings_stamp:
                self.bindings = Bindings.load(self.bindings_path)
                if self._bindings_stamp is not None:
                    log.info("bindings reloaded", file=str(self.bindings_path))
                self._bindings_stamp = mtime


def app(files: Files) -> web.Application:
    async def review(request: web.Request) -> web.Response:
        try:
            req = parse(await request.read())
        except BadReview as exc:
            return web.json_response({"error": str(exc), "status": 400}, status=400)
        except Exception as exc:  # a shape parse() did not foresee: still a 400 with a reason, never a 500
            log.exception("unreadable admission review")
            return web.json_response(
                {"error": f"unreadable AdmissionReview ({type(exc).__name__})", "status": 400}, status=400
            )
        try:
            answer = mutate(req) if request.path == "/mutate" else validate(req, files.bindings)
        except Exception as exc:  # a bug must not become a 500 the API server turns into a failed apply
            log.exception("review failed", uid=req.uid, kind=req.kind)
            answer = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": req.uid,
                    "allowed": False,
                    "status": {"code": 500, "message": f"Chamber's webhook failed ({type(exc).__name__}); see its log"},
                },
            }
        response = answer["response"]
        log.info(
            "admission",
            path=request.path,
            kind=req.kind,
            namespace=req.namespace,
            allowed=response["allowed"],
            patched="patch" in response,
            reason=(response.get("status") or {}).get("message", ""),
        )
        return web.json_response(answer)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    application = web.Application(client_max_size=MAX_BODY + 1024)
    application.router.add_post("/mutate", review)
    application.router.add_post("/validate", review)
    application.router.add_get("/healthz", healthz)
    return application


def add_arguments(parser: argparse.ArgumentParser) -> None:
    tls = os.environ.get("CHAMBER_WEBHOOK_TLS_DIR", DEFAULT_TLS_DIR)
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    parser.add_argument("--port", type=int, default=9443, help="HTTPS port (default 9443)")
    parser.add_argument("--cert", default=f"{tls}/tls.crt", help="server certificate (PEM; default %(default)s)")
    parser.add_argument("--key", default=f"{tls}/tls.key", help="its private key (PEM; default %(default)s)")
    parser.add_argument(
        "--bindings",
        default=os.environ.get("CHAMBER_KUBE_BINDINGS") or None,
        metavar="FILE",
        help="namespace -> team bindings and Kueue names (YAML; default $CHAMBER_KUBE_BINDINGS; none: any "
        "namespace may charge any team)",
    )
    parser.add_argument("--reload-interval", type=float, default=30.0, help="seconds between checks for new files")


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    try:
        files = Files(Path(args.cert), Path(args.key), Path(args.bindings) if args.bindings else None)
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(
            f"chamber webhook: certificate: {exc} (give --cert and --key, or $CHAMBER_WEBHOOK_TLS_DIR with "
            "tls.crt and tls.key)"
        ) from None
    except BindingsError as exc:
        raise SystemExit(f"chamber webhook: {exc}") from None
    if files.bindings.open:
        log.warning("no --bindings file: any namespace may charge any team")
    runner = web.AppRunner(app(files), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    listening = _Listening()
    health_port = port_from_env()
    health = HealthServer(HealthState(NAME, nc=listening), port=health_port) if health_port else None
    try:
        if health is not None:
            await health.start()
        await web.TCPSite(runner, args.host, args.port, ssl_context=files.ssl).start()
        listening.is_connected = True
        log.info("webhook listening", host=args.host, port=args.port)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=args.reload_interval)
            except TimeoutError:
                _reload(files)
    finally:
        if health is not None:
            await health.stop()
        await runner.cleanup()


class _Listening:
    """What the runtime's readiness probe reads (it has no NATS here): ready once HTTPS listens."""

    is_connected = False


def _reload(files: Files) -> Any:
    try:
        files.refresh()
    except (OSError, ssl.SSLError, BindingsError) as exc:  # keep serving with what was loaded
        log.warning("could not reload", error=str(exc))
