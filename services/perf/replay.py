"""`chamber perf replay`: a step table (CSV, Parquet or JSONL) through the live perf and health cores on a
virtual clock: the verdicts, straggler faults and isolations the live services would have produced.

Reading (docs/perf-steps.md, "The step table"): required `job`, `rank`, `step`, `step_start_s`,
`step_end_s`; recommended `compute_s`, `comm_wait_s`; optional `dp_rank`, `pp_stage`, `tp_rank`,
`cp_rank`, `node`, `gpu_index`, `tokens`, `microbatches`. Without `node`, rank r runs on node
`node-<r // gpus_per_node>`, GPU `r % gpus_per_node` (the order torchrun and Slurm place ranks in).

Replaying: each job is scheduled on the nodes its ranks name; every step's rows are published per node
as a `RankStepTimings` at the step's end, as a hook would, then the perf core decides, its straggler
faults go to the health core with the default policy, and health decides. The clock is the table's.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events.base import Event
from events.fabric import JobSlowdownCleared, JobSlowdownDetected
from events.faults import GpuFaultDetected
from events.fleet import NodeDiscovered
from events.jobs import JobScheduled, Placement
from events.steps import RankStep, RankStepTimings
from events.telemetry import GpuInfo
from services.health import core as health
from services.health.policy import load_policy
from services.perf import core as perf

CLUSTER = "replay"
REQUIRED = ("job", "rank", "step", "step_start_s", "step_end_s")
FLOATS = ("step_start_s", "step_end_s", "compute_s", "comm_wait_s")
INTS = ("rank", "step", "dp_rank", "pp_stage", "tp_rank", "cp_rank", "gpu_index", "tokens", "microbatches")
OPTIONAL = (
    *("compute_s", "comm_wait_s", "dp_rank", "pp_stage", "tp_rank", "cp_rank"),
    *("gpu_index", "tokens", "microbatches", "node"),
)


class StepTableError(ValueError):
    """A step table that cannot be read; the message names the file, row and column."""


@dataclass(frozen=True)
class Row:
    job: str
    node: str | None
    step: RankStep


def read_table(path: Path) -> list[dict[str, Any]]:
    """The file's rows as dicts, by its suffix: .csv, .parquet / .pq, .jsonl / .ndjson / .json."""
    if not path.is_file():
        raise StepTableError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="") as fh:
            return [{k: v for k, v in r.items() if v not in ("", None)} for r in csv.DictReader(fh)]
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as err:  # pyarrow raises its own types for a broken file
            raise StepTableError(f"{path}: not a Parquet file ({err})") from None
        return [{k: v for k, v in r.items() if v is not None} for r in table.to_pylist()]
    if suffix in (".jsonl", ".ndjson", ".json"):
        out = []
        for i, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError as err:
                raise StepTableError(f"{path}:{i}: not JSON ({err})") from None
            if not isinstance(doc, dict):
                raise StepTableError(f"{path}:{i}: each line must be a JSON object")
            out.append(doc)
        return out
    raise StepTableError(f"{path}: unknown format {suffix!r} (use .csv, .parquet or .jsonl)")


def parse_rows(raw: Iterable[dict[str, Any]], where: str = "table") -> list[Row]:
    """Typed rows; a missing required column or a value of the wrong type is a StepTableError."""
    out = []
    for i, r in enumerate(raw, start=1):
        missing = [c for c in REQUIRED if c not in r]
        if missing:
            raise StepTableError(f"{where}: row {i} lacks {', '.join(missing)} (required: {', '.join(REQUIRED)})")
        values: dict[str, Any] = {}
        for col in (*FLOATS, *INTS):
            if col not in r:
                continue
            try:
                value = float(r[col])
            except (TypeError, ValueError):
                raise StepTableError(f"{where}: row {i}, column {col}: {r[col]!r} is not a number") from None
            if not math.isfinite(value):
                raise StepTableError(f"{where}: row {i}, column {col}: {r[col]!r} is not finite")
            if col in INTS:
                if value != int(value):
                    raise StepTableError(f"{where}: row {i}, column {col}: {r[col]!r} is not a whole number")
                values[col] = int(value)
            else:
                values[col] = value
        if values["step_end_s"] < values["step_start_s"]:
            raise StepTableError(f"{where}: row {i}: step_end_s is before step_start_s")
        node = r.get("node")
        out.append(Row(str(r["job"]), str(node) if node is not None else None, RankStep(**values)))
    return out


@dataclass
class ReplayResult:
    verdicts: list[JobSlowdownDetected] = field(default_factory=list)
    cleared: list[JobSlowdownCleared] = field(default_factory=list)
    stragglers: list[GpuFaultDetected] = field(default_factory=list)
    isolations: list[health.Decision] = field(default_factory=list)
    steps: int = 0
    jobs: list[str] = field(default_factory=list)
    state: perf.PerfState | None = None

    def to_json(self) -> dict[str, Any]:
        import msgspec

        return {
            "jobs": self.jobs,
            "steps": self.steps,
            "verdicts": [msgspec.to_builtins(v) for v in self.verdicts],
            "cleared": [msgspec.to_builtins(v) for v in self.cleared],
            "straggler_faults": [msgspec.to_builtins(f) for f in self.stragglers],
            "isolations": [
                {"action": d.action, "node": d.node, "gpu": d.gpu_index, "reason": d.reason} for d in self.isolations
            ],
        }


