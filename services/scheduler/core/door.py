"""The door of `submit`: a request becomes a JobSubmitted only if every consumer will accept it.

One door for the CLI, the HTTP API (the gateway forwards to the scheduler's `submit`) and Kubernetes
workloads (services/scheduler/kubernetes.py): `admit` is every check, in one pure function (state
and time passed in). The request type (events.commands.SubmitJob) has already checked names and
limits and normalised the team; here the event is checked with its own decoder (so nothing
acknowledged is dead-lettered later), a team without any quota is refused, a job that can never start
on the fleet as installed is refused unless `allow_wait` (`cannot_run`), and critical work is refused
to a team its quota does not allow it (`quota.critical_block`).
"""

from __future__ import annotations

import difflib

from events.commands import SubmitJob
from events.jobs import GpuShare, JobSpec, JobSubmitted, PriorityClass, ShareMode
from events.names import InvalidName, check_event
from services.pools import DEFAULT_POOL, job_pool, node_pool
from services.scheduler.core.mig import MIG_MODELS, mig_model
from services.scheduler.core.quota import critical_block
from services.scheduler.core.shares import equivalents, mig_models_with
from services.scheduler.core.state import Node, SchedulerState


def admit(state: SchedulerState, req: SubmitJob, job_id: str, at: float) -> tuple[JobSubmitted, list[str]]:
    """The event a valid request records, and why it cannot run yet (said as warnings when the request
    allows waiting); raises InvalidName naming the field to fix."""
    event = submitted(state, req, job_id, at)
    impossible = cannot_run(state, event.spec)
    if impossible and not req.allow_wait:
        raise InvalidName(
            "the job cannot run on this fleet: "
            + "; ".join(impossible)
            + ". Change the request, or submit with --allow-wait (allow_wait) to keep it waiting until it can",
            field="gpu_model" if impossible[0].startswith("no GPU") else "gpus",
        )
    refused = critical_block(state, event.spec.team, job_pool(event.spec, state.team_pools), event.spec.priority)
    if refused is not None:
        raise InvalidName(refused, field="priority")
    return event, impossible


def submitted(state: SchedulerState, req: SubmitJob, job_id: str, at: float) -> JobSubmitted:
    """The event a valid request records; raises InvalidName naming the field to fix."""
    if req.gpus is not None and req.gpus_per_replica is not None and req.gpus != req.gpus_per_replica:
        raise InvalidName("gpus and gpus_per_replica differ; give one of them", field="gpus")
    gpus = req.gpus if req.gpus is not None else req.gpus_per_replica
    share = _share(req)
    if share is not None:
        if gpus not in (None, 1):
            raise InvalidName(
                f"a GPU share is part of one GPU per replica, and the request asks for {gpus} GPUs per replica; "
                "give --replicas N for more shares (or whole GPUs without a share)",
                field="gpus",
            )
        gpus = 1
    if gpus is None:
        raise InvalidName("how many GPUs per replica? pass --gpus N (N >= 1)", field="gpus")
    if job_id in state.jobs:
        raise InvalidName(f"job {job_id} exists already; pick another id", field="id")
    if req.team not in state.team_pools:
        close = difflib.get_close_matches(req.team, sorted(state.team_pools), n=1, cutoff=0.6)
        if close:
            raise InvalidName(f"no team {req.team!r}; did you mean {close[0]!r}?", field="team")
        raise InvalidName(
            f"team {req.team!r} has no quota, so it may not submit; an operator sets one with "
            f"`chamber quota set {req.team} --gpus N` (0 is allowed: the team then only borrows idle GPUs)",
            field="team",
        )
    if req.pool:
        _check_pool(state, req.pool)
    if req.priority == PriorityClass.SERVING:
        raise InvalidName(
            "class serving is for the replicas of serving workloads (Kubernetes Deployments, StatefulSets and "
            "LeaderWorkerSets labelled chamber.io/team); submit this job as high",
            field="priority",
        )
    spec = JobSpec(
        team=req.team,
        gpus_per_replica=gpus,
        replicas=req.replicas,
        priority=req.priority,
        name=req.name,
        pool=req.pool,
        cluster=req.cluster,
        gpu_model=req.gpu_model,
        preemptible=req.preemptible,
        checkpoint_interval_s=req.checkpoint_interval_s,
        expected_duration_s=req.expected_duration_s,
        sim_duration_s=req.sim_duration_s,
        topology_key=req.topology_key,
        share=share,
        cpu_milli=req.cpu_milli,
        memory_mib=req.memory_mib,
    )
    event = JobSubmitted(job_id=job_id, at=at, spec=spec)
    check_event(event)
    return event


