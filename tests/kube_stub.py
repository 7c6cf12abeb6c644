"""A small local stand-in for the Kubernetes API server: just the endpoints Chamber uses.

It records every request (method, path, content type, JSON body) so tests assert exactly what the
real `kubernetes` client sent, and applies patches the way the API server does for these fields
(strategic merge: maps merge and `null` deletes, `taints` is replaced whole, status conditions merge
by `type`; a stale `resourceVersion` is refused with 409).

Besides Nodes it serves namespaced workloads of any kind (`add(obj)`): list across namespaces with
a label selector (and a field selector of `path=value` terms), get, PATCH as JSON Patch (RFC 6902,
applied by the `jsonpatch` library; a failed `test` is refused with 422) or merge patch, create
(POST to the collection; 409 if the name is taken) and DELETE; `POST .../events` stores Events; `GET /apis` lists only
the API groups in `api_groups`, so a test decides which CRDs are "installed". A Pod's spec may only
change its scheduling gates and, while gated, its affinity (as the API server enforces).
"""

from __future__ import annotations

import copy
import itertools
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jsonpatch


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    content_type: str | None
    body: Any
    query: str = field(default="", compare=False)


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
        self.objects: dict[tuple[str, str, str, str], dict] = {}  # type: ignore[type-arg]  # (api, plural, ns, name)
        self.api_groups: list[tuple[str, str]] = []  # (group, version) served besides the core groups
        self.events: list[dict] = []  # type: ignore[type-arg]
        self._uids = itertools.count(1)
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

            def do_POST(self) -> None:
                stub._handle(self, "POST")

            def do_DELETE(self) -> None:
                stub._handle(self, "DELETE")

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
        path, _, query = h.path.partition("?")
        request = Request(method, path, h.headers.get("Content-Type"), body, query)
        with self._lock:
            self.requests.append(request)
            if path.startswith("/api/v1/nodes"):
                status, payload = self._route(method, path, body)
            else:
                status, payload = self._route_objects(method, path, query, request.content_type, body)
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

    # -- workloads of any kind -------------------------------------------------------------------

    def add(self, obj: dict, plural: str | None = None) -> dict:  # type: ignore[type-arg]
        """Store an object as created (uid and resourceVersion filled in); returns the stored copy."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._uids)}")
        meta.setdefault("resourceVersion", "1")
        key = (_api_of(obj["apiVersion"]), plural or _plural(obj["kind"]), meta["namespace"], meta["name"])
        self.objects[key] = obj
        return obj

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict:  # type: ignore[type-arg]
        return self.objects[(_api_of(api_version), _plural(kind), namespace, name)]

    def _route_objects(
        self, method: str, path: str, query: str, content_type: str | None, body: Any
    ) -> tuple[int, Any]:
        if path.rstrip("/") == "/apis" and method == "GET":
            groups = {}
            for group, version in [("batch", "v1"), ("apps", "v1"), *self.api_groups]:
                entry = groups.setdefault(group, {"name": group, "versions": []})
                entry["versions"].append({"groupVersion": f"{group}/{version}", "version": version})
            for entry in groups.values():
                entry["preferredVersion"] = entry["versions"][0]
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": list(groups.values())}
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            api, rest = "/api/v1", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            api, rest = f"/apis/{parts[1]}/{parts[2]}", parts[3:]
            if parts[1] not in ("batch", "apps") and (parts[1], parts[2]) not in self.api_groups:
                return 404, _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        else:
            return 404, _status(404, "NotFound", path)
        if len(rest) == 1 and method == "GET":
            return 200, self._list(api, rest[0], None, query)
        if len(rest) == 3 and rest[0] == "namespaces" and method == "GET":
            return 200, self._list(api, rest[2], rest[1], query)
        if len(rest) == 3 and rest[0] == "namespaces" and method == "POST" and rest[2] == "events":
            event = copy.deepcopy(body)
            event["metadata"]["name"] = event["metadata"].pop("generateName", "event.") + str(len(self.events))
            self.events.append(event)
            return 201, event
        if len(rest) == 3 and rest[0] == "namespaces" and method == "POST":
            return self._create(api, rest[2], rest[1], body)
        if len(rest) != 4 or rest[0] != "namespaces":
            return 404, _status(404, "NotFound", path)
        key = (api, rest[2], rest[1], rest[3])
        obj = self.objects.get(key)
        if obj is None:
            return 404, _status(404, "NotFound", f'{rest[2]} "{rest[3]}" not found')
        if method == "GET":
            return 200, obj
        if method == "DELETE":
            del self.objects[key]
            if rest[2] == "pods":  # a Pod is deleted gracefully: the API server answers with the Pod
                return 200, obj
            return 200, {**_status(200, "", f'{rest[2]} "{rest[3]}" deleted'), "status": "Success"}
        if method != "PATCH":
            return 405, _status(405, "MethodNotAllowed", method)
        try:
            if content_type == "application/json-patch+json":
                patched = jsonpatch.apply_patch(obj, body)
            else:
                patched = copy.deepcopy(obj)
                _merge_patch(patched, body)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            return 422, _status(422, "Invalid", f"the patch could not be applied: {exc}")
        if rest[2] == "pods" and (refusal := _pod_update_refusal(obj, patched)):
            return 422, _status(422, "Invalid", refusal)
        patched["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        self.objects[key] = patched
        return 200, patched

    def _create(self, api: str, plural: str, namespace: str, body: Any) -> tuple[int, Any]:
        """POST to a namespaced collection: stored with a uid, or 409 if the name is taken."""
        meta = (body or {}).get("metadata") or {}
        name = meta.get("name")
        if not name or meta.get("namespace", namespace) != namespace:
            return 422, _status(422, "Invalid", "metadata.name is required and metadata.namespace must match the path")
        key = (api, plural, namespace, name)
        if key in self.objects:
            return 409, _status(409, "AlreadyExists", f'{plural} "{name}" already exists')
        obj = copy.deepcopy(body)
        obj["metadata"]["namespace"] = namespace
        obj["metadata"]["uid"] = f"uid-{next(self._uids)}"
        obj["metadata"]["resourceVersion"] = "1"
        self.objects[key] = obj
        return 201, obj

    def _list(self, api: str, plural: str, namespace: str | None, query: str) -> dict:  # type: ignore[type-arg]
        selector = (parse_qs(query).get("labelSelector") or [""])[0]
        fields = (parse_qs(query).get("fieldSelector") or [""])[0]
        items = [
            copy.deepcopy(o)
            for (a, p, ns, _), o in sorted(self.objects.items())
            if a == api and p == plural and namespace in (None, ns) and _selects(selector, o) and _fields(fields, o)
        ]
        return {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}


_PLURALS = {"Job": "jobs", "Pod": "pods", "JobSet": "jobsets", "TrainJob": "trainjobs", "PyTorchJob": "pytorchjobs"}


def _plural(kind: str) -> str:
    return _PLURALS.get(kind, kind.lower() + "s")


def _api_of(api_version: str) -> str:
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def _selects(selector: str, obj: dict) -> bool:  # type: ignore[type-arg]
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, eq, value = term.partition("=")
        if key not in labels or (eq and labels[key] != value):
            return False
    return True


def _fields(selector: str, obj: dict) -> bool:  # type: ignore[type-arg]
    """A field selector of `path=value` terms (e.g. `spec.nodeName=n1`, as the API server serves for Pods)."""
    for term in filter(None, selector.split(",")):
        path, _, value = term.partition("=")
        found: Any = obj
        for part in path.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        if found != value:
            return False
    return True


def _merge_patch(target: dict, patch: dict) -> None:  # type: ignore[type-arg]
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge_patch(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


def _pod_update_refusal(old: dict, new: dict) -> str | None:  # type: ignore[type-arg]
    """Pod updates may not change the spec, except scheduling gates, and node affinity while gated."""
    before, after = copy.deepcopy(old["spec"]), copy.deepcopy(new["spec"])
    gated = bool(before.get("schedulingGates"))
    for spec in (before, after):
        spec.pop("schedulingGates", None)
        if gated:
            spec.pop("affinity", None)
    if before != after:
        return "Pod updates may not change fields other than scheduling gates and, while gated, node affinity"
    return None


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
