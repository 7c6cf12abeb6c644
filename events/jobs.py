"""A job's life: submitted, scheduled, started, preempted/suspended/resumed, requeued, finished."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import msgspec

from events.base import Event, Name, event_type
from events.names import GpusPerReplica, Label, Model, Replicas, Seconds, SecondsOrZero, Team, Text


class PriorityClass(StrEnum):
    """Ordered from most to least urgent; `rank` gives the sort key. `serving` is the class of the
    replicas of a serving workload (a Kubernetes Deployment, StatefulSet or LeaderWorkerSet); it ranks
    with `high` (its guaranteed replicas preempt normal and low work), and its replicas up to the
    workload's minimum are non-preemptible (services/scheduler/serving.py)."""

    CRITICAL = "critical"
    SERVING = "serving"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        # keyed by the value: a str hashes in C, an Enum member through Python (read on every
        # scheduling hot path)
        return _PRIORITY_RANK[self._value_]


_PRIORITY_RANK = {"critical": 0, "serving": 1, "high": 1, "normal": 2, "low": 3}


class PreemptionReason(StrEnum):
    PRIORITY = "priority"  # higher priority work of the same team
    RECLAIM = "reclaim"  # a lender takes back capacity that was borrowed
    CRITICAL = "critical"  # critical work across teams
    OPERATOR = "operator"
    IDLE = "idle"  # it held its GPUs idle past its team's idle policy (services/idle)


class ServingReplica(msgspec.Struct, frozen=True, kw_only=True):
    """The serving workload a job is one replica of: `workload` is `<kind>/<name>` (kind lower-case:
    deployment, statefulset, leaderworkerset) in the job's cluster and namespace; `replica` its ordinal,
    counted from 0 (the StatefulSet pod ordinal, the LeaderWorkerSet group index)."""

    workload: Name
    replica: Annotated[int, msgspec.Meta(ge=0, le=100_000)]


class ShareMode(StrEnum):
    """How jobs that share one GPU share it; jobs of different modes never share a GPU."""

    TIME_SLICING = "time-slicing"  # the device plugin's time-slicing (no memory isolation)
    MPS = "mps"  # CUDA MPS (an SM share and a memory limit per client)
    MIG = "mig"  # a MIG instance: hardware partition of the GPU (`mig_profile`)


ShareMilliAsked = Annotated[int, msgspec.Meta(ge=0, le=1000)]
MemoryMib = Annotated[int, msgspec.Meta(ge=0, le=1 << 24)]
CpuMilli = Annotated[int, msgspec.Meta(ge=0, le=1 << 24)]  # milli-CPUs of a host (up to ~16,000 CPUs)
HostMemoryMib = Annotated[int, msgspec.Meta(ge=0, le=1 << 28)]  # MiB of a host's memory (up to 256 TiB)


