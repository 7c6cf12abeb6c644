"""GPUs a pod asks for, counted the way the kubelet sizes a pod (every container, init and sidecar).

A pod's effective request of a resource is the larger of (a) its app containers plus its sidecars
(init containers with `restartPolicy: Always`, which keep running) and (b) each ordinary init
container plus the sidecars started before it (init containers run one at a time). GPU counts are
whole numbers; anything else, or more than a node could hold, is refused with the field named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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


# -- shares of a GPU: MIG instances and fractions -------------------------------------------------------

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # the NVIDIA device plugin's mixed strategy: nvidia.com/mig-1g.10gb
FRACTION_ANNOTATION = "gpu-fraction"  # KAI Scheduler's: part of one GPU, "0.5"
GPU_MEMORY_ANNOTATION = "gpu-memory"  # KAI Scheduler's: GPU memory in MiB, "2000"


@dataclass(frozen=True)
class ShareRequest:
    """Part of a GPU one pod asks for: MIG instances of one profile, or a fraction of one GPU by compute
    share (`gpu_milli`) or by memory (`gpu_memory_mib`)."""

    mig_profile: str = ""
    mig_count: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    mode: str = ""  # how a fraction shares its GPU: "" (time-slicing) or "mps" (a DRA claim's MPS config)


def _mig_counts(container: dict[str, Any], where: str) -> dict[str, int]:
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    out: dict[str, int] = {}
    for resource in sorted({*limits, *requests}):
        if not str(resource).startswith(MIG_RESOURCE_PREFIX):
            continue
        counted = [
            _quantity(v, where, resource) for v in (limits.get(resource), requests.get(resource)) if v is not None
        ]
        if len(counted) == 2 and counted[0] != counted[1]:
            raise WorkloadError(f"{where}: {resource} request {counted[1]} differs from limit {counted[0]}")
        if counted[0]:
            out[str(resource)[len(MIG_RESOURCE_PREFIX) :]] = counted[0]
    return out


def pod_share(
    pod_spec: dict[str, Any], annotations: dict[str, str] | None = None, where: str = "spec"
) -> ShareRequest | None:
    """The MIG instances (`nvidia.com/mig-<profile>` resources, every container) or the fraction (KAI's
    `gpu-fraction` / `gpu-memory` pod annotations) a pod asks for; None when it asks for neither.
    Mixing them, or with whole GPUs, is refused with the field named."""
    annotations = annotations or {}
    mig: dict[str, int] = {}
    for key in ("containers", "initContainers"):
        for i, c in enumerate(pod_spec.get(key) or []):
            for profile, n in _mig_counts(c, f"{where}.{key}[{c.get('name', i)}]").items():
                mig[profile] = mig.get(profile, 0) + n
    fraction, memory = annotations.get(FRACTION_ANNOTATION), annotations.get(GPU_MEMORY_ANNOTATION)
    whole = pod_gpus(pod_spec, where)
    if len(mig) > 1:
        raise WorkloadError(f"{where}: asks for MIG profiles {', '.join(sorted(mig))}; a pod takes one profile")
    if mig and (whole or fraction is not None or memory is not None):
        raise WorkloadError(f"{where}: asks for a MIG instance and a whole or fractional GPU; choose one")
    if mig:
        [(profile, n)] = mig.items()
        return ShareRequest(mig_profile=profile, mig_count=n)
    if fraction is not None and memory is not None:
        raise WorkloadError(
            f"metadata.annotations: {FRACTION_ANNOTATION} and {GPU_MEMORY_ANNOTATION} both given; use one"
        )
    if (fraction is not None or memory is not None) and whole:
        raise WorkloadError(f"{where}: asks for {GPU_RESOURCE} and a GPU fraction; a fraction is part of one GPU")
    if fraction is not None:
        return ShareRequest(gpu_milli=_fraction_milli(fraction))
    if memory is not None:
        return ShareRequest(gpu_memory_mib=_memory_mib(memory))
    return None


def _fraction_milli(text: str) -> int:
    where = f"metadata.annotations[{FRACTION_ANNOTATION}]"
    try:
        value = float(text)
    except ValueError:
        raise WorkloadError(f"{where} must be a number in (0, 1], not {text!r}") from None
    if not 0 < value <= 1:
        raise WorkloadError(f"{where}: {value} is outside (0, 1]; a fraction is part of one GPU")
    return max(1, round(value * 1000))


def _memory_mib(text: str) -> int:
    where = f"metadata.annotations[{GPU_MEMORY_ANNOTATION}]"
    try:
        value = int(str(text).strip())
    except ValueError:
        raise WorkloadError(f"{where} must be whole MiB, not {text!r}") from None
    if value <= 0:
        raise WorkloadError(f"{where}: {value} MiB is not a request; give a positive number")
    return value


# -- host CPU and memory a pod asks for -----------------------------------------------------------------

_UNITS = {"": 1, "k": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}
_UNITS.update({"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4})


def memory_quantity_mib(value: Any, where: str) -> int:
    """A Kubernetes memory quantity (`10Gi`, `512Mi`, `1G`, bytes) in MiB, at least 1."""
    match = re.fullmatch(r"\s*(\d+)\s*(Ki|Mi|Gi|Ti|k|M|G|T|)\s*", str(value))
    if match is None:
        raise WorkloadError(f"{where}: {value!r} is not a memory quantity (e.g. 10Gi)")
    return max(1, int(match.group(1)) * _UNITS[match.group(2)] // 1024**2)


def cpu_quantity_milli(value: Any, where: str) -> int:
    """A Kubernetes CPU quantity (`500m`, `2`, `0.5`) in milli-CPUs."""
    text = str(value).strip()
    try:
        return int(text[:-1]) if text.endswith("m") else round(float(text) * 1000)
    except ValueError:
        raise WorkloadError(f"{where}: {value!r} is not a CPU quantity (e.g. 500m or 2)") from None


def pod_host(pod_spec: dict[str, Any], where: str = "spec") -> tuple[int | None, int | None]:
    """(milli-CPUs, MiB) the pod requests, sized as the kubelet sizes it (see the module docstring);
    None for a resource no container requests."""
    return _pod_request(pod_spec, "cpu", where), _pod_request(pod_spec, "memory", where)


def _pod_request(pod_spec: dict[str, Any], resource: str, where: str) -> int | None:
    parse = cpu_quantity_milli if resource == "cpu" else memory_quantity_mib
    asked = False

    def need(c: dict[str, Any], key: str, i: int) -> int:
        nonlocal asked
        value = ((c.get("resources") or {}).get("requests") or {}).get(resource)
        if value is None:
            return 0
        asked = True
        return parse(value, f"{where}.{key}[{c.get('name', i)}].resources.requests.{resource}")

    running = sum(need(c, "containers", i) for i, c in enumerate(pod_spec.get("containers") or []))
    sidecars = init_peak = 0
    for i, c in enumerate(pod_spec.get("initContainers") or []):
        n = need(c, "initContainers", i)
        if c.get("restartPolicy") == "Always":
            sidecars += n
            n = 0
        init_peak = max(init_peak, sidecars + n)
    return max(running + sidecars, init_peak) if asked else None
