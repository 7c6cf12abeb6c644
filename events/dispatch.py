"""Multi-cluster dispatch (stream DISPATCH): workloads offered by their origin cluster, the one cluster
each is dispatched to, the status of its one remote copy, and each cluster actuator's heartbeat.

Who publishes what: a cluster's actuator (`chamber service dispatch --actuator --cluster C`) offers the
workloads created in C, reports the copies C runs and beats for C; the dispatcher (`chamber service
dispatch`) decides where each workload runs and when a copy is recalled (completed, preempted, or its
cluster lost). A copy is named by (workload, cluster, generation): a generation is used once.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import msgspec

from events.base import Event, Name, event_type
from events.names import Team, Text

GpuCount = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
Generation = Annotated[int, msgspec.Meta(ge=1)]
MANIFEST_MAX = 512 * 1024  # the workload as JSON: far below the stream's 1 MiB message limit


class CopyPhase(StrEnum):
    CREATED = "created"  # the copy exists in its cluster, held until that cluster admits it
    RUNNING = "running"  # admitted there (unsuspended or ungated)
    SUSPENDED = "suspended"  # it ran and was suspended again there (preempted): it goes elsewhere
    COMPLETE = "complete"
    FAILED = "failed"
    GONE = "gone"  # deleted (recalled), or found missing


FINAL_PHASES = frozenset({CopyPhase.COMPLETE, CopyPhase.FAILED})


class WorkloadOffered(Event, frozen=True, tag=event_type("dispatch", "workload_offered")):
    """A workload created in `origin` with a `chamber.io/clusters` annotation: the origin object stays
    suspended (the user's one handle) and one copy of `manifest` runs in the cluster it is dispatched to."""

    workload: Name  # the origin's job id (k8s-<origin>-<namespace>-[<kind>-]<name>)
    origin: Name
    namespace: Name
    name: Name
    team: Team
    gpus: GpuCount
    at: float
    uid: Text = ""
    kind: Name = "Job"
    clusters: tuple[Name, ...] = ()  # the allow-list in order of preference; empty: any
    manifest: Annotated[str, msgspec.Meta(max_length=MANIFEST_MAX)] = "{}"  # apiVersion, kind, labels, spec


class WorkloadWithdrawn(Event, frozen=True, tag=event_type("dispatch", "workload_withdrawn")):
    """The origin object is gone (deleted by its user): its copy, if any, is recalled."""

    workload: Name
    origin: Name
    at: float


class WorkloadDispatched(Event, frozen=True, tag=event_type("dispatch", "workload_dispatched")):
    """The one cluster that runs the workload now, and the generation its copy carries."""

    workload: Name
    cluster: Name
    generation: Generation
    at: float
    reason: Text = ""


class CopyRecalled(Event, frozen=True, tag=event_type("dispatch", "copy_recalled")):
    """The copy (workload, cluster, generation) is to be deleted: the workload completed or failed,
    was preempted there, withdrawn, or its cluster stopped answering (the copy is fenced: if it is
    ever seen again it is deleted before anything else runs there)."""

    workload: Name
    cluster: Name
    generation: Generation
    at: float
    reason: Text = ""
    final: bool = False  # the workload is done (completed, failed, withdrawn): it is not dispatched again


class CopyReported(Event, frozen=True, tag=event_type("dispatch", "copy_reported")):
    """What the cluster's actuator sees of a copy it holds (only on a change of phase)."""

    workload: Name
    cluster: Name
    generation: Generation
    phase: CopyPhase
    at: float
    message: Text = ""


class ClusterHeartbeat(Event, frozen=True, tag=event_type("dispatch", "cluster_heartbeat")):
    """A cluster's actuator is answering: its GPU capacity (allocatable GPUs of its nodes), its price,
    the workload kinds its API server serves (a JobSet goes only where JobSet is installed), and the
    load of its own workloads (the dispatcher's queue model adds the copies it sent there)."""

    cluster: Name
    at: float
    capacity_gpus: GpuCount = 0
    price_per_gpu_hour: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    kinds: tuple[Name, ...] = ()  # empty: not said (any kind)
    # the cluster's own Chamber workloads (not dispatched copies, which the dispatcher counts itself):
    # GPUs of those released and not finished, and of those held (waiting for admission there)
    running_gpus: GpuCount = 0
    queued_gpus: GpuCount = 0
