"""Synthetic step tables with known causes, for `bench/fabric.py --steps` and the tests.

These are NOT real traces: a simple model of a synchronous training step (every rank computes, then
the gang's collective waits for the slowest; the step ends for all together), with noise. They check
that the step-table diagnosis tells the cases apart; the thresholds were not fitted to them
(services/perf/steps.py says where they come from).

Model: 32 ranks on 4 nodes x 8 GPUs. Each step, a worker computes `BASE_COMPUTE_S` x its factor x
(1 + N(0, NOISE)) and the whole step is scaled by (1 + U(-NOISE, NOISE)) (step-time noise: 7 % by
default); the ranks of one tensor-parallel worker share one draw (they compute in lockstep). The
step ends at the start + the slowest worker's compute + the collective; `comm_wait_s` is what each
rank waited.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

NODES = 4
GPUS = 8
RANKS = NODES * GPUS
BASE_COMPUTE_S = 8.0
COLLECTIVE_S = 0.5
NOISE = 0.07
STEPS = 60

CASES = (
    *("slow_worker_tp4", "slow_from_step_one", "stage_imbalance", "data_imbalance"),
    *("healthy_tp4", "healthy_dp", "healthy_pp"),
)
EXPECTED = {
    "slow_worker_tp4": "slow_worker",
    "slow_from_step_one": "slow_worker",
    "stage_imbalance": "stage_imbalance",
    "data_imbalance": "data_imbalance",
}


@dataclass(frozen=True)
class StepCase:
    name: str
    seed: int
    onset_step: int  # the step the cause begins (0: from the first step)
    target_ranks: tuple[int, ...]  # the slow worker's ranks (slow_worker cases)
    target_node: str | None
    target_gpus: tuple[int, ...]
    rows: list[dict[str, Any]]

    @property
    def expected(self) -> str | None:
        return EXPECTED.get(self.name)


def _layout(case: str) -> list[dict[str, int]]:
    """Per rank its coordinates: tp4 = 8 data-parallel workers of 4 GPUs; pp = 4 stages of 8."""
    out = []
    for rank in range(RANKS):
        if case in ("slow_worker_tp4", "healthy_tp4"):
            out.append({"dp_rank": rank // 4, "tp_rank": rank % 4, "pp_stage": 0})
        elif case in ("stage_imbalance", "healthy_pp"):
            out.append({"dp_rank": rank % 8, "pp_stage": rank // 8, "tp_rank": 0})
        else:
            out.append({})  # pure data parallel, no coordinates in the table (each rank a worker)
    return out


def make(case: str, seed: int, steps: int = STEPS, noise: float = NOISE) -> StepCase:
    if case not in CASES:
        raise ValueError(f"unknown case {case!r}; one of {', '.join(CASES)}")
    rng = random.Random(f"steps:{case}:{seed}")
    layout = _layout(case)
    onset = 0
    target: tuple[int, ...] = ()
    factor = dict.fromkeys(range(RANKS), 1.0)
    if case == "slow_worker_tp4":
        onset = 20
        worker = rng.randrange(8)
        target = tuple(range(worker * 4, worker * 4 + 4))
    elif case == "slow_from_step_one":
        target = (rng.randrange(RANKS),)
    slow_by = 1.5 if case == "slow_worker_tp4" else 2.35  # 2.35x: the straggler of the real trace
    workers: dict[tuple[int, int], list[int]] = {}
    for rank, c in enumerate(layout):
        key = (c.get("pp_stage", 0), c["dp_rank"]) if "dp_rank" in c else (0, rank)
        workers.setdefault(key, []).append(rank)
    rows = []
    t = 1_780_000_000.0
    for step in range(steps):
        job_noise = 1.0 + rng.uniform(-noise, noise)
        compute: dict[int, float] = {}
        tokens: dict[int, int] = {}
        for key in sorted(workers):
            draw = 1.0 + rng.gauss(0.0, noise)
            work = 1.0
            if case == "data_imbalance":
                # four sequences of 512-4096 tokens per rank: the work follows the tokens
                toks = sum(rng.randint(512, 4096) for _ in range(4))
                work = toks / (4 * 2304)
            for rank in workers[key]:
                f = factor[rank]
                if rank in target and step >= onset:
                    f *= slow_by
                if case == "stage_imbalance" and key[0] == 3:
                    f *= 1.6  # the last stage holds more layers, by configuration
                compute[rank] = BASE_COMPUTE_S * work * f * draw * job_noise
                if case == "data_imbalance":
                    tokens[rank] = round(work * 4 * 2304)
        slowest = max(compute.values())
        end = t + slowest + COLLECTIVE_S
        for rank in range(RANKS):
            row: dict[str, Any] = {
                "job": f"{case}-{seed}",
                "rank": rank,
                "step": step,
                "step_start_s": round(t, 4),
                "step_end_s": round(end, 4),
                "compute_s": round(compute[rank], 4),
                "comm_wait_s": round(end - t - compute[rank], 4),
                "node": f"node-{rank // GPUS}",
                "gpu_index": rank % GPUS,
                **layout[rank],
            }
            if rank in tokens:
                row["tokens"] = tokens[rank]
            rows.append(row)
        t = end
    node = f"node-{target[0] // GPUS}" if target else None
    return StepCase(case, seed, onset, target, node, tuple(r % GPUS for r in target), rows)
