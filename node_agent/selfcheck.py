"""`python -m node_agent.selfcheck`: read this node through real NVML and print its inventory, the
machine's firmware identity (provider, instance type: node_agent.dmi_adapter) and one sample as JSON
(to verify the adapters on a real GPU node). Without an NVIDIA driver it says so on stderr and exits
with status 2."""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

import msgspec

from node_agent.dmi_adapter import read_host
from node_agent.nvml_adapter import NvmlSampler, NvmlUnavailable

EXIT_NO_DRIVER = 2


def main(nvml: Any = None, out: Any = None) -> int:
    out = out or sys.stdout
    try:
        sampler = NvmlSampler.open(nvml, node=socket.gethostname(), watch_xids=False)
    except NvmlUnavailable as exc:
        print(f"node_agent.selfcheck: {exc}", file=sys.stderr)
        return EXIT_NO_DRIVER
    try:
        inventory = sampler.inventory_gpus()
        reading = sampler.read("selfcheck", 0, time.time(), 1.0)
        report = {
            "driver_version": sampler.driver_version,
            "cuda_version": sampler.cuda_version,
            "inventory": inventory,
            "host": read_host(),
            "limits": {i: {"slowdown_temp_c": lim.slowdown_temp_c, "pcie_replays_per_min": lim.pcie_replays_per_window}
                       for i, lim in sampler.limits().items()},
            "sample": reading.sample,
            "lost_gpus": sorted(reading.lost_gpus),
        }  # fmt: skip
        out.write(msgspec.json.format(msgspec.json.encode(report), indent=2).decode() + "\n")
    finally:
        sampler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
