"""Host CPU and memory: a node whose capacity is known holds a replica only where what it asks of the
node's CPU and memory fits in what running work leaves (capacity minus the running replicas' requests).
Unknown capacity or no request means no limit, so such jobs and nodes are placed as before.

`HostLeft` is built once per cycle, the first time a job that asks is placed; every change to it is
journaled on the scratch index (`cap.undo`), so a placement rolled back gives its CPU and memory back.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from events import JobSpec

if TYPE_CHECKING:
    from services.scheduler.core.state import Job, SchedulerState
    from services.scheduler.core.work import Spot, Work

UNLIMITED = 1 << 30


def asks(spec: JobSpec) -> bool:
    """Whether each replica asks for part of its node's CPU or memory."""
    return bool(spec.cpu_milli) or bool(spec.memory_mib)


class HostLeft:
    """Per node id with a known capacity: [milli-CPUs, MiB] left (an entry None: that one is unknown)."""

    def __init__(self, state: SchedulerState, work: Work) -> None:
        self.left: dict[int, list[int | None]] = {
            n.nid: [n.cpu_milli, n.memory_mib]
            for n in state.node_by_id
            if n.cpu_milli is not None or n.memory_mib is not None
        }
        self.asking: JobSpec | None = None  # the share job being placed (shares.place)
        if not self.left:
            return
        for ids in state.running.values():
            for jid in ids:
                job = state.jobs[jid]
                if asks(job.spec) and jid not in work.gone and jid not in work.fresh:
                    for nid, n in _replicas(state, job):
                        self._add(nid, job.spec, -n)
        for jid, spot in work.fresh.items():
            job = state.jobs[jid]
            if asks(job.spec):
                for nid, n in replicas_in(job.spec, spot):
                    self._add(nid, job.spec, -n)

    def fit(self, nid: int, spec: JobSpec) -> int:
        """How many more replicas of `spec` the node's CPU and memory can hold."""
        left = self.left.get(nid)
        if left is None:
            return UNLIMITED
        most = UNLIMITED
        for have, need in zip(left, (spec.cpu_milli, spec.memory_mib), strict=True):
            if have is not None and need:
                most = min(most, max(have, 0) // need)
        return most

    def _add(self, nid: int, spec: JobSpec, replicas: int) -> None:
        left = self.left.get(nid)
        if left is None:
            return
        for i, need in enumerate((spec.cpu_milli, spec.memory_mib)):
            have = left[i]
            if have is not None and need:
                left[i] = have + need * replicas

    def change(self, work: Work, spec: JobSpec, spot: Spot, sign: int) -> None:
        """Take (sign -1) or give (+1) the replicas of `spot`, journaled for rollback."""
        moved = [(nid, n) for nid, n in replicas_in(spec, spot) if nid in self.left]
        for nid, n in moved:
            self._add(nid, spec, sign * n)

        def undo() -> None:
            for nid, n in moved:
                self._add(nid, spec, -sign * n)

        if moved:
            work.cap.undo(undo)


def of(work: Work) -> HostLeft:
    """The cycle's host table (built on first use)."""
    if work.host is None:
        work.host = HostLeft(work.s, work)
    return work.host


def replicas_in(spec: JobSpec, spot: Sequence[tuple[int, Sequence[int]]]) -> Iterator[tuple[int, int]]:
    """(node id, replicas) of a spot: a share takes one GPU per replica, a whole-GPU replica `per` GPUs."""
    per = 1 if spec.share is not None else spec.gpus_per_replica
    for nid, gpus in spot:
        yield nid, max(1, len(gpus) // per)


def _replicas(state: SchedulerState, job: Job) -> Iterator[tuple[int, int]]:
    return replicas_in(job.spec, list(_spot(state, job)))


def hide_full(work: Work, job: Job, classes: list[int]) -> list[tuple[int, list[int]]]:
    """Hide (journaled takes) the free GPUs beyond what each node's CPU and memory let the job use (a
    share: one GPU per replica); the caller gives them back after placing."""
    host = of(work)
    cap, wanted = work.cap, set(classes)
    per = 1 if job.spec.share is not None else job.spec.gpus_per_replica
    hidden = []
    for nid in host.left:
        slot = cap.slots[nid]
        if not slot.usable or not slot.free or slot.cls not in wanted:
            continue
        extra = len(slot.free) - host.fit(nid, job.spec) * per
        if extra > 0:
            hidden.append((nid, cap.take(nid, extra)))
    return hidden


def taken(work: Work, job: Job, spot: Spot) -> None:
    """The placed job's replicas take their CPU and memory on the scratch table."""
    of(work).change(work, job.spec, spot, -1)


def given(work: Work, job: Job) -> None:
    """A running job's replicas give their CPU and memory back (preemption, a move)."""
    if asks(job.spec):
        of(work).change(work, job.spec, list(_spot(work.s, job)), +1)


def _spot(state: SchedulerState, job: Job) -> Iterator[tuple[int, list[int]]]:
    for p in job.placements:
        node = state.nodes.get((p.cluster, p.node))
        if node is not None:
            yield node.nid, list(p.gpu_indices)


def room(work: Work, nid: int) -> bool:
    """Whether the share job being placed (`HostLeft.asking`) has CPU and memory for one more replica."""
    host = work.host
    return host is None or host.asking is None or host.fit(nid, host.asking) >= 1


def cpu_left(work: Work, nid: int, cpu_per_milli: float) -> tuple[int, int]:
    """The node's CPU left before and after the share being placed, for the sharing scorer's states;
    unlimited where unknown, and when no queued share asks for CPU (the mix's `cpu_per_milli` is 0)."""
    if not cpu_per_milli:
        return UNLIMITED, UNLIMITED
    host = of(work)
    left = host.left.get(nid)
    cpu = UNLIMITED if left is None or left[0] is None else left[0]
    need = (host.asking.cpu_milli or 0) if host.asking is not None else 0
    return cpu, cpu - need


def short_text(work: Work, job: Job, classes: list[int]) -> str:
    """For a waiting job that asks for CPU or memory: how many nodes have the GPUs for one of its
    replicas free but not the CPU or memory, and the most either has left there ("" when none)."""
    per = 1 if job.spec.share is not None else job.spec.gpus_per_replica
    # no node has a replica's GPUs free: GPUs are what it waits for (and the walk over nodes is skipped)
    if not asks(job.spec) or work.cap.max_free(classes) < per or not of(work).left:
        return ""
    host, cap, wanted = of(work), work.cap, set(classes)
    short, cpu_most, mem_most = 0, 0, 0
    for nid, left in host.left.items():
        slot = cap.slots[nid]
        if not slot.usable or slot.cls not in wanted or len(slot.free) < per or host.fit(nid, job.spec) >= 1:
            continue
        short += 1
        cpu_most = max(cpu_most, left[0] or 0)
        mem_most = max(mem_most, left[1] or 0)
    if not short:
        return ""
    asked = ", ".join(
        f"{label} {value}"
        for label, value in (
            ("CPU", f"{job.spec.cpu_milli / 1000:g} cores" if job.spec.cpu_milli else ""),
            ("memory", f"{job.spec.memory_mib / 1024:g} GiB" if job.spec.memory_mib else ""),
        )
        if value
    )
    most = " and ".join(
        text
        for text, asked_for in (
            (f"{cpu_most / 1000:g} cores", job.spec.cpu_milli),
            (f"{mem_most / 1024:g} GiB", job.spec.memory_mib),
        )
        if asked_for
    )
    nodes = f"{short} nodes with the GPUs free lack" if short != 1 else "1 node with the GPUs free lacks"
    return f"; {nodes} the host resources it asks per replica ({asked}): at most {most} left there"
