"""The host's CPU and memory capacity, announced in `NodeInventory` so placements respect them."""

from __future__ import annotations

import os
from pathlib import Path

SIM_CPU_MILLI_PER_GPU = 28_000  # a simulated node: 28 CPUs and 256 GiB per GPU (a DGX-class host)
SIM_MEMORY_MIB_PER_GPU = 256 * 1024


def read_capacity(proc: Path = Path("/proc")) -> tuple[int | None, int | None]:
    """(milli-CPUs, MiB of memory) of this machine; None where it cannot be read."""
    cpus = os.cpu_count()
    return (cpus * 1000 if cpus else None), meminfo_mib(proc / "meminfo")


def meminfo_mib(path: Path) -> int | None:
    """MemTotal of a /proc/meminfo file in MiB (the kernel writes kB)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) // 1024
    return None


def simulated_capacity(gpus: int) -> tuple[int, int]:
    """A plausible capacity for a simulated node of `gpus` GPUs."""
    n = max(gpus, 1)
    return n * SIM_CPU_MILLI_PER_GPU, n * SIM_MEMORY_MIB_PER_GPU
