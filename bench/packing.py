"""Packing shared GPUs: FGD's protocol (Weng et al., USENIX ATC '23) on Alibaba's public openb traces,
through the scheduler's own packer (`services/scheduler/core/sharing.py`, the code behind `chamber sim
place`).

Per trace and seed: shuffle the trace's pods, append random copies of them until the requested GPU
capacity reaches 1.3x the inventory's, then place them in order, once each, irrevocably. The measure
is allocated GPU-milli over total GPU-milli when the cumulative requested GPU-milli (placed or not)
first reaches `--load` (default 1.0 = 100 %) of capacity.

The traces carry a research-use note and no licence file, so they are not in this repository:
    git clone --depth 1 https://github.com/alibaba/clusterdata
    python bench/packing.py --traces-dir clusterdata/cluster-trace-gpu-v2023/csv
(or set $OPENB_DIR). Prints one JSON object per (trace, policy, seed), then a summary object per trace
with the mean allocation per policy, FGD's published figure where the paper gives one, and which traces
Chamber's weights were chosen on (`tuned_on`) and which are held out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.scheduler.core.sharing import Mix, NodeSpec, Packer, PodRequest
from services.tracesim.place import PlaceInputError, read_arrivals, read_nodes

# FGD's allocation at 100 % offered load, from the paper's figures as the issue that asked for this
# bench quotes them (openb v2023 variants); best-fit's published default is 92.9 %.
FGD_PUBLISHED = {"default": 95.2, "gpushare100": 86.6, "gpuspec25": 93.9, "multigpu50": 97.1, "cpu250": 93.2}
TUNED_ON = ("default", "gpushare100", "gpuspec25", "cpu250")  # weights chosen on these (seeds 0, 1; others: seed 0)
DEFAULT_TRACES = ("default", "gpushare100", "gpuspec25", "multigpu50", "cpu250")


def offered(pods: list[PodRequest], capacity: int, seed: int, inflate: float = 1.3) -> list[PodRequest]:
    rng = random.Random(seed)
    order = pods[:]
    rng.shuffle(order)
    requested = sum(p.gpu_milli_total for p in order)
    while requested < inflate * capacity:
        pod = rng.choice(pods)
        order.append(pod)
        requested += pod.gpu_milli_total
    return order


def run(nodes: list[NodeSpec], pods: list[PodRequest], policy: str, seed: int, load: float) -> dict[str, object]:
    packer = Packer(nodes, policy=policy, mix=Mix.of(pods))
    capacity = packer.capacity_milli()
    requested = placed = rejected = 0
    times: list[float] = []
    for pod in offered(pods, capacity, seed):
        t0 = time.process_time()  # CPU time: other work on the machine does not count
        spot = packer.place(pod)
        times.append(time.process_time() - t0)
        placed += spot is not None
        rejected += spot is None
        requested += pod.gpu_milli_total
        if requested >= load * capacity:
            break
    times.sort()
    return {
        "allocation_pct": round(100 * packer.allocated_milli() / capacity, 2),
        "pods": placed + rejected,
        "rejected": rejected,
        "place_ms_mean": round(1000 * statistics.mean(times), 3),
        "place_ms_p50": round(1000 * times[len(times) // 2], 3),
        "place_ms_p99": round(1000 * times[int(len(times) * 0.99)], 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces-dir", type=Path, default=os.environ.get("OPENB_DIR"), help="openb csv/ folder")
    parser.add_argument("--traces", default=",".join(DEFAULT_TRACES), help="pod-list variants (comma-separated)")
    parser.add_argument("--policies", default="chamber,bestfit", help="chamber, bestfit, fgd (our re-implementation)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--load", type=float, default=1.0, help="offered load at which to measure (1.0 = 100 %%)")
    args = parser.parse_args()
    if args.traces_dir is None:
        print(
            "bench/packing.py: --traces-dir (or $OPENB_DIR) is needed; see the docstring for the download",
            file=sys.stderr,
        )
        return 2
    try:
        nodes = read_nodes(args.traces_dir / "openb_node_list_gpu_node.csv")
        for trace in args.traces.split(","):
            pods = read_arrivals(args.traces_dir / f"openb_pod_list_{trace}.csv")
            means: dict[str, float] = {}
            for policy in args.policies.split(","):
                runs = []
                for seed in range(args.seeds):
                    row = {"trace": trace, "policy": policy, "seed": seed, **run(nodes, pods, policy, seed, args.load)}
                    print(json.dumps(row), flush=True)
                    runs.append(float(row["allocation_pct"]))  # type: ignore[arg-type]
                means[policy] = round(statistics.mean(runs), 2)
            summary = {
                "trace": trace,
                "load": args.load,
                "seeds": args.seeds,
                "mean_allocation_pct": means,
                "fgd_published_pct": FGD_PUBLISHED.get(trace),
                "chamber_weights": "tuned on" if trace in TUNED_ON else "held out",
            }
            print(json.dumps(summary), flush=True)
    except PlaceInputError as exc:
        print(f"bench/packing.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
