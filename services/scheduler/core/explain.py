"""Read models over the state: the queue listing and `chamber explain JOB`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from events import Event, JobCancelled, JobCompleted, JobFailed, JobSpec, JobSubmitted
from services.scheduler.core.budget import note as budget_note
from services.scheduler.core.degraded import only_degraded, out_of_service, stay_note
from services.scheduler.core.door import cannot_run
from services.scheduler.core.idle import flag as idle_flag
from services.scheduler.core.policy import CHAMBER, ORDERINGS, Policy, QueueKey, by_multifactor_priority, sorted_queue
from services.scheduler.core.shares import describe as describe_share
from services.scheduler.core.state import FINISHED, QUEUED, Job, JobState, SchedulerState
from services.timefmt import iso, when


def _placement(job: Job) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for p in job.placements:
        out.setdefault(p.node, []).extend(p.gpu_indices)
    return out


def _ask(spec: JobSpec) -> str:
    """`2x8 GPUs of H100-80GB` / `4x250 milli-GPU (mps) of ...`: what the job asks for."""
    each = f"{spec.gpus_per_replica} GPUs" if spec.share is None else describe_share(spec.share)
    return f"{spec.replicas}x{each}" + (f" of {spec.gpu_model}" if spec.gpu_model else "")


def _shares(job: Job) -> list[dict[str, Any]]:
    """The part of each GPU a job sharing GPUs holds (empty for whole GPUs)."""
    if job.spec.share is None:
        return []
    return [
        {"node": p.node, "gpu": i, "share_milli": p.share_milli, "mig_profile": p.mig_profile, "mig_start": p.mig_start}
        for p in job.placements
        for i in p.gpu_indices
    ]


def _where(job: Job) -> str:
    """`n1[0,1]`, and for shares `n1[0] 250 milli-GPU` / `n1[0] 1g.10gb@2` per placement."""
    out = []
    for p in job.placements:
        text = f"{p.node}[{','.join(map(str, p.gpu_indices))}]"
        if p.mig_profile:
            text += f" {p.mig_profile} at slice {p.mig_start}"
        elif job.spec.share is not None:
            text += f" {p.share_milli} milli-GPU"
        out.append(text)
    return ", ".join(out)


def _reason(job: Job, waiting: Mapping[str, str], impossible: list[str] | None = None) -> str:
    if job.state in QUEUED and impossible:
        return CANNOT_RUN + "; ".join(impossible)
    if job.state in QUEUED and job.id in waiting:
        return waiting[job.id]
    return job.reason


CANNOT_RUN = "cannot run until this changes: "  # a job kept with --allow-wait that the fleet as installed cannot run


def _impossible(state: SchedulerState, jobs: list[Job]) -> dict[str, list[str]]:
    """Why each queued job can never start as specified (`cannot_run`), by job; asked once per shape."""
    by_shape: dict[tuple[Any, ...], list[str]] = {}
    out = {}
    for j in jobs:
        if j.state not in QUEUED:
            continue
        s = j.spec
        shape = (s.team, s.pool, s.gpu_model, s.gpus_per_replica, s.replicas, s.share)
        if shape not in by_shape:
            by_shape[shape] = cannot_run(state, s)
        if by_shape[shape]:
            out[j.id] = by_shape[shape]
    return out


def _held_under(state: SchedulerState, job: Job) -> str:
    """The isolations health's budget held back on the GPUs (or nodes) a running job holds, with why."""
    out = []
    for p in job.placements:
        node = state.nodes.get((p.cluster, p.node))
        if node is None:
            continue
        for gpu in ([None] if None in node.held else []) + [i for i in p.gpu_indices if i in node.held]:
            where = p.node if gpu is None else f"{p.node} GPU {gpu}"
            out.append(f"{where} ({node.held[gpu]})")
    return "; ".join(out)


def queue_order(state: SchedulerState, now: float, policy: Policy = CHAMBER) -> list[QueueKey]:
    """The queued jobs in the order the next cycle at `now` takes them: the policy's own ordering
    (ORDERINGS, the key the cycle sorts by: protected jobs first, then multifactor priority with
    age). The one definition behind `chamber queue` and `chamber explain`."""
    keys = state.queue()
    return sorted_queue(policy, keys, [state.jobs[k[3]].queued_since for k in keys], now)


