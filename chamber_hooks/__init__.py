"""chamber_hooks: per-rank step timings from a PyTorch training loop, for Chamber's slow-job diagnosis.

Importable on its own: it needs nothing else from Chamber and imports torch only when asked to wait
for the GPU (`cuda_sync=True`), so a training image can vendor this one file. It writes the step table
of docs/perf-steps.md as JSON lines, one per rank and step; the Chamber agent on the node tails that
file (`chamber agent --step-log JOB=PATH`) and publishes it, and `chamber perf replay --steps FILE`
reads it offline.

    from chamber_hooks import StepLog

    log = StepLog("/scratch/steps-rank{rank}.jsonl", dp_rank=dp, pp_stage=pp, tp_rank=tp)
    for step, batch in enumerate(loader):
        with log.step(step, tokens=batch["input_ids"].numel()):
            loss = model(batch).loss
            loss.backward()
            with log.comm():          # time blocked on peers (optional)
                torch.distributed.all_reduce(grad_norm)
            optimizer.step()

Rank, GPU and job come from the launcher's environment (torchrun: RANK, LOCAL_RANK; Chamber:
CHAMBER_JOB_ID; Slurm: SLURM_PROCID, SLURM_LOCALID, SLURM_JOB_ID) unless given; the node from
NODE_NAME (a pod's spec.nodeName through the downward API), when set.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

__all__ = ["StepLog"]


def _env_int(*names: str) -> int | None:
    for n in names:
        v = os.environ.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


class StepLog:
    """One rank's step log. `path` may contain `{rank}`; `None` keeps rows in `rows` only (tests)."""

    def __init__(
        self,
        path: str | None = None,
        *,
        job: str | None = None,
        rank: int | None = None,
        gpu_index: int | None = None,
        node: str | None = None,
        dp_rank: int | None = None,
        pp_stage: int | None = None,
        tp_rank: int | None = None,
        cp_rank: int | None = None,
        cuda_sync: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.job = job or os.environ.get("CHAMBER_JOB_ID") or os.environ.get("SLURM_JOB_ID") or "job"
        self.rank = rank if rank is not None else (_env_int("RANK", "SLURM_PROCID") or 0)
        self.gpu_index = gpu_index if gpu_index is not None else _env_int("LOCAL_RANK", "SLURM_LOCALID")
        # The node's name as Chamber knows it: a pod gets it from the downward API (spec.nodeName), so
        # that an agent tailing a shared file system publishes only its own node's ranks.
        self.node = node or os.environ.get("NODE_NAME") or None
        self.coords = {"dp_rank": dp_rank, "pp_stage": pp_stage, "tp_rank": tp_rank, "cp_rank": cp_rank}
        self.cuda_sync = cuda_sync
        self.clock = clock
        self.rows: list[dict[str, Any]] = []
        self._fh: IO[str] | None = None
        if path is not None:
            self._fh = open(path.format(rank=self.rank), "a", buffering=1)  # noqa: SIM115 (kept open: one line a step)
        self._comm_s = 0.0

    def _sync(self) -> None:
        """Wait for the GPU so the step's end is when its kernels finished, not when they were queued."""
        if self.cuda_sync:
            import torch  # type: ignore[import-not-found]  # only here, and not a Chamber dependency

            if torch.cuda.is_available():
                torch.cuda.synchronize()

    @contextmanager
    def comm(self) -> Iterator[None]:
        """Time inside this block counts as waiting on peers (comm_wait_s)."""
        self._sync()
        start = self.clock()
        try:
            yield
        finally:
            self._sync()
            self._comm_s += self.clock() - start

    @contextmanager
    def step(self, step: int, *, tokens: int | None = None, microbatches: int | None = None) -> Iterator[None]:
        """One training step; compute_s is the step less the time spent in `comm()` blocks."""
        self._sync()
        self._comm_s = 0.0
        start = self.clock()
        try:
            yield
        finally:
            self._sync()
            end = self.clock()
            wait = self._comm_s
            self.record(
                step,
                start,
                end,
                compute_s=max(0.0, end - start - wait),
                comm_wait_s=wait,
                tokens=tokens,
                microbatches=microbatches,
            )

    def record(
        self,
        step: int,
        start: float,
        end: float,
        *,
        compute_s: float | None = None,
        comm_wait_s: float | None = None,
        tokens: int | None = None,
        microbatches: int | None = None,
    ) -> dict[str, Any]:
        """One row of the step table (for loops that time steps themselves)."""
        row: dict[str, Any] = {
            "job": self.job,
            "rank": self.rank,
            "step": step,
            "step_start_s": start,
            "step_end_s": end,
        }
        extra = {
            "compute_s": compute_s,
            "comm_wait_s": comm_wait_s,
            **self.coords,
            "node": self.node,
            "gpu_index": self.gpu_index,
            "tokens": tokens,
            "microbatches": microbatches,
        }
        row.update({k: v for k, v in extra.items() if v is not None})
        self.rows.append(row)
        del self.rows[:-1000]
        if self._fh is not None:
            self._fh.write(json.dumps(row) + "\n")
        return row

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
