"""Seeded synthetic telemetry for idle reclaim: the events one job's node would emit per interval.

Used by the tests and by bench/idle_reclaim.py. Pure (a `random.Random` is passed in); no clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from events.base import Event
from events.fabric import CommProgress, FabricSample
from events.jobs import Placement
from events.telemetry import GpuSample, NodeSample

# One sample's activity for one GPU at time t: (sm_activity_pct, memory_used_mib)
Activity = Callable[[float], tuple[float, float]]


def samples(
    *,
    cluster: str,
    node: str,
    gpus: int,
    start: float,
    end: float,
    interval_s: float,
    activity: Activity,
    comm_ops: Callable[[float], int] | None = None,
) -> Iterator[Event]:
    """NodeSample (and FabricSample with one communicator when `comm_ops` is given) every interval."""
    seq = 0
    t = start
    while t <= end:
        sm, mem = activity(t)
        yield NodeSample(
            cluster=cluster,
            node=node,
            seq=seq,
            observed_at=t,
            interval_s=interval_s,
            gpus=[GpuSample(index=i, uuid=f"{node}-{i}", sm_activity_pct=sm, memory_used_mib=mem) for i in range(gpus)],
        )
        if comm_ops is not None:
            yield FabricSample(
                cluster=cluster,
                node=node,
                seq=seq,
                observed_at=t,
                interval_s=interval_s,
                nics=[],
                comms=[CommProgress(comm="c0", ops=comm_ops(t), status="RUNNING")],
            )
        seq += 1
        t += interval_s


def placement(cluster: str, node: str, gpus: int) -> list[Placement]:
    return [Placement(cluster=cluster, node=node, gpu_indices=list(range(gpus)))]


def idle_after(busy_until: float, rng: random.Random, mem_mib: float = 20_000.0) -> Activity:
    """Busy (60-95 % SM, memory moving) until `busy_until`, then idle: SM 0-2 %, memory fixed."""

    def f(t: float) -> tuple[float, float]:
        if t < busy_until:
            return rng.uniform(60.0, 95.0), mem_mib + rng.uniform(-2000.0, 2000.0)
        return rng.uniform(0.0, 2.0), mem_mib

    return f


def bursty(rng: random.Random, max_gap_s: float, mem_mib: float = 40_000.0) -> Activity:
    """Training with data-loader stalls / evals: idle gaps of up to `max_gap_s`, then a busy burst."""
    state = {"until": 0.0, "busy": True}

    def f(t: float) -> tuple[float, float]:
        if t >= state["until"]:
            state["busy"] = not state["busy"]
            span = rng.uniform(30.0, 600.0) if state["busy"] else rng.uniform(10.0, max_gap_s)
            state["until"] = t + span
        if state["busy"]:
            return rng.uniform(40.0, 99.0), mem_mib + rng.uniform(-500.0, 500.0)
        return rng.uniform(0.0, 3.0), mem_mib

    return f
