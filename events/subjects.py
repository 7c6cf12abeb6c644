"""Subject builders. Every subject mirrors its event's domain and names the entity it is about.

Tokens are lower case; characters NATS reserves (`.`, `*`, `>`, whitespace) and anything outside
[a-z0-9_-] become `_`, so `gpu-node.example.com` is the token `gpu-node_example_com`. The event body
always carries the exact name. Fleet-wide quota and billing events (pools, prices, idle cost) use the
reserved token `_fleet`, which no team name can produce (team tokens never start with `_`).
"""

from __future__ import annotations

import re

from events.base import Event
from events.billing import BudgetExceeded, CostAccrued, PriceSet, ServingTokensReported
from events.dispatch import (
    ClusterHeartbeat,
    CopyRecalled,
    CopyReported,
    WorkloadDispatched,
    WorkloadOffered,
    WorkloadWithdrawn,
)
from events.fabric import FabricSample, JobSlowdownCleared, JobSlowdownDetected
from events.faults import GpuFaultDetected
from events.fleet import MigChangeAbandoned, MigLayoutApplied, MigLayoutPlanned
from events.idle import IdlePolicySet, JobIdleDetected
from events.quota import BudgetSet, FairShareUpdated, PoolDefined, PoolRemoved, TeamQuotaSet
from events.steps import RankStepTimings
from events.streams import INGEST_PREFIX
from events.telemetry import NodeInventory, NodeSample

ROOT = "chamber"
FLEET_WIDE = "_fleet"
_UNSAFE = re.compile(r"[^a-z0-9_-]")


class SubjectError(ValueError):
    """A name that cannot become a subject token."""


def token(value: str) -> str:
    """One subject token for a name (cluster, node, job, team, service, stream)."""
    if not value or not value.strip():
        raise SubjectError("a subject token cannot be empty")
    return _UNSAFE.sub("_", value.strip().lower())


def sample(cluster: str, node: str) -> str:
    return f"{ROOT}.telemetry.sample.{token(cluster)}.{token(node)}"


def inventory(cluster: str, node: str) -> str:
    return f"{ROOT}.telemetry.inventory.{token(cluster)}.{token(node)}"


def fabric(cluster: str, node: str) -> str:
    return f"{ROOT}.telemetry.fabric.{token(cluster)}.{token(node)}"


def steps(cluster: str, node: str) -> str:
    """Per-rank step timings of the jobs on a node (events/steps.py)."""
    return f"{ROOT}.telemetry.steps.{token(cluster)}.{token(node)}"


def ingest(subject: str) -> str:
    """Where an agent publishes a message for `subject`: its gate stream, which bounds each node's rate
    and passes the message on under `subject` (events/streams.py). Given an ingest subject, the same."""
    if subject.startswith(INGEST_PREFIX):
        return subject
    return INGEST_PREFIX + subject.removeprefix(f"{ROOT}.")


def perf(job_id: str) -> str:
    """A job's slowdown verdicts: in the JOBS stream beside the job's lifecycle, on a subject of their
    own so that the scheduler's per-job subject sequence (optimistic appends) is not disturbed."""
    return f"{ROOT}.jobs.{token(job_id)}.perf"


def idle(job_id: str) -> str:
    """A job's idle verdicts: like `perf`, on a subject of their own beside the job's lifecycle."""
    return f"{ROOT}.jobs.{token(job_id)}.idle"


def idle_policy(team: str) -> str:
    """A team's idle policy: in QUOTA beside its quota, on a subject of its own (quota's per-team
    subject sequence is left to the quota service)."""
    return f"{ROOT}.quota.{token(team)}.idle"


def faults(cluster: str, node: str) -> str:
    return f"{ROOT}.faults.{token(cluster)}.{token(node)}"


def fleet(cluster: str, node: str) -> str:
    return f"{ROOT}.fleet.{token(cluster)}.{token(node)}"


def fleet_mig(cluster: str, node: str) -> str:
    """A node's MIG layout changes, planned and applied (by the scheduler and its Kubernetes actuator):
    in FLEET, on a subject of their own, so the scheduler may publish them and no other fleet event."""
    return f"{fleet(cluster, node)}.mig"


def jobs(job_id: str) -> str:
    return f"{ROOT}.jobs.{token(job_id)}"


def quota(team: str | None) -> str:
    return f"{ROOT}.quota.{token(team) if team else FLEET_WIDE}"


def billing(team: str | None) -> str:
    return f"{ROOT}.billing.{token(team) if team else FLEET_WIDE}"


def command(service: str, verb: str) -> str:
    return f"{ROOT}.cmd.{token(service)}.{token(verb)}"


def dispatch_offer(origin: str, workload: str) -> str:
    return f"{ROOT}.dispatch.offer.{token(origin)}.{token(workload)}"


def dispatch_decision(workload: str) -> str:
    return f"{ROOT}.dispatch.decision.{token(workload)}"


def dispatch_copy(cluster: str, workload: str) -> str:
    return f"{ROOT}.dispatch.copy.{token(cluster)}.{token(workload)}"


def dispatch_heartbeat(cluster: str) -> str:
    return f"{ROOT}.dispatch.heartbeat.{token(cluster)}"


def dead(stream: str) -> str:
    return f"{ROOT}.dead.{token(stream)}"


def subject_for(event: Event) -> str:
    """The subject an event is published on."""
    match event:
        case NodeSample():
            return sample(event.cluster, event.node)
        case NodeInventory():
            return inventory(event.cluster, event.node)
        case FabricSample():
            return fabric(event.cluster, event.node)
        case RankStepTimings():
            return steps(event.cluster, event.node)
        case JobSlowdownDetected() | JobSlowdownCleared():
            return perf(event.job_id)
        case JobIdleDetected():
            return idle(event.job_id)
        case IdlePolicySet():
            return idle_policy(event.team)
        case GpuFaultDetected():
            return faults(event.cluster, event.node)
        case MigLayoutPlanned() | MigLayoutApplied() | MigChangeAbandoned():
            return fleet_mig(event.cluster, event.node)
        case PoolDefined() | PoolRemoved():
            return quota(None)
        case TeamQuotaSet() | FairShareUpdated() | BudgetSet():
            return quota(event.team)
        case PriceSet():
            return billing(None)
        case CostAccrued():
            return billing(event.team)
        case BudgetExceeded() | ServingTokensReported():
            return billing(event.team)
        case WorkloadOffered() | WorkloadWithdrawn():
            return dispatch_offer(event.origin, event.workload)
        case WorkloadDispatched() | CopyRecalled():
            return dispatch_decision(event.workload)
        case CopyReported():
            return dispatch_copy(event.cluster, event.workload)
        case ClusterHeartbeat():
            return dispatch_heartbeat(event.cluster)
    domain = event.domain()
    if domain == "fleet":
        return fleet(event.cluster, event.node)  # type: ignore[attr-defined]
    if domain == "jobs":
        return jobs(event.job_id)  # type: ignore[attr-defined]
    raise SubjectError(f"no subject rule for {type(event).__name__}")
