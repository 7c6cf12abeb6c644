"""GPU models the simulator knows. Figures are typical datasheet / `nvidia-smi -q` values, rounded;
they only need to be plausible (the simulator feeds schedulers and dashboards, not capacity planning)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    model: str  # normalized name used in inventories and job constraints
    product_name: str  # what NVML's nvmlDeviceGetName returns
    memory_mib: float
    tdp_w: float
    idle_w: float
    nvlink_links: int
    slowdown_temp_c: float
    max_sm_clock_mhz: float
    mem_clock_mhz: float
    pcie_gen: int


MODELS: dict[str, GpuModel] = {
    m.model: m
    for m in (
        GpuModel("H100-80GB", "NVIDIA H100 80GB HBM3", 81_559, 700, 70, 18, 90, 1980, 2619, 5),
        GpuModel("H200-141GB", "NVIDIA H200", 143_771, 700, 75, 18, 90, 1980, 3201, 5),
        GpuModel("A100-80GB", "NVIDIA A100-SXM4-80GB", 81_920, 400, 55, 12, 89, 1410, 1593, 4),
        GpuModel("A100-40GB", "NVIDIA A100-SXM4-40GB", 40_960, 400, 50, 12, 89, 1410, 1215, 4),
        GpuModel("L40S-48GB", "NVIDIA L40S", 46_068, 350, 35, 0, 88, 2520, 9001, 4),
        GpuModel("B200-180GB", "NVIDIA B200", 183_359, 1000, 140, 18, 90, 1965, 3996, 5),
    )
}


def gpu_model(name: str) -> GpuModel:
    """The model by name (case-insensitive); KeyError names the known ones."""
    for key, model in MODELS.items():
        if key.lower() == name.lower():
            return model
    raise KeyError(f"unknown GPU model {name!r}; known: {', '.join(MODELS)}")