def _queued_facts(policy: Policy, key: QueueKey, position: int, since: float, now: float) -> dict[str, Any]:
    """A queued job's place in the next cycle's order and the factors behind it."""
    protected_at = policy.protected_since(since)
    multifactor = ORDERINGS[policy.order] is by_multifactor_priority
    return {
        "position": position,
        "priority_score": round(policy.priority(key, now - since), 1) if multifactor else None,
        "queued_since": since,
        "age_s": round(max(now - since, 0.0), 1),
        "protected_since": protected_at,
        "protected": protected_at is not None and now >= protected_at,
    }


_NOT_QUEUED: dict[str, Any] = dict.fromkeys(
    ("position", "priority_score", "queued_since", "age_s", "protected_since", "protected")
)


def queue_rows(
    state: SchedulerState,
    waiting: Mapping[str, str],
    *,
    now: float,
    policy: Policy = CHAMBER,
    include_finished: bool = False,
) -> list[dict[str, Any]]:
    """Jobs in the `chamber queue --json` shape: queued ones first, in the order the next cycle takes
    them (`queue_order`), each with its position, priority score, age and starvation guard; then
    running, then finished jobs."""
    keys = queue_order(state, now, policy)
    position = {key[3]: i for i, key in enumerate(keys, start=1)}
    rank = {JobState.RUNNING: 1, JobState.PENDING: 0, JobState.SUSPENDED: 0}
    jobs = [j for j in state.jobs.values() if include_finished or j.state not in FINISHED]
    jobs.sort(key=lambda j: (rank.get(j.state, 2), position.get(j.id, 0), j.submitted_at, j.id))
    queued = {
        key[3]: _queued_facts(policy, key, position[key[3]], state.jobs[key[3]].queued_since, now) for key in keys
    }
    impossible = _impossible(state, jobs)
    return [
        {
            "id": j.id,
            "name": j.spec.name,
            "team": j.spec.team,
            "priority": j.spec.priority.value,
            "gpus": j.spec.gpus_per_replica,
            "share": None if j.spec.share is None else describe_share(j.spec.share),  # part of a GPU per replica
            "replicas": j.spec.replicas,
            "state": j.state.value,
            "reason": _reason(j, waiting, impossible.get(j.id)),
            "cannot_run": impossible.get(j.id, []),
            "placement": _placement(j),
            "submitted_at": j.submitted_at,
            **queued.get(j.id, _NOT_QUEUED),
        }
        for j in jobs
    ]


def explain(
    state: SchedulerState,
    job_id: str,
    waiting: Mapping[str, str],
    *,
    now: float | None = None,
    policy: Policy = CHAMBER,
) -> dict[str, Any] | None:
    """Why a job is where it is, as a sentence plus the facts behind it; None for an unknown job.

    With `now`, a queued job also says whether the starvation guard protects it, and since when
    (or from when it will)."""
    job = state.jobs.get(job_id)
    if job is None:
        return None
    guard: dict[str, Any] | None = None
    protected_at = policy.protected_since(job.queued_since) if job.state in QUEUED else None
    if protected_at is not None:
        guard = {
            "queued_since": job.queued_since,
            "protected_since": protected_at,
            "protected": now is not None and now >= protected_at,
        }
    spec = job.spec
    ask = _ask(spec)
    head = f"job {job.id} ({spec.name or 'unnamed'}, team {spec.team}, {spec.priority.value} priority, {ask}"
    head += f", pool {job.pool})"
    impossible = _impossible(state, [job]).get(job.id)
    if impossible:
        waiting = {**waiting, job.id: _reason(job, waiting, impossible)}
    if job.state == JobState.RUNNING:
        text = _running_text(state, job, head)
        if state.idle_reclaim and (idle := idle_flag(state, job)) is not None:
            text += f"; {idle}"
    elif job.state in QUEUED:
        text = _queued_text(state, job, head, waiting, guard, now, policy)
    else:
        text = f"{head} is {job.state.value}: {job.reason}"
    if job.note:
        text += f". Note: {job.note}"
    elif now is not None and job.state not in FINISHED and (budget := budget_note(state, spec.team, now)):
        text += f". Note: {budget}"
    return {
        "id": job.id,
        "state": job.state.value,
        "text": text,
        "reason": _reason(job, waiting),
        "cannot_run": impossible or [],
        "placement": _placement(job),
        "shares": _shares(job),
        "preempted_by": job.preempted_by,
        "preempt_reason": job.preempt_reason,
        "preemptions": job.preemptions,
        "starvation_guard": guard,
    }


