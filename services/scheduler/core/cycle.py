"""One scheduling cycle: `schedule(state, now, since) -> Cycle` (pure: the state is left unchanged).

Phases (after Kueue's scheduler loop):
  1. requeue    jobs holding a GPU or node that went out of service give it back and rejoin the queue
  2. heads      the queue in order (priority class, fair share, submit time, job id); a full cycle
                looks at every queued job, an incremental one (nothing freed, no rule changed since
                the last cycle's mark) only at the jobs that joined the queue since
  3. nominate   per job: backfill check against its pool's reservation, quota check, placement
  4. preempt    a job that does not fit may preempt (same team by priority, reclaim of borrowed
                capacity, critical across classes) when `select_victims` finds a set that makes it fit
                and that loses at most `policy.preemption_worth` x the GPU-time its wait would cost
  5. admit      placements and victims are applied to the cycle's scratch view, so later jobs see
                them; a job still waiting records why, and the first job of a pool blocked for
                capacity gets an EASY-backfill reservation
The cycle works on the live capacity index with a journal and rolls it back at the end; the
decisions only take effect when their events are folded back by `evolve`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator

from events import PreemptionReason, PriorityClass
from services.scheduler.core import backfill, placement, preemption, quota
from services.scheduler.core.backfill import estimate_s
from services.scheduler.core.budget import held as budget_held
from services.scheduler.core.decisions import Admit, Cycle, CycleMark, Decision, Preempt, Requeue, Reservation
from services.scheduler.core.policy import CHAMBER, ORDERINGS, Policy, QueueKey
from services.scheduler.core.pools import DEFAULT_POOL
from services.scheduler.core.preemption import lost_work_gpu_s
from services.scheduler.core.state import QUEUED, Job, JobState, SchedulerState
from services.scheduler.core.work import Work
from services.timefmt import distinct, when

__all__ = ["PREEMPTION_SEARCHES", "estimate_s", "lost_work_gpu_s", "schedule", "select_victims"]

PREEMPTION_SEARCHES = CHAMBER.preemption_searches


def schedule(state: SchedulerState, now: float, since: CycleMark | None = None, *, policy: Policy = CHAMBER) -> Cycle:
    """Run one cycle. `since` is the previous cycle's mark: without it, or when capacity or rules
    changed since, every queued job is considered (full); else only newly queued ones.

    Victim searches are the costly part of a cycle on a full fleet, so, as Kueue nominates one head
    per queue, only the first waiting job of each (pool, team, priority) searches per cycle, and at
    most `policy.preemption_searches` searches run per cycle (in queue order)."""
    full = (
        since is None
        or since.capacity_epoch != state.capacity_epoch
        or bool(state.displaced)
        or now >= since.guard_at  # a queued job became protected by the starvation guard
        or bool(policy.head_of_line)  # a blocked head holds back everything behind it, new or not
    )
    work = Work(state, now, policy)
    state.capacity.begin()
    try:
        return _cycle(state, work, now, full, since, policy)
    finally:
        state.capacity.end()


def _cycle(state: SchedulerState, work: Work, now: float, full: bool, since: CycleMark | None, policy: Policy) -> Cycle:
    decisions: list[Decision] = []
    waiting: dict[str, str] = {}
    jobs = state.jobs

    # 1. requeue: work on a GPU or node out of service goes back to the queue, keeping its place
    requeued: dict[str, Job] = {}
    for jid in sorted(state.displaced):
        job = jobs[jid]
        if job.state != JobState.RUNNING:
            continue
        nodes = sorted({p.node for p in job.placements})
        out, faults = _out_of_service(state, job)
        work.release(job)
        requeued[jid] = job
        decisions.append(
            Requeue(
                jid,
                f"a GPU or node it ran on went out of service ({'; '.join(out) or ', '.join(nodes)})",
                nodes[0] if nodes else None,
                job.generation,
                faults,
            )
        )

    # 2. heads, in queue order (multifactor priority with age; protected jobs first)
    def queued_since(jid: str) -> float:
        return now if jid in requeued else jobs[jid].queued_since

    order = ORDERINGS[policy.order](policy, queued_since, now)
    guard_at = since.guard_at if since is not None and not full else math.inf
    keys: Iterable[tuple[int, float, float, str]]
    reservations: dict[str, Reservation]
    starving: dict[str, str]  # pool -> its first protected job waiting for capacity
    if policy.head_of_line:
        keys = _first_come_first_served(state, requeued, policy, waiting)
        reservations = {}
        starving = {}
    elif full or since is None:
        keys = sorted([*state.queue(), *(state.queue_key(j) for j in requeued.values())], key=order)
        reservations = {}
        starving = {}
    else:
        new = set(state.pending_log[since.pending_seq :])
        keys = sorted((state.queue_key(jobs[j]) for j in new if jobs[j].state in QUEUED), key=order)
        reservations = dict(since.reservations)
        starving = {pool: j for pool, j in since.starving if j in jobs and jobs[j].state in QUEUED}

    # 3-5. per job in order: nominate, preempt, admit (admissions change the scratch view at once)
    failed: dict[tuple[object, ...], str] = {}  # shapes that found no room this cycle: same answer
    considered = 0
    searched: set[tuple[str, str, int]] = set()  # (pool, team, priority) heads that searched for victims
    for key in keys:
        jid = key[3]
        job = jobs[jid]
        considered += 1
        spec = job.spec
        protected_at = policy.protected_since(queued_since(jid))
        if protected_at is not None and protected_at > now:
            guard_at = min(guard_at, protected_at)
        if job.pool != DEFAULT_POOL and job.pool not in state.pools:
            waiting[jid] = f"pool {job.pool} is not defined (define it with `chamber quota pool set`)"
            continue
        if (hold := budget_held(state, job, now)) is not None:
            waiting[jid] = hold
            continue
        shape = (
            job.pool,
            spec.team,
            spec.priority,
            spec.gpu_model,
            spec.cluster,
            spec.gpus_per_replica,
            spec.replicas,
            spec.preemptible,
        )
        if shape in failed:
            waiting[jid] = failed[shape]
            continue
        refused = quota.critical_block(state, spec.team, job.pool, spec.priority) if policy.quotas else None
        if refused is not None:
            waiting[jid] = refused
            continue
        # 3. nominate: the pool's backfill reservation, the team's quota, then placement
        res = reservations.get(job.pool)
        # Critical work (rare, and a per-team permission) is never held back by a reservation.
        exempt = spec.priority == PriorityClass.CRITICAL
        behind, via_extra = (None, False) if exempt else backfill.check(res, job, key, now, order)
        if behind is not None:
            waiting[jid] = behind
            continue
        generation = job.generation + (1 if jid in requeued else 0)
        resume = job.ran_before
        block = quota.block(work, job)
        protected = protected_at is not None and protected_at <= now
        # The starvation guard's second half: while a protected job waits for capacity in its pool,
        # jobs not yet protected do not take that pool's free GPUs (they may still preempt), so the
        # GPUs that free up go to the protected jobs, and whole nodes can free for whole-node jobs
        # (issue 19: low's tail on the ITP trace).
        starved_by = None if protected or exempt else starving.get(job.pool)
        spot = (
            placement.place(work, job)
            if block is None and starved_by is None and placement.could_fit(work, job)
            else None
        )
        if spot is not None:
            borrowed = quota.borrowed(work, job)
            lent = quota.lent_to(work, job)
            placements = work.admit(job, spot)
            why = f"placed on {work.describe(spot)}"
            if jid in work.link_notes:
                why += f"; {work.link_notes[jid]}"
            if borrowed:
                why += f", borrowing {borrowed} idle GPUs of pool {job.pool}"
            if lent:
                why += (
                    f" ({lent} on idle guarantees lent to non-preemptible work: returned by draining, not preemption)"
                )
            if res is not None and order(res.key) < order(key):
                why += (
                    f"; critical: started ahead of {res.job_id}, which has GPUs reserved"
                    if exempt
                    else f"; backfilled ahead of {res.job_id} without delaying it"
                )
                if via_extra:
                    reservations[job.pool] = Reservation(
                        res.job_id, res.key, res.gpus, res.shadow_at, res.extra_gpus - job.gpus
                    )
            decisions.append(Admit(jid, spec.team, placements, borrowed, why, resume, generation, job.pool))
            continue
        # 4. preempt: the first waiting job of each (pool, team, priority) may search for victims
        head = (job.pool, spec.team, spec.priority.rank)
        declined = None  # why it did not preempt the victims it found
        if (
            policy.preemption
            and head not in searched
            and len(searched) < policy.preemption_searches
            and preemption.may_preempt(work, job)
        ):
            searched.add(head)
            victims = preemption.select(work, job)
            if victims and not exempt and policy.preemption_worth is not None:
                declined = _not_worth(work, job, victims, policy.preemption_worth)
                if declined is not None:
                    victims = None
            if victims:
                kinds = sorted({r.value for _, r in victims})
                for v, reason in victims:
                    lost = lost_work_gpu_s(v, now)
                    decisions.append(
                        Preempt(
                            v.id,
                            v.spec.team,
                            reason,
                            jid,
                            lost,
                            f"preempted by {jid} ({reason.value}, {spec.priority.value} priority, team {spec.team})",
                            v.generation,
                        )
                    )
                    work.release(v)
                spot = placement.place(work, job)
                assert spot is not None, "select_victims promised a fit"
                borrowed = quota.borrowed(work, job)
                lent = quota.lent_to(work, job)
                placements = work.admit(job, spot)
                names = ", ".join(v.id for v, _ in victims)
                why = f"placed on {work.describe(spot)} after preempting {names} ({', '.join(kinds)})"
                if jid in work.link_notes:
                    why += f"; {work.link_notes[jid]}"
                if lent:
                    why += f"; {lent} GPUs on idle guarantees lent to non-preemptible work (returned by draining)"
                decisions.append(Admit(jid, spec.team, placements, borrowed, why, resume, generation, job.pool))
                failed.clear()  # freed capacity may fit shapes that failed before
                continue
        # 5. wait: record why; the first job of a pool blocked for capacity reserves (EASY backfill)
        if starved_by is not None:
            waiting[jid] = (
                f"held back: {starved_by} is protected by the starvation guard and waits for capacity in pool "
                f"{job.pool}; until it starts, jobs not yet protected start there only by preemption"
            )
            continue
        guard = ""
        if protected and protected_at is not None:  # protected implies a time it became so
            guard = (
                f"protected by the starvation guard since {when(protected_at, now)} "
                f"(queued since {when(queued_since(jid), now)}); "
            )
        classes = work.classes(job)
        # A lender's job waiting within its guarantee for lent GPUs to drain reserves them (so later
        # arrivals cannot take what drains). Other quota waits do not reserve: measured on the ITP
        # trace with classes, protected jobs reserving GPUs other teams hold raised high's p99 wait
        # from about 3 h to 49 h (README, issue 19).
        may_reserve = block is None or (quota.waits_for_drain(block) and quota.within_guarantee(work, job))
        if block is not None and not may_reserve:
            why = guard + block
        else:
            model = f" of model {spec.gpu_model}" if spec.gpu_model else ""
            why = guard + (
                block
                or f"waiting for capacity: needs {spec.replicas}x{spec.gpus_per_replica} GPUs{model} "
                f"in pool {job.pool}; {work.cap.free_in(classes)} free, "
                f"at most {work.cap.max_free(classes)} on one node"
            )
            if spec.gpus_per_replica > work.cap.max_gpus:
                why += f"; no node has {spec.gpus_per_replica} GPUs (the largest has {work.cap.max_gpus})"
            fits_ever = spec.gpus_per_replica <= work.cap.max_gpus and job.gpus <= sum(
                work.cap.class_total[c] for c in classes
            )
            if protected and block is None and fits_ever and policy.guard_holds_free_gpus and not policy.head_of_line:
                starving.setdefault(job.pool, jid)
            if (
                policy.backfill and fits_ever and (res is None or order(key) < order(res.key))
            ):  # never reserve for what cannot fit
                new_res = backfill.reservation(work, job, key)
                if new_res is not None:
                    reservations[job.pool] = new_res
                    why += f"; GPUs reserved for it from about {when(new_res.shadow_at, now)}"
                    waiting[jid] = why
                    continue
        if declined is not None:
            why += f"; {declined}"
        failed[shape] = why[len(guard) :]  # the same answer for the same shape, not the same guard
        waiting[jid] = why

    mark = CycleMark(
        state.capacity_epoch,
        len(state.pending_log),
        tuple(sorted(reservations.items())),
        guard_at,
        tuple(sorted(starving.items())),
    )
    return Cycle(decisions, waiting, mark, full, considered, reservations)


def _not_worth(work: Work, job: Job, victims: list[tuple[Job, PreemptionReason]], worth: float) -> str | None:
    """Why preempting `victims` for `job` is not worth it (they would lose more than `worth` x the
    GPU-time of its wait, by runtime estimates), or None if it is (or the wait has no estimate)."""
    lost = sum(lost_work_gpu_s(v, work.now) for v, _ in victims)
    if lost <= 0:
        return None
    # Worth it unless enough GPUs free (by estimates) within the wait that would cost lost / worth.
    at = backfill.free_by(work, job, work.now + lost / (worth * job.gpus))
    saved = 0.0 if at is None else job.gpus * (at - work.now)
    if at is None or lost <= worth * saved:
        return None
    lost_h, saved_h = distinct(lost / 3600, saved / 3600)  # never "0.0, more than ... 0.0"
    return (
        f"not preempting {', '.join(v.id for v, _ in victims)}: they would lose {lost_h} GPU-hours, "
        f"more than waiting for GPUs that free from about {when(at, work.now)} costs ({saved_h} GPU-hours)"
    )


def _first_come_first_served(
    state: SchedulerState, requeued: dict[str, Job], policy: Policy, waiting: dict[str, str]
) -> Iterator[QueueKey]:
    """Head-of-line blocking (the fifo and static-quota baselines): jobs in submit order, in one
    line ("all") or one per team, each line ending at its first job that waits (the cycle has put
    it in `waiting` by the time the next key is asked for). Reads only the heads of the state's
    per-team lines, so a long queue costs nothing per cycle."""
    extra: dict[str, list[tuple[float, str]]] = {}
    for job in requeued.values():  # still running in the state: not in its lines yet
        extra.setdefault(job.spec.team, []).append((job.submitted_at, job.id))
    teams = sorted(set(state.fifo_lines) | set(extra))

    def line(team: str) -> Iterator[tuple[float, str]]:
        return heapq.merge(state.fifo_lines.get(team, []), sorted(extra.get(team, [])))

    lines = [heapq.merge(*(line(t) for t in teams))] if policy.head_of_line == "all" else [line(t) for t in teams]
    jobs = state.jobs
    for entries in lines:
        for _, jid in entries:
            yield state.queue_key(jobs[jid])
            if jid in waiting:
                break


def select_victims(state: SchedulerState, job_id: str, now: float) -> list[tuple[str, PreemptionReason]] | None:
    """Which running jobs would be preempted to fit `job_id` now (computed only; nothing changes)."""
    job = state.jobs[job_id]
    work = Work(state, now)
    state.capacity.begin()
    try:
        found = preemption.select(work, job)
    finally:
        state.capacity.end()
    return None if found is None else [(v.id, r) for v, r in found]


def _out_of_service(state: SchedulerState, job: Job) -> tuple[list[str], tuple[str, ...]]:
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
