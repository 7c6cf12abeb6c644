"""Degraded, not failing: which out-of-service hardware still runs its jobs, only slower (pure).

Health takes a GPU (or node) out of service for faults of two sorts. Failing hardware (an XID, ECC,
a NIC down, a lost node, an operator's isolation) stops the job: it is requeued at once. Degraded
hardware (a straggler verdict from perf, a flapping, downshifted or erroring NIC) slows it: moving
it is worth it only where it can land now. Otherwise it keeps running where it is, flagged, and the
cycle moves it as soon as a place frees (cycle.py, phase 1) — a job at 78 % speed must not become a
job at 0 % waiting for 4 whole nodes.

The kinds come from the faults folded from FAULTS (by fault id, `links.fold_kind`); the isolation names its fault ids.
Which stream was folded first does not matter: the test runs at cycle time over both facts, and an
isolation whose faults are not (yet) known counts as failing, the behaviour before this rule.
"""

from __future__ import annotations

from services.scheduler.core.state import Job, SchedulerState, holds


def only_degraded(state: SchedulerState, job: Job) -> bool:
    """Every GPU or node of the job that is out of service was taken out for degrading faults only."""
    known = state.links.degrading
    found = False
    for p in job.placements:
        node = state.nodes.get((p.cluster, p.node))
        if node is None or node.lost or node.status.value != "healthy":
            return False
        if node.isolated:
            if not node.out_faults or any(f not in known for f in node.out_faults):
                return False
            found = True
        for i in p.gpu_indices:
            if i not in node.gpus or not holds(node, i, job.id):  # whole, or a share of it
                return False
            if i in node.bad_gpus:
                faults = node.gpu_out.get(i, ("", ()))[1]
                if not faults or any(f not in known for f in faults):
                    return False
                found = True
    return found


def stay_note(job: Job, causes: list[str], at_least: bool = False) -> str:
    """Why a job on degraded hardware keeps running there."""
    spec = job.spec
    where = "; ".join(causes) or "its nodes"
    return (
        f"running on degraded hardware ({where}): no healthy place for {spec.replicas}x{spec.gpus_per_replica} "
        f"GPUs{' at the last cycle' if at_least else ''}; moves when one frees"
    )


def out_of_service(state: SchedulerState, job: Job) -> tuple[list[str], tuple[str, ...]]:
    """What took the job's nodes or GPUs out of service ("node: reason"), and the fault ids behind it."""
    why: list[str] = []
    faults: list[str] = []
    for p in sorted(job.placements, key=lambda p: (p.cluster, p.node)):
        node = state.nodes.get((p.cluster, p.node))
        if node is None:
            continue
        if node.isolated or node.lost:
            if node.out_reason:
                why.append(f"{node.name}: {node.out_reason}")
            faults.extend(node.out_faults)
            continue
        for i in sorted(set(p.gpu_indices) & set(node.gpu_out)):
            reason, ids = node.gpu_out[i]
            why.append(f"{node.name} GPU {i}: {reason}")
            faults.extend(ids)
    return why, tuple(dict.fromkeys(faults))