def _running_text(state: SchedulerState, job: Job, head: str) -> str:
    plain = ", ".join(f"{p.node}[{','.join(map(str, p.gpu_indices))}]" for p in job.placements)
    where = _where(job)
    # the reason starts with where it was placed, which the sentence has just said
    reason = job.reason.removeprefix(f"placed on {plain}").lstrip(" ,;")
    if job.spec.share is not None and reason.startswith("("):  # the share, which `where` has said too
        reason = reason.partition(")")[2].lstrip(" ,;")
    text = f"{head} is running on {where}" + (f": {reason}" if reason else "")
    if job.id in state.displaced and only_degraded(state, job):  # the cycle leaves it there (cycle.py)
        text += f"; {stay_note(job, out_of_service(state, job)[0], at_least=True)}"
    if job.borrowed_gpus and not job.spec.preemptible:  # issue 19: lent to it, returned by draining
        lent = "runs on lent capacity, given back when it ends, never preempted"
        text += f" ({_gpus(job.borrowed_gpus)} borrowed: {lent})"
    elif job.borrowed_gpus:
        back = "it" if job.borrowed_gpus == 1 else "them"
        text += f" ({_gpus(job.borrowed_gpus)} borrowed: the team that lent {back} may take {back} back)"
    if held := _held_under(state, job):
        text += f"; an isolation is held for {held}: it runs on, and no new work is placed there"
    return text


def _gpus(n: float) -> str:
    return f"{n:g} GPU" if n == 1 else f"{n:g} GPUs"


def _queued_text(
    state: SchedulerState,
    job: Job,
    head: str,
    waiting: Mapping[str, str],
    guard: dict[str, Any] | None,
    now: float | None,
    policy: Policy,
) -> str:
    # the order the next cycle uses (age and the starvation guard included); without a time, the
    # static part of it (class, fair share, submit time)
    queue = state.queue() if now is None else queue_order(state, now, policy)
    position = next((i for i, k in enumerate(queue) if k[3] == job.id), None)
    pos = f"position {position + 1} of {len(queue)} in the queue" if position is not None else "queued"
    why = waiting.get(job.id) or job.reason
    if guard is not None and now is not None:
        protected_at = guard["protected_since"]
        if guard["protected"] and "starvation guard" not in why:
            why = (
                f"protected by the starvation guard since {when(protected_at, now)} (queued since "
                f"{when(job.queued_since, now)}): later jobs may not delay it; {why}"
            )
        elif not guard["protected"]:
            why += f" (the starvation guard protects it from {when(protected_at, now)} if it still waits)"
    if job.state == JobState.SUSPENDED:
        return f"{head} is suspended: {job.reason}; it resumes automatically when capacity frees ({pos}; now: {why})"
    return f"{head} is pending ({pos}): {why}"


def explain_finished(job_id: str, submitted: Event, ended: Event) -> dict[str, Any]:
    """`chamber explain` of a finished job that has left the scheduler's memory, from its first event
    (the submit) and its last one on the log."""
    head = f"job {job_id}"
    if isinstance(submitted, JobSubmitted):
        spec = submitted.spec
        ask = _ask(spec)
        head += f" ({spec.name or 'unnamed'}, team {spec.team}, {spec.priority.value} priority, {ask})"
    state, why = _ending(ended)
    text = f"{head} is {state}: {why} (from the log: finished jobs leave the scheduler's memory as they finish)"
    return {
        "id": job_id,
        "state": state,
        "text": text,
        "reason": why,
        "placement": {},
        "preempted_by": None,
        "preempt_reason": None,
        "preemptions": None,
        "starvation_guard": None,
    }


def _ending(ended: Event) -> tuple[str, str]:
    at = getattr(ended, "at", None)
    at_text = f" at {iso(at)}" if isinstance(at, float | int) else ""
    if isinstance(ended, JobCompleted):
        return JobState.COMPLETED.value, f"completed{at_text}"
    if isinstance(ended, JobFailed):
        return JobState.FAILED.value, f"failed{at_text}: {ended.reason}"
    if isinstance(ended, JobCancelled):
        by = f" by {ended.by}" if ended.by else ""
        return JobState.CANCELLED.value, f"cancelled{by}{at_text}" + (f": {ended.reason}" if ended.reason else "")
    return "unknown", f"its last event is {type(ended).__name__}{at_text}"
