"""The door of `submit`: a request becomes a JobSubmitted only if every consumer will accept it.

Pure (state and time passed in). The request type (events.commands.SubmitJob) has already checked
names and limits and normalised the team; here the event is checked with its own decoder (so nothing
acknowledged is dead-lettered later), a team without any quota is refused, and a job bigger than the
fleet is accepted with a warning that says so (nodes may still join).
"""

from __future__ import annotations

from events.commands import SubmitJob
from events.jobs import JobSpec, JobSubmitted
from events.names import InvalidName, check_event
from services.scheduler.core.state import SchedulerState


def submitted(state: SchedulerState, req: SubmitJob, job_id: str, at: float) -> JobSubmitted:
    """The event a valid request records; raises InvalidName naming the field to fix."""
    if req.gpus is not None and req.gpus_per_replica is not None and req.gpus != req.gpus_per_replica:
        raise InvalidName("gpus and gpus_per_replica differ; give one of them", field="gpus")
    gpus = req.gpus if req.gpus is not None else req.gpus_per_replica
    if gpus is None:
        raise InvalidName("how many GPUs per replica? pass --gpus N (N >= 1)", field="gpus")
    if job_id in state.jobs:
        raise InvalidName(f"job {job_id} exists already; pick another id", field="id")
    if req.team not in state.team_pools:
        raise InvalidName(
            f"team {req.team!r} has no quota, so it may not submit; an operator sets one with "
            f"`chamber quota set {req.team} --gpus N` (0 is allowed: the team then only borrows idle GPUs)",
            field="team",
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
    )
    event = JobSubmitted(job_id=job_id, at=at, spec=spec)
    check_event(event)
    return event


def size_warnings(state: SchedulerState, spec: JobSpec) -> list[str]:
    """What makes a job unable to start on the fleet as it is now (empty when it could fit)."""
    nodes = [n for n in state.nodes.values() if not n.lost]
    if not nodes:
        return []
    total = sum(len(n.gpus) for n in nodes)
    largest = max(len(n.gpus) for n in nodes)
    out = []
    if spec.total_gpus > total:
        out.append(f"the job asks for {spec.total_gpus} GPUs and the fleet has {total}: it waits until more nodes join")
    if spec.gpus_per_replica > largest:
        out.append(
            f"each replica asks for {spec.gpus_per_replica} GPUs on one node and the largest node has {largest}: "
            "it waits until a larger node joins (or split it into more replicas)"
        )
    return out
