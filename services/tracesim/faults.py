"""What a node fault costs the jobs under it, moving them on a warning or waiting for the failure.

The engine (engine.py) plans node faults as a seeded Poisson process (`--fault-rate` per node-day, a
4 h repair). With a `FaultModel`, each fault also draws (from its own seeded stream, so the fault times
do not change) whether it has a detectable precursor: its jobs slow down `lead_s` before the node
fails, the way a degrading link, a throttling GPU or an erroring NIC slows a gang first.

- proactive (`proactive=True`, what Chamber does): the perf service sees the slowdown `detection_s`
  after it starts (bench/fabric.py measures that delay), health takes the node out, and the scheduler
  moves its jobs at once. A moved job restarts from its last periodic checkpoint: it loses the work
  since then (conservative: a job that honours the checkpoint signal loses less). A fault without a
  precursor is a failure, as below.
- waiting (`proactive=False`): the node fails under the job; the job loses the work since its last
  checkpoint and, before anyone restarts it, hangs until the collective times out (`hang_s`, its GPUs
  held and idle).

Assumptions, all flags of `chamber sim`: `precursor_share` is not measured anywhere we could cite; it
is a knob (the result at 0 is no saving, at 1 the ceiling). A job without a checkpoint interval in the
trace checkpoints every `checkpoint_s` (the ITP trace has none; 0 = such jobs lose everything). The
hang is counted as lost GPU-time, but the simulated schedule frees the GPUs at the failure, so the
queueing cost of a hang is not in the figures: the waiting side is a lower bound. The restart itself
costs both sides alike and is left out. The precursor's slowdown (at most `lead_s`) is not charged
to the waiting side either.
"""

from __future__ import annotations

from dataclasses import dataclass

# bench/fabric.py, 36 scenarios at 1 Hz: detection p99 9.8 s (README, "Fabric and job slowdowns")
DETECTION_S = 10.0
HANG_S = 1800.0  # torch.distributed's default NCCL timeout (30 min), as bench/fabric.py assumes
CHECKPOINT_S = 3600.0  # bench/fabric.py's checkpoint interval, for jobs whose trace row has none
LEAD_S = 600.0  # a precursor's slowdown starts 10 min before the failure
PRECURSOR_SHARE = 0.3


@dataclass(frozen=True)
class FaultModel:
    precursor_share: float = PRECURSOR_SHARE
    lead_s: float = LEAD_S
    detection_s: float = DETECTION_S
    hang_s: float = HANG_S
    checkpoint_s: float = CHECKPOINT_S
    proactive: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.precursor_share <= 1.0:
            raise ValueError("the precursor share must be between 0 and 1")
        for name in ("lead_s", "detection_s", "hang_s", "checkpoint_s"):
            value = getattr(self, name)
            if not 0.0 <= value < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds, 0 or more")

    @property
    def warns(self) -> bool:
        """Whether a precursor leads to a move before the failure at all."""
        return self.proactive and self.lead_s > self.detection_s

    def describe(self) -> dict[str, float | bool]:
        return {
            "precursor_share": self.precursor_share,
            "precursor_lead_s": self.lead_s,
            "detection_s": self.detection_s,
            "hang_timeout_s": self.hang_s,
            "default_checkpoint_s": self.checkpoint_s,
        }
