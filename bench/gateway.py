"""Gateway read model on this machine: how fast samples fold, and what one dashboard push costs.

Pure core only (no NATS): folds 8-GPU node samples into a fleet with jobs on it, then builds the
summary the dashboard receives and encodes it, for fleets of several sizes.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec

from services.gateway import metrics, views
from services.gateway.core import GatewayState, evolve, record_point
from tests.gateway_builders import a_demo_fleet


def measure(nodes: int, rounds: int) -> dict[str, float]:
    events, waves = a_demo_fleet(nodes=nodes, seed=1)
    state = GatewayState()
    for event in events:
        evolve(state, event)
    samples = [e for wave in waves for e in wave]
    t0 = time.perf_counter()
    for _ in range(rounds):
        for sample in samples:
            evolve(state, sample)
    fold_s = time.perf_counter() - t0
    record_point(state, 0.0)

    t0 = time.perf_counter()
    body = msgspec.json.encode(views.summary(state, 0.0))
    summary_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    metrics.fleet_values(state)
    metrics_s = time.perf_counter() - t0
    return {
        "nodes": nodes,
        "gpus": sum(len(n.gpus) for n in state.nodes.values()),
        "jobs": len(state.jobs),
        "fold_node_samples_per_s": round(len(samples) * rounds / fold_s),
        "summary_ms": round(summary_s * 1000, 2),
        "summary_kib": round(len(body) / 1024, 1),
        "fleet_metrics_ms": round(metrics_s * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="16,128,1000", help="fleet sizes in 8-GPU nodes")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results = [measure(int(n), args.rounds) for n in args.sizes.split(",")]
    print(json.dumps({"bench": "gateway", "fleets": results}))


if __name__ == "__main__":
    main()
