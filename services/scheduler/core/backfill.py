"""Cycle phases 3 and 5 (EASY backfill): a pool's first job blocked for capacity reserves the GPUs
it will get when running work ends (by runtime estimates); later jobs start only if they do not
delay it (they end before the reservation, or use only GPUs it leaves over).

Shared GPUs (shares.py) count by what their holders' ends free: a GPU is whole again when its last
holder ends (so shares ending on different GPUs free no whole GPU), and a fractional or MIG job fits
once enough room frees on GPUs shared in its mode, or on whole GPUs, for every replica."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from functools import lru_cache
from itertools import islice, takewhile

from events import GpuShare, PriorityClass
from services.scheduler.core.decisions import Drain, Reservation
from services.scheduler.core.mig import mig_model, occupancy, starts_in_mask
from services.scheduler.core.mig_live import layout_starts, mig_held
from services.scheduler.core.policy import QueueKey
from services.scheduler.core.shares import MILLI, SharedGpu, mode_of
from services.scheduler.core.state import Job, Node, estimate_s
from services.scheduler.core.work import Work
from services.timefmt import when


def check(res: Reservation, job: Job, now: float) -> tuple[str | None, bool]:
    """May `job` start now next to the pool's reservation, which is ahead of it in the queue? (why
    not, or None; and whether it may only use the reserved job's leftover GPUs)."""
    est = estimate_s(job)
    if est is not None and now + est <= res.shadow_at:
        return None, False  # ends before the reserved job starts
    if extra_taken(job) > res.extra_gpus:
        return _would_delay(res.job_id, res.shadow_at, now), False
    return None, True


def extra_taken(job: Job) -> float:
    """What a job started on the reserved job's leftover GPUs takes of them: its GPUs; a share job may
    make a whole GPU shared for each replica, so it counts a whole GPU per replica."""
    return job.gpus if job.spec.share is None else job.spec.replicas


@lru_cache(maxsize=64)
def _would_delay(job_id: str, shadow_at: float, now: float) -> str:
    """The same text for every job a reservation holds back in a cycle: formatted once."""
    return f"backfill: would delay {job_id}, which has the GPUs reserved from about {when(shadow_at, now)}"


def reservation(work: Work, job: Job, key: QueueKey) -> Reservation | None:
    """EASY backfill: when will enough GPUs be free for `job`, judging by runtime estimates?"""
    found = _shadow(work, job, _ends(work, job.pool))
    if found is None:
        return None  # running work has no estimates: nothing to reserve against
    shadow_at, extra = found
    return Reservation(job.id, key, job.gpus, shadow_at, extra)


def free_by(work: Work, job: Job, horizon: float) -> float | None:
    """When enough GPUs are free for `job` by runtime estimates, if that is at `horizon` or sooner;
    else None."""
    found = _shadow(work, job, _ends(work, job.pool), horizon)
    return None if found is None else found[0]


def _shadow(
    work: Work, job: Job, ends: Iterable[tuple[float, float]], horizon: float = math.inf
) -> tuple[float, float] | None:
    """When `job` fits by runtime estimates (at `horizon` or sooner), and the whole GPUs left over."""
    if job.spec.share is not None:
        return _share_fits(work, job, ends, horizon)
    if work.s.shared_nodes:  # shared GPUs free whole GPUs only when their last holder ends
        ends = heapq.merge(ends, _whole_again(work, work.classes(job)))
    return _enough(work, job, ends if horizon == math.inf else takewhile(lambda end: end[0] <= horizon, ends))


def _enough(work: Work, job: Job, ends: Iterable[tuple[float, float]]) -> tuple[float, float] | None:
    """The first of the (sorted) ends by which enough GPUs are free for `job`, and the GPUs left over."""
    free: float = work.cap.free_in(work.classes(job))
    for end, gpus in ends:
        free += gpus
        if free >= job.gpus:
            return end, free - job.gpus
    return None


