"""A small local stand-in for the Kubernetes API server: just the Node endpoints Chamber uses.

It records every request (method, path, content type, JSON body) so tests assert exactly what the
real `kubernetes` client sent, and applies patches the way the API server does for these fields
(strategic merge: maps merge and `null` deletes, `taints` is replaced whole, status conditions merge
by `type`; a stale `resourceVersion` is refused with 409).
"""

from __future__ import annotations

import copy
import json
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    content_type: str | None
    body: Any


def a_k8s_node(name: str, *, gpus: int = 8, unschedulable: bool = False, taints: list | None = None) -> dict:  # type: ignore[type-arg]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.count": str(gpus),
            },
            "annotations": {},
        },
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "capacity": {"cpu": "96", "nvidia.com/gpu": str(gpus)},
            "allocatable": {"cpu": "95", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}],
        },
    }


class KubeStub:
    def __init__(self, nodes: list[dict] | None = None) -> None:  # type: ignore[type-arg]
        self.nodes: dict[str, dict] = {n["metadata"]["name"]: n for n in (nodes or [])}  # type: ignore[type-arg]
        self.requests: list[Request] = []
        self.on_request: Any = None  # optional callback(Request), e.g. to time a patch
        self.conflicts_to_inject = 0
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the real API server: one connection per client thread

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in two writes: without NODELAY, Nagle and delayed ACKs add
                # ~40 ms per request on a kept-alive connection (Go's API server sets it too).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                stub._handle(self, "GET")

            def do_PATCH(self) -> None:
                stub._handle(self, "PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> KubeStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "stub", "cluster": {"server": self.url}}],
                    "users": [{"name": "stub", "user": {"token": "test-token"}}],
                    "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub"}}],
                    "current-context": "stub",
                }
            )
        )
        return path

    def client(self) -> Any:
        from kubernetes import client

        configuration = client.Configuration(host=self.url)
        return client.CoreV1Api(client.ApiClient(configuration))

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method != "GET"]

    # -- HTTP -------------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        path = h.path.split("?")[0]
        request = Request(method, path, h.headers.get("Content-Type"), body)
        with self._lock:
            self.requests.append(request)
            status, payload = self._route(method, path, body)
        if self.on_request is not None:
            self.on_request(request)
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if parts[:3] != ["api", "v1", "nodes"]:
            return 404, _status(404, "NotFound", path)
        if len(parts) == 3 and method == "GET":
            return 200, {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": list(self.nodes.values())}
        node = self.nodes.get(parts[3]) if len(parts) > 3 else None
        if node is None:
            return 404, _status(404, "NotFound", f'nodes "{parts[3] if len(parts) > 3 else ""}" not found')
        if method == "GET" and len(parts) == 4:
            return 200, node
        if method == "PATCH":
            want_rv = (body.get("metadata") or {}).get("resourceVersion")
            if self.conflicts_to_inject or (want_rv is not None and want_rv != node["metadata"]["resourceVersion"]):
                self.conflicts_to_inject = max(0, self.conflicts_to_inject - 1)
                node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                return 409, _status(409, "Conflict", "the object has been modified")
            if len(parts) == 5 and parts[4] == "status":
                _merge_conditions(node, body)
            elif len(parts) == 4:
                _merge_node(node, body)
            else:
                return 404, _status(404, "NotFound", path)
            node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
            return 200, node
        return 405, _status(405, "MethodNotAllowed", method)


def _status(code: int, reason: str, message: str) -> dict:  # type: ignore[type-arg]
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def _merge_map(target: dict, patch: dict) -> None:  # type: ignore[type-arg]
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = v


def _merge_node(node: dict, body: dict) -> None:  # type: ignore[type-arg]
    meta = body.get("metadata") or {}
    for key in ("labels", "annotations"):
        if key in meta:
            node["metadata"].setdefault(key, {})
            _merge_map(node["metadata"][key], meta[key])
    for k, v in (body.get("spec") or {}).items():
        node["spec"][k] = copy.deepcopy(v)


def _merge_conditions(node: dict, body: dict) -> None:  # type: ignore[type-arg]
    conditions = node["status"].setdefault("conditions", [])
    for c in (body.get("status") or {}).get("conditions", []):
        existing = next((x for x in conditions if x["type"] == c["type"]), None)
        if existing is None:
            conditions.append(dict(c))
        else:
            existing.update(c)
