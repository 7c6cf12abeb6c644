"""What `chamber up` will keep on disk: TELEMETRY (bounded by age and bytes) and the warehouse per day.

The sample size is measured here, from the simulated agent's own samples for this fleet's shape; the
warehouse's bytes per row come from `python bench/sizing.py` (chDB, after merges) and are estimates.
"""

from __future__ import annotations

import statistics

from events.streams import GATES, STREAMS, TELEMETRY, StreamSpec, telemetry_retention
from node_agent.runner import NodeFacts, NodeRunner
from node_agent.sim.fleet import SimFleet
from node_agent.sim.models import gpu_model
from node_agent.spool import Kind

# Bytes per row on disk, measured by `python bench/sizing.py` (8-GPU H100 samples, 16 nodes, 30 min:
# 11.6 and 24.9).
RAW_ROW_BYTES = 12.0
ROLLUP_ROW_BYTES = 25.0
_OVERHEAD_BYTES = 300  # subject, CloudEvents headers and the store's own record per message


def sample_bytes(gpus_per_node: int, intervals: int = 120) -> float:
    """Mean size of a node sample as the agent publishes it (busy GPUs; full samples included)."""
    fleet = SimFleet(seed=1, nodes=1, gpus_per_node=gpus_per_node, model=gpu_model("H100-80GB"), prefix="size")
    [(name, node)] = fleet.nodes.items()
    fleet.assign({name: {g: f"job-{g}" for g in range(gpus_per_node)}})
    runner = NodeRunner("size", name, node, NodeFacts(simulated=True))
    sizes = [
        len(r.body) for t in range(intervals) for r in runner.tick(1_800_000_000.0 + t, 1.0) if r.kind == Kind.SAMPLE
    ]
    return statistics.mean(sizes) + _OVERHEAD_BYTES


def describe(nodes: int, gpus_per_node: int, interval_s: float = 1.0) -> list[str]:
    """Lines for the console: the stream's budget and what this fleet will use of it; the warehouse."""
    keep_s, cap = telemetry_retention()
    per_sample = sample_bytes(gpus_per_node)
    per_s = nodes / interval_s * per_sample
    nats = min(cap, per_s * keep_s)
    raw_day = nodes * gpus_per_node * 86400 / interval_s * RAW_ROW_BYTES
    rollup_day = nodes * gpus_per_node * 1440 * ROLLUP_ROW_BYTES
    return [
        f"TELEMETRY keeps {keep_s / 60:g} min, at most {_size(cap)}: about {_size(nats)} for {nodes} nodes x "
        f"{gpus_per_node} GPUs every {interval_s:g} s ({_size(per_sample)} a sample, {_size(per_s)}/s)",
        f"warehouse grows about {_size(raw_day)} a day of raw samples and {_size(rollup_day)} of minute rollups "
        "(kept 30 and 400 days: recorder --raw-ttl-days, --rollup-ttl-days)",
        "other streams at most: " + ", ".join(_cap(s) for s in (*STREAMS, *GATES) if s is not TELEMETRY),
    ]


def _cap(spec: StreamSpec) -> str:
    """A stream's byte cap and what happens when it is reached."""
    assert spec.max_bytes is not None, f"{spec.name} has no byte cap"
    if spec.discard_new_per_subject:  # a gate: what agents publish, bounded per node and kind
        return (
            f"{spec.name} {_size(spec.max_bytes)} ({spec.max_msgs_per_subject:,} per subject in {spec.max_age_s:g} s)"
        )
    when_full = "then refuses new events" if spec.discard_new else "oldest dropped first"
    per = f", {spec.max_msgs_per_subject:,} per subject" if spec.max_msgs_per_subject else ""
    return f"{spec.name} {_size(spec.max_bytes)} ({when_full}{per})"


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"
