"""The per-node agent: NVML or simulated sampling, on-node fault detection, reliable publishing."""
