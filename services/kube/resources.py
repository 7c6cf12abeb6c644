"""GPUs a pod asks for, counted the way the kubelet sizes a pod (every container, init and sidecar).

A pod's effective request of a resource is the larger of (a) its app containers plus its sidecars
(init containers with `restartPolicy: Always`, which keep running) and (b) each ordinary init
container plus the sidecars started before it (init containers run one at a time). GPU counts are
whole numbers; anything else, or more than a node could hold, is refused with the field named.
"""

from __future__ import annotations

from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
AMD_GPU_RESOURCE = "amd.com/gpu"  # AMD's Kubernetes device plugin (ROCm/k8s-device-plugin; one per partition)
GPU_RESOURCES = {GPU_RESOURCE: "nvidia", AMD_GPU_RESOURCE: "amd"}
MAX_GPUS_PER_POD = 64  # more than any node holds: a typo (e.g. 800 for 8), not a request
MAX_PODS = 10_000  # one workload's pods; beyond it the number is a typo too


class WorkloadError(ValueError):
    """A workload Chamber cannot manage as written; the message names the field and the fix."""


def _quantity(value: Any, where: str, resource: str = GPU_RESOURCE) -> int:
    text = str(value).strip()
    try:
        n = int(text)
    except ValueError:
        raise WorkloadError(f"{where}: {resource} must be a whole number of GPUs, not {text!r}") from None
    if n < 0 or n > MAX_GPUS_PER_POD:
        raise WorkloadError(f"{where}: {n} GPUs is outside 0..{MAX_GPUS_PER_POD} per pod; check the number")
    return n


def container_gpus(container: dict[str, Any], where: str) -> int:
    """Limits and requests must agree for extended resources; either alone is the request."""
    return _container_gpus(container, where)[0]


def _container_gpus(container: dict[str, Any], where: str) -> tuple[int, str | None]:
    """(GPUs, vendor) of one container: nvidia.com/gpu or amd.com/gpu, never both."""
    resources = container.get("resources") or {}
    found: list[tuple[int, str]] = []
    for resource, vendor in GPU_RESOURCES.items():
        limit = (resources.get("limits") or {}).get(resource)
        request = (resources.get("requests") or {}).get(resource)
        counted = [_quantity(v, where, resource) for v in (limit, request) if v is not None]
        if len(counted) == 2 and counted[0] != counted[1]:
            raise WorkloadError(f"{where}: {resource} request {counted[1]} differs from limit {counted[0]}")
        if counted and counted[0]:
            found.append((counted[0], vendor))
    if len(found) > 1:
        raise WorkloadError(f"{where}: asks for both {GPU_RESOURCE} and {AMD_GPU_RESOURCE}; a pod uses one vendor")
    return found[0] if found else (0, None)


def pod_vendor(pod_spec: dict[str, Any], where: str = "spec") -> str | None:
    """ "nvidia" or "amd": the GPU resource the pod's containers ask for (None: no GPU); both is refused."""
    vendors = set()
    for key in ("containers", "initContainers"):
        for i, c in enumerate(pod_spec.get(key) or []):
            _, vendor = _container_gpus(c, f"{where}.{key}[{c.get('name', i)}]")
            if vendor is not None:
                vendors.add(vendor)
    if len(vendors) > 1:
        raise WorkloadError(
            f"{where}: containers ask for both {GPU_RESOURCE} and {AMD_GPU_RESOURCE}; a pod uses one vendor"
        )
    return next(iter(vendors), None)


def pod_gpus(pod_spec: dict[str, Any], where: str = "spec") -> int:
    """The pod's effective GPU request (see the module docstring)."""
    running = sum(
        container_gpus(c, f"{where}.containers[{c.get('name', i)}]")
        for i, c in enumerate(pod_spec.get("containers") or [])
    )
    sidecars = 0
    init_peak = 0
    for i, c in enumerate(pod_spec.get("initContainers") or []):
        gpus = container_gpus(c, f"{where}.initContainers[{c.get('name', i)}]")
        if c.get("restartPolicy") == "Always":
            sidecars += gpus
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + gpus)
    total = max(running + sidecars, init_peak)
    if total > MAX_GPUS_PER_POD:
        raise WorkloadError(f"{where}: {total} GPUs in one pod is more than {MAX_GPUS_PER_POD}; check the numbers")
    return total


def count(value: Any, where: str, default: int = 1) -> int:
    """A replica / parallelism / node count: a whole number in 0..MAX_PODS."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"{where} must be a whole number, not {value!r}")
    if value < 0 or value > MAX_PODS:
        raise WorkloadError(f"{where}: {value} is outside 0..{MAX_PODS}")
    return value