def _share(req: SubmitJob) -> GpuShare | None:
    """The part of one GPU a request asks per replica (None: whole GPUs); InvalidName when it mixes
    a MIG instance with a fraction, or names a profile no GPU model has."""
    fraction = req.gpu_milli is not None or req.gpu_memory_mib is not None or req.share_mode is not None
    if req.mig_profile:
        if fraction:
            raise InvalidName(
                "a MIG instance and a GPU fraction both asked for; give --mig-profile alone, or the fraction",
                field="mig_profile",
            )
        having = mig_models_with(req.mig_profile)
        if not having:
            known = sorted({p for m in MIG_MODELS.values() for p in m.profiles})
            close = difflib.get_close_matches(req.mig_profile, known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidName(f"no GPU model has MIG profile {req.mig_profile!r}{hint}", field="mig_profile")
        return GpuShare(mode=ShareMode.MIG, mig_profile=req.mig_profile)
    if not fraction:
        return None
    if req.share_mode == ShareMode.MIG:
        raise InvalidName("share mode mig needs --mig-profile (the instance's profile)", field="share_mode")
    if not req.gpu_milli:
        raise InvalidName(
            "a GPU fraction needs --gpu-milli N (1..1000: the share of the GPU's compute its quota counts); "
            "--gpu-memory only adds a memory limit",
            field="gpu_milli",
        )
    return GpuShare(
        gpu_milli=req.gpu_milli,
        memory_mib=req.gpu_memory_mib or 0,
        mode=req.share_mode or ShareMode.TIME_SLICING,
    )


def _check_pool(state: SchedulerState, pool: str) -> None:
    """A pool nobody defined and no quota names is a typo: refused, with the pools there are."""
    known = {DEFAULT_POOL, *state.pools, *(p for p, _ in state.quotas)}
    if pool in known:
        return
    close = difflib.get_close_matches(pool, sorted(known), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise InvalidName(f"no pool {pool!r} (pools: {', '.join(sorted(known))}){hint}", field="pool")


def cannot_run(state: SchedulerState, spec: JobSpec) -> list[str]:
    """Why the job can never start on the fleet as installed (empty when it could): no GPU of its
    model, more GPUs than the fleet or its pool has, a replica larger than any node, or more than its
    team may ever hold in the pool (guarantee plus borrow limit). Isolations do not count: they end.
    With no node known yet nothing is said (the fleet may still be joining)."""
    nodes = [n for n in state.nodes.values() if not n.lost]
    if not nodes:
        return []
    out = []
    if spec.gpu_model:
        models: dict[str, int] = {}
        for n in nodes:
            for m in n.gpus.values():
                models[m] = models.get(m, 0) + 1
        if spec.gpu_model.lower() not in {m.lower() for m in models}:
            close = difflib.get_close_matches(spec.gpu_model, list(models), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            have = ", ".join(f"{m} ({k} GPUs)" for m, k in sorted(models.items()))
            out.append(f"no GPU in the fleet is a {spec.gpu_model!r} (it has {have}){hint}")
            return out
        nodes = [n for n in nodes if n.model.lower() == spec.gpu_model.lower()]
    if spec.share is not None and spec.share.mig_profile:
        profile = spec.share.mig_profile
        nodes = [n for n in nodes if (t := mig_model(n.model)) is not None and profile in t.profiles]
        if not nodes:
            out.append(f"no GPU in the fleet{' of that model' if spec.gpu_model else ''} has MIG profile {profile}")
            return out
    pool = job_pool(spec, state.team_pools)
    in_pool = [n for n in nodes if node_pool(state.pools, n.model, n.labels) == pool]
    total = sum(len(n.gpus) for n in in_pool)
    largest = max((len(n.gpus) for n in in_pool), default=0)
    where = f"pool {pool}" + (f" ({spec.gpu_model})" if spec.gpu_model else "")
    asked = spec.total_gpus if spec.share is None else equivalents(spec)  # shares: GPU-equivalents
    if asked > total:
        out.append(f"the job asks for {asked:g} GPUs and {where} has {total} installed")
    if spec.gpus_per_replica > largest:
        out.append(
            f"each replica asks for {spec.gpus_per_replica} GPUs on one node and the largest node of {where} has "
            f"{largest} (split it into more replicas)"
        )
    q = state.quotas.get((pool, spec.team))
    if q is not None and q.borrow_limit is not None and asked > q.guaranteed + q.borrow_limit:
        out.append(
            f"team {spec.team} may hold at most {q.guaranteed + q.borrow_limit} GPUs in pool {pool} (guarantee "
            f"{q.guaranteed} + borrow limit {q.borrow_limit}) and the job asks for {asked:g}"
        )
    return out + _host_too_small(spec, in_pool, where)


def _host_too_small(spec: JobSpec, nodes: list[Node], where: str) -> list[str]:
    """A replica asking more CPU or memory than every node has, where every node's capacity is known
    (a node of unknown capacity may hold it)."""
    out = []
    asks = [
        (spec.cpu_milli, "CPUs", 1000, [n.cpu_milli for n in nodes]),
        (spec.memory_mib, "MiB of memory", 1, [n.memory_mib for n in nodes]),
    ]
    for asked, unit, scale, have in asks:
        known = [h for h in have if h is not None]
        if asked and known and len(known) == len(have) and asked > max(known):
            out.append(
                f"each replica asks for {asked / scale:g} {unit} and the largest node of {where} has "
                f"{max(known) / scale:g}"
            )
    return out