def _ends(work: Work, pool: str) -> Iterator[tuple[float, float]]:
    """(estimated end, GPUs) of the pool's running work with runtime estimates, sorted (an end
    already past counts as now), read only as far as the caller goes: the state keeps the ends of
    what ran before this cycle sorted, so only the overdue ones (all "now") and this cycle's
    admissions are sorted here."""
    s, now, gone = work.s, work.now, work.gone
    if s.shared_nodes:  # only whole-GPU work: what shares free is judged per GPU (`_whole_again`)
        jobs = s.jobs
        gone = gone | {jid for _, _, jid in s.running_ends(pool) if jobs[jid].spec.share is not None}
    ends = s.running_ends(pool)
    due = ends.bisect_right((now, math.inf, ""))  # those with an end at or before now
    overdue = sorted((now, gpus) for _, gpus, jid in islice(ends, due) if jid not in gone)
    later = ((end, gpus) for end, gpus, jid in ends.iter_from(due) if jid not in gone)
    fresh = []
    for jid in work.fresh:
        r = s.jobs[jid]
        est = estimate_s(r)
        if est is not None and r.pool == pool and r.spec.share is None:
            fresh.append((now + est, r.gpus))
    return heapq.merge(overdue, later, sorted(fresh))


def _end_of(work: Work, jid: str) -> float:
    """A running job's estimated end (an end already past counts as now; no estimate: never)."""
    r = work.s.jobs[jid]
    est = estimate_s(r)
    if est is None:
        return math.inf
    if jid in work.fresh:
        return work.now + est
    since = r.running_since
    return math.inf if since is None else max(work.now, since + est)


def _shared_gpus(work: Work, classes: list[int]) -> Iterator[tuple[Node, int, SharedGpu]]:
    """The shared GPUs (node, index, share) of usable nodes in `classes` that may take new work."""
    wanted, slots, nodes = set(classes), work.cap.slots, work.s.node_by_id
    for nid in sorted(work.s.shared_nodes):
        slot = slots[nid]
        if not slot.usable or slot.cls not in wanted:
            continue
        node = nodes[nid]
        for gpu in sorted(node.shared):
            if node.offers(gpu):
                yield node, gpu, node.shared[gpu]


def _whole_again(work: Work, classes: list[int]) -> list[tuple[float, float]]:
    """(estimated end, 1) for each shared GPU of `classes` that is whole again when its last holder
    ends (a GPU in MIG mode stays out of the whole-GPU index), sorted."""
    out: list[tuple[float, float]] = []
    for node, gpu, sg in _shared_gpus(work, classes):
        if not mig_held(node, gpu):
            last = max((_end_of(work, jid) for jid in sg.holders), default=work.now)
            if last < math.inf:
                out.append((last, 1))
    out.sort()
    return out


