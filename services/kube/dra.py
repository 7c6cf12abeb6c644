"""DRA ResourceClaims for the NVIDIA DRA driver, read as the GPUs or the GPU share a pod asks for.

The shapes are the driver's (NVIDIA/k8s-dra-driver-gpu: its quickstart specs and its API,
`api/nvidia.com/resource/v1beta1`):

    spec.devices.requests[]:  name; deviceClassName gpu.nvidia.com (a GPU) or mig.nvidia.com (a MIG
                              device); count (default 1); selectors[].cel.expression. In resource.k8s.io/v1
                              the same fields sit under `exactly`.
    spec.devices.config[]:    requests (names; none: every request); opaque.driver gpu.nvidia.com;
                              opaque.parameters: kind GpuConfig / MigDeviceConfig, sharing.strategy
                              TimeSlicing | MPS, sharing.mpsConfig.defaultActiveThreadPercentage and
                              defaultPinnedDeviceMemoryLimit.

A MIG device's profile is named by a CEL selector, `device.attributes['gpu.nvidia.com'].profile ==
'1g.10gb'`. What Chamber reads: GPU requests are whole GPUs (time-slicing among the containers of the
claim changes nothing about which GPU); a GPU request of count 1 whose MPS config gives each client a
thread percentage is a fraction (that share of the GPU, MPS mode, with the pinned memory limit); a MIG
request is one instance of its profile. Chamber decides placement; the driver enforces it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.kube.resources import ShareRequest, WorkloadError, memory_quantity_mib

GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
DRIVER = "gpu.nvidia.com"
_PROFILE = re.compile(r"""device\.attributes\[['"]gpu\.nvidia\.com['"]\]\.profile\s*==\s*['"]([^'"]+)['"]""")


@dataclass(frozen=True)
class DraRequest:
    """What a pod's NVIDIA claims ask for: whole GPUs, or one share of a GPU (never both)."""

    gpus: int = 0
    share: ShareRequest | None = None


def _request(raw: dict[str, Any]) -> dict[str, Any]:
    """A device request's fields, from resource.k8s.io/v1 (`exactly`) or the beta APIs (inline)."""
    exact = raw.get("exactly")
    return {**exact, "name": raw.get("name", "")} if isinstance(exact, dict) else raw


def _memory_mib(value: Any, where: str) -> int:
    return memory_quantity_mib(value, where)


def _sharing(spec: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    """The NVIDIA driver's sharing settings that apply to request `name` ({} when none)."""
    found: dict[str, Any] = {}
    for i, config in enumerate(spec.get("config") or []):
        names = config.get("requests") or []
        opaque = config.get("opaque") or {}
        if (names and name not in names) or opaque.get("driver") != DRIVER:
            continue
        sharing = (opaque.get("parameters") or {}).get("sharing")
        if isinstance(sharing, dict):
            if found and found != sharing:
                raise WorkloadError(f"{where}.config[{i}]: a second sharing setting for request {name!r}")
            found = sharing
    return found


def claim_request(claim_spec: dict[str, Any], where: str = "spec") -> DraRequest:
    """What one ResourceClaim's spec (or a ResourceClaimTemplate's spec.spec) asks of NVIDIA devices."""
    devices = claim_spec.get("devices") or {}
    gpus = 0
    shares: list[ShareRequest] = []
    for i, raw in enumerate(devices.get("requests") or []):
        req, at = _request(raw), f"{where}.devices.requests[{i}]"
        cls = req.get("deviceClassName")
        if cls not in (GPU_CLASS, MIG_CLASS):
            continue  # another driver's devices: not Chamber's to place
        if req.get("allocationMode") == "All":
            raise WorkloadError(f"{at}: allocationMode All takes every {cls} device of a node; ask for a count")
        n = req.get("count", 1)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise WorkloadError(f"{at}.count: {n!r} is not a number of devices (1 or more)")
        if cls == MIG_CLASS:
            shares.append(_mig(req, n, at))
            continue
        sharing = _sharing(devices, str(req.get("name", "")), where)
        mps = sharing.get("mpsConfig") or {}
        percent = mps.get("defaultActiveThreadPercentage")
        if sharing.get("strategy") == "MPS" and percent is not None:
            if n != 1:
                raise WorkloadError(f"{at}: an MPS share is part of one GPU; ask for count 1 per pod")
            if not isinstance(percent, int) or not 0 < percent <= 100:
                raise WorkloadError(f"{at}: defaultActiveThreadPercentage {percent!r} is outside 1..100")
            limit = mps.get("defaultPinnedDeviceMemoryLimit")
            memory = _memory_mib(limit, f"{at} defaultPinnedDeviceMemoryLimit") if limit is not None else 0
            shares.append(ShareRequest(gpu_milli=percent * 10, gpu_memory_mib=memory, mode="mps"))
        else:
            gpus += n
    return _one(gpus, shares, where)


def _mig(req: dict[str, Any], n: int, at: str) -> ShareRequest:
    profiles = {
        m.group(1)
        for s in req.get("selectors") or []
        if (m := _PROFILE.search(str((s.get("cel") or {}).get("expression", ""))))
    }
    if len(profiles) != 1:
        raise WorkloadError(
            f"{at}: name the MIG profile in a CEL selector, "
            "device.attributes['gpu.nvidia.com'].profile == '1g.10gb' (one profile per request)"
        )
    return ShareRequest(mig_profile=profiles.pop(), mig_count=n)


def _one(gpus: int, shares: list[ShareRequest], where: str) -> DraRequest:
    if shares and (gpus or len(shares) > 1):
        raise WorkloadError(f"{where}: asks for a GPU share and other GPUs; a pod takes one share, or whole GPUs")
    return DraRequest(gpus, shares[0] if shares else None)


def pod_request(
    pod_spec: dict[str, Any],
    templates: Mapping[str, dict[str, Any]],
    claims: Mapping[str, dict[str, Any]] | None = None,
    where: str = "spec",
) -> DraRequest | None:
    """What a pod's `resourceClaims` ask of NVIDIA devices (None: none asks), looking up the namespace's
    ResourceClaimTemplates (`templates`, by name) and ResourceClaims (`claims`). A claim named by several
    pods is shared by them: Chamber places pods, so such a claim is refused (use a template)."""
    gpus, shares = 0, []
    for i, ref in enumerate(pod_spec.get("resourceClaims") or []):
        at = f"{where}.resourceClaims[{ref.get('name', i)}]"
        if (name := ref.get("resourceClaimTemplateName")) is not None:
            template = templates.get(name)
            if template is None:
                raise WorkloadError(f"{at}: no ResourceClaimTemplate {name!r} in the namespace")
            found = claim_request((template.get("spec") or {}).get("spec") or {}, f"ResourceClaimTemplate {name}")
        elif (name := ref.get("resourceClaimName")) is not None:
            claim = (claims or {}).get(name)
            if claim is None:
                raise WorkloadError(f"{at}: no ResourceClaim {name!r} in the namespace")
            found = claim_request(claim.get("spec") or {}, f"ResourceClaim {name}")
            if found.gpus or found.share:
                raise WorkloadError(
                    f"{at}: ResourceClaim {name} may be shared by several pods; Chamber places each pod's GPUs, "
                    "so give the pod a resourceClaimTemplateName"
                )
        else:
            continue
        gpus += found.gpus
        shares.extend([found.share] if found.share else [])
    result = _one(gpus, shares, where)
    return result if result.gpus or result.share else None
