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
    vendor: str = "nvidia"  # "amd": sampled like an AMD Instinct GPU (RAS blocks, XGMI links in nvlink_links)


MODELS: dict[str, GpuModel] = {
    m.model: m
    for m in (
        GpuModel("H100-80GB", "NVIDIA H100 80GB HBM3", 81_559, 700, 70, 18, 90, 1980, 2619, 5),
        GpuModel("H200-141GB", "NVIDIA H200", 143_771, 700, 75, 18, 90, 1980, 3201, 5),
        GpuModel("A100-80GB", "NVIDIA A100-SXM4-80GB", 81_920, 400, 55, 12, 89, 1410, 1593, 4),
        GpuModel("A100-40GB", "NVIDIA A100-SXM4-40GB", 40_960, 400, 50, 12, 89, 1410, 1215, 4),
        GpuModel("L40S-48GB", "NVIDIA L40S", 46_068, 350, 35, 0, 88, 2520, 9001, 4),
        GpuModel("B200-180GB", "NVIDIA B200", 183_359, 1000, 140, 18, 90, 1965, 3996, 5),
        # AMD Instinct (amd.com product pages): memory as amdgpu's mem_info_vram_total reports it (MiB),
        # board power, XGMI links to peers (7 on an 8-GPU MI300 platform), hotspot throttle, peak
        # engine clock, memory clock (HBM3 5.2 Gb/s -> 1300 MHz). An MI250X is two GCDs: one GPU here.
        GpuModel("MI250X-64GB", "AMD Instinct MI250X/MI250", 65_536, 280, 45, 8, 100, 1700, 1600, 4, "amd"),
        GpuModel("MI300X-192GB", "AMD Instinct MI300X", 196_608, 750, 140, 7, 100, 2100, 1300, 5, "amd"),
        GpuModel("MI325X-256GB", "AMD Instinct MI325X", 262_144, 1000, 150, 7, 100, 2100, 1500, 5, "amd"),
        GpuModel("MI355X-288GB", "AMD Instinct MI355X", 294_912, 1400, 180, 7, 100, 2400, 2000, 5, "amd"),
    )
}


def gpu_model(name: str) -> GpuModel:
    """The model by name (case-insensitive); KeyError names the known ones."""
    for key, model in MODELS.items():
        if key.lower() == name.lower():
            return model
    raise KeyError(f"unknown GPU model {name!r}; known: {', '.join(MODELS)}")