def _share_fits(
    work: Work, job: Job, ends: Iterable[tuple[float, float]], horizon: float
) -> tuple[float, float] | None:
    """When every replica of a share job fits by runtime estimates: on GPUs shared in its mode as
    their holders end, or on whole GPUs (free now, freed by whole-GPU work, or whole again when a
    GPU's last holder ends). Also the whole GPUs left over then."""
    share = job.spec.share
    assert share is not None
    classes, mode, need = work.classes(job), mode_of(share), job.spec.replicas
    per_whole = max((_fits(share, m, SharedGpu(mode), None, None) for m in _models(work, classes)), default=0)
    # per shared GPU: what is left of it as holders end; events (end, kind, key, holder)
    gpus: dict[tuple[int, int], SharedGpu] = {}
    events: list[tuple[float, int, tuple[int, int], str]] = []
    for node, gpu, sg in _shared_gpus(work, classes):
        if sg.mode != mode and mig_held(node, gpu):
            continue  # a MIG GPU never takes a fraction, nor becomes whole by ends
        left = SharedGpu(sg.mode, sg.milli, sg.memory_mib, sg.mig_used, dict(sg.holders))
        gpus[(node.nid, gpu)] = left
        for jid in sg.holders:
            if (end := _end_of(work, jid)) <= horizon and end < math.inf:  # no estimate: never ends
                events.append((end, 1, (node.nid, gpu), jid))
    for end, n in takewhile(lambda e: e[0] <= horizon, ends):
        events.append((end, 0, (-1, int(n)), ""))
    events.sort()
    whole = work.cap.free_in(classes)
    nodes = work.s.node_by_id
    for i, (end, kind, key, jid) in enumerate(events):
        if kind == 0:
            whole += key[1]
        else:
            sg = gpus[key]
            sg.drop(jid)
            node = nodes[key[0]]
            if not sg.holders and not mig_held(node, key[1]):
                del gpus[key]
                whole += 1
        if i + 1 < len(events) and events[i + 1][0] == end:
            continue  # judge once every end at this time is in
        on_shared = sum(
            _fits(share, nodes[nid].gpus[g], sg, nodes[nid], g) for (nid, g), sg in gpus.items() if sg.mode == mode
        )
        if on_shared + whole * per_whole >= need:
            used = 0 if on_shared >= need else -(-(need - on_shared) // max(per_whole, 1))
            return end, whole - used
    return None


def _models(work: Work, classes: list[int]) -> set[str]:
    keys = work.cap.class_keys
    return {keys[c][2] for c in classes}


def _fits(share: GpuShare, model: str, sg: SharedGpu, node: Node | None, gpu: int | None) -> int:
    """How many replicas of `share` fit on a GPU of `model` with `sg` taken (on a managed MIG GPU,
    only in its layout's free instances)."""
    if share.mig_profile:
        table = mig_model(model)
        if table is None or share.mig_profile not in table.profiles:
            return 0
        used, n = sg.mig_used, 0
        while starts := starts_in_mask(table, used, share.mig_profile):
            if node is not None and gpu is not None:
                narrowed = layout_starts(node, gpu, share.mig_profile, starts)
                starts = starts if narrowed is None else narrowed
                if not starts:
                    break
            used |= occupancy(table, share.mig_profile, starts[0])
            n += 1
        return n
    if sg.mode != mode_of(share) or share.gpu_milli <= 0:
        return 0
    n = (MILLI - sg.milli) // share.gpu_milli
    memory = None if node is None or gpu is None else node.gpu_memory.get(gpu)
    if share.memory_mib and memory is not None:
        n = min(n, (memory - sg.memory_mib) // share.memory_mib)
    return max(n, 0)


def drain(work: Work, job: Job, keep: int | None = None) -> Drain | None:
    """The node to hold for `job` (one replica, larger than any node's free GPUs): `keep` while it
    still could take the job, else the node of its classes that frees enough for it soonest by
    runtime estimates (work without an estimate never ends). None if no node ever could."""
    classes, slots = set(work.classes(job)), work.cap.slots
    best: tuple[float, int] | None = None
    for nid in [keep] if keep is not None else range(len(slots)):
        slot = slots[nid]
        if slot.cls in classes and slot.usable and slot.total >= job.gpus:
            at = (_node_ready(work, nid, job.spec.total_gpus), nid)
            best = at if best is None or at < best else best
    if best is None or best[0] == math.inf:  # a node whose work never ends is not worth holding
        return None if keep is None else drain(work, job)
    return Drain(job.id, best[1], best[0])


def _node_ready(work: Work, nid: int, gpus: int) -> float:
    """When `gpus` GPUs of the node are free, by the estimated ends of the work on it."""
    s, now = work.s, work.now
    node = s.node_by_id[nid]
    on_node: dict[str, int] = {}
    for jid in node.owners.values():
        if jid not in work.gone:
            on_node[jid] = on_node.get(jid, 0) + 1
    ends = []
    for jid, n in on_node.items():
        r = s.jobs[jid]
        est = estimate_s(r)
        since = r.running_since
        ends.append((math.inf if est is None or since is None else max(now, since + est), n))
    for jid, spot in work.fresh.items():
        est = estimate_s(s.jobs[jid])
        for at, taken in spot:
            if at == nid:
                ends.append((math.inf if est is None else now + est, len(taken)))
    for gpu, sg in node.shared.items():  # a shared GPU is whole again when its last holder ends
        if node.offers(gpu) and not mig_held(node, gpu):
            ends.append((max((_end_of(work, h) for h in sg.holders), default=now), 1))
    free = len(work.cap.slots[nid].free)
    for end, n in sorted(ends):
        if free >= gpus:
            break
        free += n
        if free >= gpus:
            return end
    return now if free >= gpus else math.inf


def held_from(work: Work, job: Job) -> int | None:
    """The node `job` may not take GPUs on now: its pool's drain node, when the job is of the drain
    job's class or lower, or would run beyond its team's guarantee; unless it is the drain job,
    critical work, or ends (by estimates) before the node is ready. Higher classes within their
    guarantee still go first: the hold keeps the drain from lower-class and borrowed work."""
    d = work.drains.get(job.pool)
    if d is None or d.job_id == job.id or job.spec.priority == PriorityClass.CRITICAL:
        return None
    if job.spec.priority.rank < work.s.jobs[d.job_id].spec.priority.rank and not _beyond_guarantee(work, job):
        return None
    est = estimate_s(job)
    if est is not None and work.now + est <= d.ready_at:
        return None
    return d.node


def _beyond_guarantee(work: Work, job: Job) -> bool:
    q = work.s.quotas.get((job.pool, job.spec.team))
    return q is not None and work.usage.get((job.pool, job.spec.team), 0) + job.gpus > q.guaranteed
