"""What training jobs themselves report: per-rank step timings (docs/perf-steps.md, "The step table").

One `RankStepTimings` carries the steps some ranks of one job finished on one node since the last
event (a training-loop hook publishes it, `chamber_hooks`, or the agent tailing the job's JSONL step
log). Times are seconds on one clock that the job's ranks share (the nodes' synchronised wall clock
is enough: only durations and per-step order are compared). `compute_s` is the GPU compute time
within the step and `comm_wait_s` the time blocked on peers; either lets the perf service tell a
slow rank from one that waits for it. Optional parallel coordinates say who are peers: ranks with
the same `pp_stage` (and `cp_rank`) and a different `dp_rank` do the same work on other data.
"""

from __future__ import annotations

import msgspec

from events.base import Event, Name, event_type


class RankStep(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One rank's one step. `rank` is the global rank; `gpu_index` the GPU on its node (None: taken
    from the job's placement, `rank % gpus-on-the-node`)."""

    rank: int
    step: int
    step_start_s: float
    step_end_s: float
    compute_s: float | None = None
    comm_wait_s: float | None = None
    dp_rank: int | None = None
    pp_stage: int | None = None
    tp_rank: int | None = None
    cp_rank: int | None = None
    gpu_index: int | None = None
    tokens: int | None = None
    microbatches: int | None = None


class RankStepTimings(Event, frozen=True, tag=event_type("telemetry", "rank_step_timings")):
    """Steps finished by ranks of `job_id` running on `node` (published on
    `chamber.telemetry.steps.<cluster>.<node>`)."""

    cluster: Name
    node: Name
    job_id: Name
    observed_at: float
    steps: list[RankStep]
    source: str = ""  # hook | log | replay: who read the timings (for `chamber explain`)


class StepLogEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A step log a running job names (the workload's `chamber.io/step-log` annotation), for the agent
    of one of its nodes: the value of key `<cluster>.<node>.<job>` in the KV bucket `chamber_step_logs`
    (services/scheduler/step_logs.py writes it, node_agent/step_log_watch.py reads it). `path` is on
    the node and may hold `{rank}` (one file per rank); `gpu_indices` are the job's GPUs there."""

    job: str
    path: str
    gpu_indices: list[int] = []


def step_log_key(cluster: str, node: str, job: str) -> str:
    from events import subjects  # subjects imports this module

    return f"{subjects.token(cluster)}.{subjects.token(node)}.{subjects.token(job)}"


def step_log_keys_of(cluster: str, node: str | None) -> str:
    """One node's keys (None: every node of the cluster), as a KV key filter."""
    from events import subjects

    return f"{subjects.token(cluster)}.{subjects.token(node) if node is not None else '*'}.>"


def step_log_consumer(node: str) -> str:
    """The one consumer an agent reads its node's keys through (its NATS role allows no other)."""
    from events import subjects

    return f"steplogs-{subjects.token(node)}"
