"""The scheduler's pure core: `evolve(state, event)` folds JOBS, FLEET, QUOTA (and NIC faults from FAULTS);
`schedule(state, now, since) -> Cycle` decides; `events_for(decisions, now)` turns decisions into
events. No I/O, no clock, no randomness: the service and the simulator drive the same code."""

from services.scheduler.core.cycle import estimate_s, lost_work_gpu_s, schedule, select_victims
from services.scheduler.core.decisions import Admit, Cycle, CycleMark, Decision, Preempt, Requeue, events_for
from services.scheduler.core.explain import explain, queue_rows
from services.scheduler.core.policy import CHAMBER, ORDERINGS, POLICIES, Policy
from services.scheduler.core.pools import DEFAULT_POOL, PoolDef, job_pool, node_pool
from services.scheduler.core.state import FINISHED, QUEUED, Job, JobState, Node, Quota, SchedulerState, evolve

__all__ = [
    "CHAMBER",
    "DEFAULT_POOL",
    "FINISHED",
    "ORDERINGS",
    "POLICIES",
    "QUEUED",
    "Admit",
    "Cycle",
    "CycleMark",
    "Decision",
    "Job",
    "JobState",
    "Node",
    "Policy",
    "PoolDef",
    "Preempt",
    "Quota",
    "Requeue",
    "SchedulerState",
    "estimate_s",
    "events_for",
    "evolve",
    "explain",
    "job_pool",
    "lost_work_gpu_s",
    "node_pool",
    "queue_rows",
    "schedule",
    "select_victims",
]
