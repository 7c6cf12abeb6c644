"""AMD Instinct models: PCI device ids, names, and the MI300-class partition layouts.

Device ids: the PCI ID repository (pci-ids.ucw.cz, vendor 1002) and amdgpu's pciidlist
(drivers/gpu/drm/amd/amdgpu/amdgpu_drv.c). Memory and power: AMD's product pages / data sheets
(amd.com/en/products/accelerators/instinct). An MI250X or MI250 board is two GCDs, and software (sysfs,
amdsmi, the Kubernetes device plugin) sees each GCD as one GPU of 64 GB: the catalogue names the GCD.

Partitions (AMD Instinct MI300X / MI325X / MI355X "GPU partitioning" docs, instinct.docs.amd.com, and
amdgpu's amdgpu_xcp.c): the compute partition splits the 8 XCDs of one GPU into 1 (SPX), 2 (DPX),
4 (QPX) or 8 (CPX) logical GPUs; the memory partition splits HBM into 1 (NPS1) or 4 (NPS4) NUMA
domains. NPS4 needs at least as many compute partitions as memory partitions (so QPX or CPX); the
valid pairs are in `PARTITIONS`. Each compute partition is one KFD node and one `amd.com/gpu` of the
AMD device plugin; Chamber treats each as one GPU of the node with an equal share of the memory,
which is how the device plugin and the scheduler see it (a fixed per-node layout, like a MIG layout
that is set by the operator and not changed by the scheduler).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# device id -> product name (what amdsmi's market_name says; sysfs has only the id on most kernels)
DEVICE_IDS: dict[int, str] = {
    0x7408: "AMD Instinct MI250X",
    0x740C: "AMD Instinct MI250X/MI250",
    0x740F: "AMD Instinct MI210",
    0x74A0: "AMD Instinct MI300A",
    0x74A1: "AMD Instinct MI300X",
    0x74A5: "AMD Instinct MI325X",
    0x75A0: "AMD Instinct MI350X",
    0x75A3: "AMD Instinct MI355X",
}
_MARKETED_GB = (64, 128, 192, 256, 288)

COMPUTE_MODES = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4, "CPX": 8}
MEMORY_MODES = {"NPS1": 1, "NPS2": 2, "NPS4": 4, "NPS8": 8}
# (compute, memory) pairs AMD documents for MI300X/MI325X: NPS1 with any compute mode; NPS4 with QPX/CPX.
PARTITIONS: frozenset[tuple[str, str]] = frozenset(
    {("SPX", "NPS1"), ("DPX", "NPS1"), ("QPX", "NPS1"), ("CPX", "NPS1"), ("QPX", "NPS4"), ("CPX", "NPS4")}
)
PARTITIONABLE = ("MI300X", "MI325X", "MI350X", "MI355X")


def normalized_model(name: str, memory_mib: float | None) -> str:
    """'AMD Instinct MI300X' + 192 GiB -> 'MI300X-192GB'; 'AMD Instinct MI250X/MI250' -> 'MI250X-64GB'."""
    m = re.search(r"(MI\d{3}[A-Z]?)", name.upper())
    base = m.group(1) if m else (name.split()[-1].upper() if name.strip() else "AMD-GPU")
    if not memory_mib:
        return base
    gib = min(_MARKETED_GB, key=lambda gb: abs(gb - memory_mib / 1024))
    return f"{base}-{gib}GB"


@dataclass(frozen=True)
class PartitionLayout:
    """One GPU's partitioning: how many logical GPUs it shows and each one's share of the memory."""

    compute: str
    memory: str
    gpus_per_device: int

    @property
    def label(self) -> str:
        return f"{self.compute}/{self.memory}"


def partition_layout(compute: str | None, memory: str | None) -> PartitionLayout:
    """The layout for the modes a GPU reports; SPX/NPS1 when it reports none (not partitionable)."""
    c = (compute or "SPX").upper()
    mem = (memory or "NPS1").upper()
    if c not in COMPUTE_MODES or mem not in MEMORY_MODES:
        raise ValueError(f"unknown partition mode {c}/{mem}; known: {sorted(COMPUTE_MODES)} x {sorted(MEMORY_MODES)}")
    return PartitionLayout(c, mem, COMPUTE_MODES[c])


def node_layouts(model: str, gpus: int) -> list[tuple[str, int, float]]:
    """Every valid layout of a node of `gpus` such GPUs: (label, logical GPUs, GiB each). Pure data
    for `chamber` and the docs: which fixed layouts an operator can choose for an MI300-class node."""
    from node_agent.sim.models import gpu_model

    spec = gpu_model(model)
    if not any(model.upper().startswith(p) for p in PARTITIONABLE):
        return [("SPX/NPS1", gpus, spec.memory_mib / 1024)]
    out = []
    for compute, memory in sorted(PARTITIONS, key=lambda p: (MEMORY_MODES[p[1]], COMPUTE_MODES[p[0]])):
        n = COMPUTE_MODES[compute]
        out.append((f"{compute}/{memory}", gpus * n, spec.memory_mib / 1024 / n))
    return out
