"""What the engine and the policies share: jobs in flight, and the decisions a policy returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.tracesim.trace import TraceJob


@dataclass
class SimJob:
    t: TraceJob
    done_work_s: float = 0.0  # progress kept (checkpointed), in seconds of running
    run_start: float | None = None
    first_start: float | None = None
    end: float | None = None
    placement: dict[int, int] = field(default_factory=dict)  # node -> GPUs held
    preemptions: int = 0
    requeues: int = 0
    run_gpu_s: float = 0.0  # GPU-seconds consumed, including work later lost
    lost_gpu_s: float = 0.0
    lost_to_faults_gpu_s: float = 0.0  # the part lost when a node failed under the job
    hang_gpu_s: float = 0.0  # of which held idle until a collective timed out (tracesim/faults.py)
    fault_moves: int = 0  # times moved off a node on a fault's precursor, before it failed
    # What the same faults would have cost this job had the scheduler waited for each failure (the
    # work since the checkpoint at the failure, plus the hang): the paired comparison (faults.py)
    waiting_cost_gpu_s: float = 0.0
    token: int = 0  # bumps on every stop, so a stale finish event is ignored
    # Every stretch in the queue, not only the first: after a preemption or a fault the job waits
    # again, and a wait counted to the first start alone makes preemption look free.
    queued_s: float = 0.0
    queued_since: float | None = None

    @property
    def running(self) -> bool:
        return self.run_start is not None

    @property
    def remaining_s(self) -> float:
        return self.t.duration_s - self.done_work_s


@dataclass(frozen=True)
class Start:
    job_id: str
    placement: dict[int, int]  # node -> GPUs


@dataclass(frozen=True)
class Stop:
    job_id: str
    cause: str  # preempted | requeued


Action = Start | Stop
