"""Trace simulator speed: a full replay of the bundled ITP trace (49,999 jobs, ten teams) on the
largest cluster the trace suggests (its peak zero-queue demand, 2,859 GPUs, rounded up to whole
8-GPU nodes). Prints one JSON object: jobs, wall_s, jobs_per_s per policy (chamber first). The chamber
policy plays the quota service's fair-share factor, as deployed (`--no-fair-share`: without it)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.tracesim.engine import FleetSpec
from services.tracesim.metrics import summarize
from services.tracesim.quotas import equal_shares
from services.tracesim.run import add_fair_share_argument, simulate
from services.tracesim.trace import load

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "itp" / "jobs.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=2864)
    parser.add_argument("--jobs", type=int, default=None, help="only the first N jobs")
    parser.add_argument("--policies", default="chamber,fifo,static-quota")
    add_fair_share_argument(parser)
    args = parser.parse_args()
    trace = load(TRACE, limit=args.jobs)
    fleet = FleetSpec(gpus=args.gpus)
    quotas = equal_shares(trace.teams, fleet.gpus)
    out: dict[str, object] = {
        "trace": TRACE.name,
        "gpus": fleet.gpus,
        "nodes": fleet.nodes,
        "fair_share_factor": args.fair_share,
    }
    for i, name in enumerate(args.policies.split(",")):
        t0 = time.perf_counter()
        outcome = simulate(trace.jobs, fleet, quotas, name, fair_share=args.fair_share)
        wall = time.perf_counter() - t0
        m = summarize(outcome)
        row = {
            "jobs": len(trace.jobs),
            "wall_s": round(wall, 2),
            "jobs_per_s": round(len(trace.jobs) / wall),
            "utilization": m["utilization"],
            "wait_mean_s": round(m["wait_mean_s"]),
        }
        if i == 0:  # the headline figures are the chamber policy's (the live scheduler core)
            out.update(jobs=row["jobs"], wall_s=row["wall_s"], jobs_per_s=row["jobs_per_s"], policy=name)
        out[name] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