def replay(rows: list[Row], *, job: str | None = None, gpus_per_node: int = 8) -> ReplayResult:
    """Run the rows through the perf and health cores; deterministic for the same rows."""
    if gpus_per_node < 1:
        raise StepTableError("--gpus-per-node must be at least 1")
    if job is not None:
        rows = [r for r in rows if r.job == job]
        if not rows:
            raise StepTableError(f"no rows for job {job!r}")
    if not rows:
        raise StepTableError("the table has no rows")
    placed = [(r, _node_of(r, gpus_per_node)) for r in rows]
    pstate = perf.PerfState()
    hstate = health.new_state(load_policy())
    result = ReplayResult(state=pstate)
    start = min(r.step.step_start_s for r in rows)
    nodes: dict[str, set[int]] = {}
    jobs: dict[str, dict[str, set[int]]] = {}
    for r, node in placed:
        gpu = r.step.gpu_index if r.step.gpu_index is not None else r.step.rank % gpus_per_node
        nodes.setdefault(node, set()).add(gpu)
        jobs.setdefault(r.job, {}).setdefault(node, set()).add(gpu)
    for node in sorted(nodes):
        count = max(gpus_per_node, max(nodes[node]) + 1)
        gpus = [GpuInfo(index=i, uuid=f"GPU-{node}-{i}", model="unknown") for i in range(count)]
        health.evolve(hstate, NodeDiscovered(cluster=CLUSTER, node=node, at=start, gpus=gpus))
    for name in sorted(jobs):
        placements = [
            Placement(cluster=CLUSTER, node=n, gpu_indices=sorted(range(max(gpus_per_node, max(g) + 1))))
            for n, g in sorted(jobs[name].items())
        ]
        perf.evolve(pstate, JobScheduled(job_id=name, at=start, team="replay", placements=placements, pool="default"))
    result.jobs = sorted(jobs)
    # one batch per (step end, job, node): what a hook on that node publishes when its ranks finish
    batches: dict[tuple[int, str, str], list[RankStep]] = {}
    for r, node in placed:
        batches.setdefault((r.step.step, r.job, node), []).append(r.step)
    order = sorted(batches, key=lambda k: (max(s.step_end_s for s in batches[k]), k))
    result.steps = len({k[0] for k in batches})
    for step, name, node in order:
        rows_now = sorted(batches[(step, name, node)], key=lambda s: s.rank)
        t = max(s.step_end_s for s in rows_now)
        perf.evolve(
            pstate,
            RankStepTimings(cluster=CLUSTER, node=node, job_id=name, observed_at=t, steps=rows_now, source="replay"),
        )
        _decide(pstate, hstate, t, result)
    return result


def _decide(pstate: perf.PerfState, hstate: health.HealthState, t: float, result: ReplayResult) -> None:
    faults: list[Event] = []
    for event, _ in perf.decide(pstate, t):
        perf.evolve(pstate, event)
        if isinstance(event, JobSlowdownDetected):
            result.verdicts.append(event)
        elif isinstance(event, JobSlowdownCleared):
            result.cleared.append(event)
        elif isinstance(event, GpuFaultDetected):
            result.stragglers.append(event)
            faults.append(event)
    for f in faults:
        health.evolve(hstate, f)
    for d in health.decide(hstate, t):
        health.evolve(hstate, d)
        if d.action in ("isolate_gpu", "isolate_node", "hold"):
            result.isolations.append(d)


def _node_of(r: Row, gpus_per_node: int) -> str:
    return r.node if r.node is not None else f"node-{r.step.rank // gpus_per_node}"


def summary_lines(result: ReplayResult) -> list[str]:
    """What `chamber perf replay` prints: per verdict its cause and culprit, then faults and isolations."""
    lines = [f"replayed {result.steps} steps of {len(result.jobs)} job(s): {', '.join(result.jobs)}"]
    if not result.verdicts:
        lines.append("no slowdown verdict: every worker kept pace with its peers")
    for v in result.verdicts:
        where = ""
        if v.node:
            gpus = ",".join(str(g) for g in v.gpu_indices) if v.gpu_indices else str(v.gpu_index)
            where = f" on {v.node} GPU{'s' if len(v.gpu_indices) > 1 else ''} {gpus}"
            where += f" NIC {v.nic}" if v.nic else ""
        cause = v.pattern or v.culprit.value
        lines.append(f"{v.job_id}: {cause.upper()} (culprit {v.culprit.value}{where}) score {v.score:.2f}")
        lines.append(f"   {v.reason}")
    for c in result.cleared:
        lines.append(f"{c.job_id}: episode {c.episode} cleared ({c.reason})")
    lines.append(f"straggler faults: {len(result.stragglers)}")
    for f in result.stragglers:
        lines.append(f"   {f.fault_id} {f.node} GPU {f.gpu_index}")
    lines.append(f"isolations: {len(result.isolations)}")
    for d in result.isolations:
        lines.append(f"   {d.action} {d.node}{'' if d.gpu_index is None else f' GPU {d.gpu_index}'}: {d.reason}")
    return lines
