"""Kubernetes node actuator: turns isolation decisions into Node patches, and undoes only its own.

- Node isolated: cordon (only if not cordoned already, remembered in an annotation), taint
  `chamber.io/gpu-unhealthy=<code>:NoSchedule`, condition `ChamberGPUHealthy=False` with the reason.
- GPU isolated: annotation `chamber.io/isolated-gpus` lists the isolated GPU UUIDs (for the device
  plugin or an admission policy) and label `chamber.io/isolated-gpu-count` makes them selectable.
- Restored: remove our taint, uncordon only if Chamber cordoned, condition back to True.

Every patch is computed from a fresh GET and carries its `resourceVersion`, so a concurrent edit
makes the API server refuse it (409) and the patch is recomputed. A patch that would change nothing
is not sent. With `dry_run` the patches are logged, never sent. The client is synchronous: the shell
calls `apply` in a worker thread.
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from typing import Any

from events.base import Event
from events.fleet import GpuIsolated, GpuRestored, NodeIsolated, NodeRestored
from services.runtime.kube import client_from  # noqa: F401 (re-exported: health's setup and tests use it here)
from services.runtime.logs import get_logger

log = get_logger("chamber.health.kube")

TAINT_KEY = "chamber.io/gpu-unhealthy"
CONDITION = "ChamberGPUHealthy"
CORDONED = "chamber.io/cordoned"  # "true" when Chamber set spec.unschedulable (so restore may undo it)
REASON = "chamber.io/isolation-reason"
ISOLATED_GPUS = "chamber.io/isolated-gpus"
ISOLATED_GPU_COUNT = "chamber.io/isolated-gpu-count"
PATCH = "application/strategic-merge-patch+json"
CONFLICT_RETRIES = 3


def taint_value(reason: str) -> str:
    """A label-value-safe code from a decision reason (`xid-79: ...` -> `xid-79`)."""
    code = reason.split(":", 1)[0].strip()
    code = re.sub(r"[^A-Za-z0-9_.-]", "-", code)[:63].strip("-_.")
    return code or "gpu-fault"


def condition_reason(reason: str) -> str:
    """A CamelCase condition reason from the code (`xid-79` -> `Xid79`, `ecc_dbe` -> `EccDbe`)."""
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", taint_value(reason)) if part) or "GpuFault"


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeActuator:
    def __init__(self, api: Any, *, dry_run: bool = False) -> None:
        self.api = api  # kubernetes.client.CoreV1Api
        self.dry_run = dry_run
        self.sent: int = 0

    def apply(
        self, event: Event, isolated_gpus: list[str] | None = None, *, read_first: bool = False
    ) -> list[dict[str, Any]]:
        """Make the Node reflect one decision; returns the patches sent (or logged, in dry-run).

        `isolated_gpus`, for a GPU decision, is the full list of the node's GPUs Chamber holds isolated
        (the annotation is Chamber's alone): then it is written without reading the node first, or,
        with `read_first` (a reconcile), only when the node's annotation differs from it.
        """
        from kubernetes.client.exceptions import ApiException

        if isolated_gpus is not None and isinstance(event, GpuIsolated | GpuRestored) and not read_first:
            return self._gpu_list(event.node, sorted(isolated_gpus))
        for attempt in range(1, CONFLICT_RETRIES + 1):
            try:
                if isolated_gpus is not None and isinstance(event, GpuIsolated | GpuRestored):
                    return self._gpu_sync(event.node, sorted(isolated_gpus))
                return self._apply_once(event)
            except ApiException as exc:
                if exc.status == 409 and attempt < CONFLICT_RETRIES:
                    log.info("node changed under us, recomputing the patch", node=event.node, attempt=attempt)  # type: ignore[attr-defined]
                    continue
                if exc.status == 404:
                    log.warning("node not in Kubernetes, nothing to patch", node=event.node)  # type: ignore[attr-defined]
                    return []
                raise
        return []

    def _apply_once(self, event: Event) -> list[dict[str, Any]]:
        match event:
            case NodeIsolated():
                return self._node(event.node, isolate=True, reason=event.reason, at=event.at)
            case NodeRestored():
                return self._node(event.node, isolate=False, reason=event.reason, at=event.at)
            case GpuIsolated():
                return self._gpu(event.node, event.gpu_index, event.gpu_uuid, isolate=True)
            case GpuRestored():
                return self._gpu(event.node, event.gpu_index, event.gpu_uuid, isolate=False)
        return []

    # -- node -------------------------------------------------------------------------------------

    def _read(self, name: str) -> dict[str, Any]:
        # Raw JSON: the client's model deserialization costs more than the request on a busy host.
        return json.loads(_drain(self.api.read_node(name, _preload_content=False)))

    def _node(self, name: str, *, isolate: bool, reason: str, at: float) -> list[dict[str, Any]]:
        node = self._read(name)
        meta, spec = node.get("metadata") or {}, node.get("spec") or {}
        annotations = dict(meta.get("annotations") or {})
        taints = list(spec.get("taints") or [])
        others = [t for t in taints if t.get("key") != TAINT_KEY]
        unschedulable = bool(spec.get("unschedulable"))
        body_meta: dict[str, Any] = {}
        body_spec: dict[str, Any] = {}
        if isolate:
            wanted = [*others, {"key": TAINT_KEY, "value": taint_value(reason), "effect": "NoSchedule"}]
            if not unschedulable:
                body_spec["unschedulable"] = True
                body_meta[CORDONED] = "true"
            if annotations.get(REASON) != reason:
                body_meta[REASON] = reason
        else:
            wanted = others
            if annotations.get(CORDONED) == "true":
                body_spec["unschedulable"] = False  # only what Chamber did: a human's cordon stays
                body_meta[CORDONED] = None
            if REASON in annotations:
                body_meta[REASON] = None
        if wanted != taints:
            body_spec["taints"] = wanted
        patches: list[dict[str, Any]] = []
        if body_meta or body_spec:
            body: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
            if body_meta:
                body["metadata"]["annotations"] = body_meta
            if body_spec:
                body["spec"] = body_spec
            patches.append(self._send(name, body, status=False))
        status_body = {
            "status": {
                "conditions": [
                    {
                        "type": CONDITION,
                        "status": "False" if isolate else "True",
                        "reason": condition_reason(reason) if isolate else "Restored",
                        "message": reason,
                        "lastTransitionTime": rfc3339(at),
                        "lastHeartbeatTime": rfc3339(at),
                    }
                ]
            }
        }
        if _condition(node, CONDITION) != (
            "False" if isolate else "True",
            status_body["status"]["conditions"][0]["message"],
        ):
            patches.append(self._send(name, status_body, status=True))
        return patches

    # -- gpu --------------------------------------------------------------------------------------

    def _gpu(self, name: str, index: int, uuid: str | None, *, isolate: bool) -> list[dict[str, Any]]:
        meta = self._read(name).get("metadata") or {}
        current = _listed(meta)
        # One GPU, one entry: its UUID when known replaces the `index-N` written before it was known.
        placeholder = gpu_entry(index, None)
        same = {placeholder, uuid} - {None}
        others = [u for u in current if u not in same]
        wanted = sorted({*others, gpu_entry(index, uuid)}) if isolate else others
        return self._gpu_write(name, meta, current, wanted)

    def _gpu_sync(self, name: str, wanted: list[str]) -> list[dict[str, Any]]:
        """A reconcile: make the annotation the full list Chamber holds, if it is not that already."""
        meta = self._read(name).get("metadata") or {}
        return self._gpu_write(name, meta, _listed(meta), wanted)

    def _gpu_write(
        self, name: str, meta: dict[str, Any], current: list[str], wanted: list[str]
    ) -> list[dict[str, Any]]:
        if sorted(wanted) == sorted(current):
            return []
        body = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {ISOLATED_GPUS: ",".join(wanted) if wanted else None},
                "labels": {ISOLATED_GPU_COUNT: str(len(wanted)) if wanted else None},
            }
        }
        return [self._send(name, body, status=False)]

    def _gpu_list(self, name: str, wanted: list[str]) -> list[dict[str, Any]]:
        from kubernetes.client.exceptions import ApiException

        body = {
            "metadata": {
                "annotations": {ISOLATED_GPUS: ",".join(wanted) if wanted else None},
                "labels": {ISOLATED_GPU_COUNT: str(len(wanted)) if wanted else None},
            }
        }
        try:
            return [self._send(name, body, status=False)]
        except ApiException as exc:
            if exc.status == 404:
                log.warning("node not in Kubernetes, nothing to patch", node=name)
                return []
            raise

    def _send(self, name: str, body: dict[str, Any], *, status: bool) -> dict[str, Any]:
        what = "node status" if status else "node"
        if self.dry_run:
            log.info("dry run: would patch " + what, node=name, patch=body)
            return body
        patch = self.api.patch_node_status if status else self.api.patch_node
        _drain(patch(name, body, _content_type=PATCH, _preload_content=False))
        self.sent += 1
        log.info("patched " + what, node=name, patch=body)
        return body


def gpu_entry(index: int, uuid: str | None) -> str:
    """A GPU's entry in the isolated-GPUs annotation: its UUID (what a device plugin matches), or a
    placeholder naming its index while no inventory, fault or decision has named the UUID."""
    return uuid or f"index-{index}"


def _listed(meta: dict[str, Any]) -> list[str]:
    return [u for u in (meta.get("annotations") or {}).get(ISOLATED_GPUS, "").split(",") if u]


def _drain(response: Any) -> bytes:
    """Read a raw response and hand its connection back to the pool (kept alive for the next call)."""
    data: bytes = response.data
    release = getattr(response, "release_conn", None)
    if release is not None:
        release()
    return data


def _condition(node: dict[str, Any], kind: str) -> tuple[str, str] | None:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c.get("status", ""), c.get("message") or ""
    return None


def monitor_mode() -> bool:
    """`CHAMBER_MODE=monitor` (the Helm chart's report-only mode): decide and report, never write."""
    return os.environ.get("CHAMBER_MODE", "").strip().lower() == "monitor"