class GpuShare(msgspec.Struct, frozen=True, kw_only=True):
    """Part of one GPU per replica: a fraction (`gpu_milli` of 1000, optionally `memory_mib` of the GPU's
    memory) shared by `mode`, or one MIG instance of `mig_profile` (mode MIG, its share from the profile)."""

    gpu_milli: ShareMilliAsked = 0
    memory_mib: MemoryMib = 0
    mode: ShareMode = ShareMode.TIME_SLICING
    mig_profile: Name | None = None


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What was asked for: a gang of `replicas` x `gpus_per_replica` GPUs, all or nothing. With `share`,
    each replica takes part of one GPU instead (`gpus_per_replica` is 1)."""

    team: Team
    gpus_per_replica: GpusPerReplica
    replicas: Replicas = 1
    priority: PriorityClass = PriorityClass.NORMAL
    name: Label = ""
    pool: Name | None = None
    gpu_model: Model | None = None
    preemptible: bool = True
    checkpoint_interval_s: Seconds | None = None
    expected_duration_s: Seconds | None = None  # the user's estimate, used for backfill reservations
    sim_duration_s: SecondsOrZero | None = None  # simulated fleet only: completes after this much running time
    namespace: Name | None = None  # Kubernetes Job reference, when the job came from the cluster
    topology_key: Name | None = None  # node label whose value names a topology domain (e.g. rack)
    cluster: Name | None = None  # run within this cluster only (None: any one cluster of the fleet)
    gpu_vendor: Name | None = None  # "nvidia" | "amd": only GPUs of this vendor (what a pod's resource asks)
    serving: ServingReplica | None = None  # a replica of a serving workload (class serving)

    share: GpuShare | None = None  # part of one GPU per replica (a fraction or a MIG instance)
    cpu_milli: CpuMilli | None = None  # CPU each replica needs of its node, milli-CPUs (None: not asked)
    memory_mib: HostMemoryMib | None = None  # host memory each replica needs, MiB (None: not asked)

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas


ShareMilli = Annotated[int, msgspec.Meta(ge=1, le=1000)]


# gc=False: a placement holds strings, numbers and a list of ints, so it can never be part of a
# reference cycle; a first cycle at 50,000 nodes makes ~95,000 that the collector no longer walks.
class Placement(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """GPUs held on one node: whole GPUs, or a share of each (`share_milli` < 1000: a fraction of a
    GPU, or a MIG instance `mig_profile` starting at memory slice `mig_start`)."""

    cluster: Name
    node: Name
    gpu_indices: list[int]
    # What the job holds of each GPU in milli-GPU-equivalents (quota and billing count this): a
    # fraction by its share, a MIG instance by the mean of its compute and memory fractions.
    share_milli: ShareMilli = 1000
    mig_profile: str | None = None
    mig_start: int | None = None

    @property
    def gpu_equivalents(self) -> float:
        """What quotas count: whole GPUs as 1 each, shares by their share."""
        return len(self.gpu_indices) * self.share_milli / 1000


class JobSubmitted(Event, frozen=True, tag=event_type("jobs", "submitted")):
    job_id: Name
    at: float
    spec: JobSpec


class JobScheduled(Event, frozen=True, tag=event_type("jobs", "scheduled", 2)):
    """v2: `pool` is required. v1 bodies (pool missing in the oldest) are upcast by the codec
    (events/upcast.py)."""

    job_id: Name
    at: float
    team: Team
    placements: list[Placement]
    # The pool the job was admitted in: folding never asks another stream's state for it.
    pool: str
    reason: str = ""
    borrowed_gpus: float = 0  # GPU-equivalents with shares


class JobStarted(Event, frozen=True, tag=event_type("jobs", "started")):
    job_id: Name
    at: float


class JobPreempted(Event, frozen=True, tag=event_type("jobs", "preempted")):
    job_id: Name
    at: float
    team: Team
    reason: PreemptionReason
    preemptor_job_id: Name | None = None
    lost_work_gpu_s: float = 0.0
    detail: str = ""


class JobSuspended(Event, frozen=True, tag=event_type("jobs", "suspended")):
    job_id: Name
    at: float
    reason: str = ""


class JobResumed(Event, frozen=True, tag=event_type("jobs", "resumed", 2)):
    """v2: `pool` is required; v1 bodies are upcast by the codec (events/upcast.py)."""

    job_id: Name
    at: float
    placements: list[Placement]
    # The pool the job was admitted in: folding never asks another stream's state for it.
    pool: str
    reason: str = ""
    borrowed_gpus: float = 0  # GPU-equivalents with shares


class JobRequeued(Event, frozen=True, tag=event_type("jobs", "requeued")):
    """Put back in the queue because its node or GPU was isolated or lost."""

    job_id: Name
    at: float
    reason: str
    node: Name | None = None
    fault_ids: list[str] = []


class JobCompleted(Event, frozen=True, tag=event_type("jobs", "completed")):
    job_id: Name
    at: float


class JobFailed(Event, frozen=True, tag=event_type("jobs", "failed")):
    job_id: Name
    at: float
    reason: str
    exit_code: int | None = None


class JobCancelled(Event, frozen=True, tag=event_type("jobs", "cancelled")):
    job_id: Name
    at: float
    by: Text = ""
    reason: Text = ""
