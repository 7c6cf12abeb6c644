"""The priority-class evaluation, rebuilt: a seeded 6,200-job, 4-team slice of the ITP trace with the
`--classes` mix, replayed with `--compare fifo,chamber` at 40 and 32 GPUs with DEFAULT quotas (every team
an equal guaranteed share of the whole fleet), and the targets checked per run:
every class's p99 wait <= fifo's (to the first start, and queued in all: a preempted job's wait until
it runs again too), high's mean wait <= low's, utilization >= fifo's - 1 point.

    .venv/bin/python bench/class_analogue.py [--seeds 0,1,2] [--gpus 40,32] [--jobs 6200] [--preemption-worth R]

Prints one JSON object: per seed and fleet size, per class wait mean / p99 (hours) for fifo and
chamber, utilizations, and which targets hold; `mean_inversions` lists every pair of classes whose
means are out of order (bench/fairness.py's stricter target, shown here, not counted).
`--write OUT.csv` also writes the seed's trace (the classes included) for `chamber sim --trace OUT.csv`.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.scheduler.policy_options import add_preemption_worth_argument, chamber_tuning  # noqa: E402
from services.tracesim.analogue import analogue, met, targets  # noqa: E402
from services.tracesim.classes import DEFAULT_MIX, assign, parse_mix  # noqa: E402
from services.tracesim.engine import FleetSpec  # noqa: E402
from services.tracesim.quotas import equal_shares  # noqa: E402
from services.tracesim.run import add_fair_share_argument, compare  # noqa: E402
from services.tracesim.trace import TraceJob, load  # noqa: E402

ITP = ROOT / "data" / "traces" / "itp" / "jobs.csv"


def run(
    jobs: list[TraceJob], gpus: int, tuning: dict[str, Any] | None = None, *, fair_share: bool = True
) -> dict[str, Any]:
    teams = sorted({j.team for j in jobs})
    fleet = FleetSpec(gpus=gpus, gpus_per_node=8)
    result, _ = compare(jobs, fleet, equal_shares(teams, gpus), ["fifo", "chamber"], tuning, fair_share=fair_share)
    fifo, chamber = result["policies"]["fifo"], result["policies"]["chamber"]
    h = 3600.0
    per_class = {
        c: {
            "jobs": row["jobs"],
            "fifo_mean_p99_h": [
                round(fifo["by_priority"][c]["wait_mean_s"] / h, 2),
                round(fifo["by_priority"][c]["wait_p99_s"] / h, 1),
            ],
            "chamber_mean_p99_h": [round(row["wait_mean_s"] / h, 2), round(row["wait_p99_s"] / h, 1)],
            # every stretch in the queue, the waits after preemptions too (fifo's: its first waits)
            "chamber_queued_mean_p99_h": [round(row["queued_mean_s"] / h, 2), round(row["queued_p99_s"] / h, 1)],
        }
        for c, row in chamber["by_priority"].items()
    }
    t = targets(fifo, chamber)
    return {
        "utilization": {"fifo": fifo["utilization"], "chamber": chamber["utilization"]},
        "wait_mean_h": {"fifo": round(fifo["wait_mean_s"] / h, 2), "chamber": round(chamber["wait_mean_s"] / h, 2)},
        "per_class": per_class,
        "preemptions": chamber["preemptions"],
        "lost_gpu_hours": chamber["lost_gpu_hours"],
        "unfinished": {"fifo": fifo["jobs_unfinished"], "chamber": chamber["jobs_unfinished"]},
        "targets": t,
        "all_targets_met": met(t),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (sample and class draw)")
    ap.add_argument("--gpus", default="40,32", help="comma-separated fleet sizes")
    ap.add_argument("--jobs", type=int, default=6200)
    ap.add_argument("--write", type=Path, help="write the (first seed's) trace as CSV")
    add_preemption_worth_argument(ap, default=None)
    add_fair_share_argument(ap)
    args = ap.parse_args()
    tuning = chamber_tuning(args)
    itp = load(ITP).jobs
    out: dict[str, Any] = {
        "jobs": args.jobs,
        "classes": DEFAULT_MIX,
        "quotas": "equal shares (default)",
        "fair_share_factor": args.fair_share,
        "runs": {},
    }
    if tuning:
        out["chamber_tuning"] = tuning
    for seed in (int(s) for s in args.seeds.split(",")):
        jobs = assign(analogue(itp, jobs=args.jobs, seed=seed), parse_mix(DEFAULT_MIX, seed=seed))
        if args.write is not None and seed == int(args.seeds.split(",")[0]):
            with args.write.open("w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["job_id", "submit_time_s", "duration_s", "num_gpus", "team", "priority", "preemptible"])
                for j in jobs:
                    w.writerow([j.id, j.submit_s, j.duration_s, j.gpus, j.team, j.priority.value, j.preemptible])
        for gpus in (int(g) for g in args.gpus.split(",")):
            out["runs"][f"seed{seed}/{gpus}gpus"] = run(jobs, gpus, tuning, fair_share=args.fair_share)
    out["all_targets_met"] = all(r["all_targets_met"] for r in out["runs"].values())
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
