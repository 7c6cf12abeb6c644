"""Pure mapping from recorded events to warehouse rows, column by column (Arrow tables).

No I/O here: the shell hands in what it consumed and inserts what comes out. Every row carries the
event id it came from, so the writer can drop rows a crashed predecessor already stored.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, cast

import msgspec
import numpy as np
import pyarrow as pa

from events import (
    BudgetSet,
    CostAccrued,
    Event,
    GpuIsolated,
    GpuRestored,
    GpuSample,
    JobPreempted,
    JobScheduled,
    JobSubmitted,
    NodeDiscovered,
    NodeInventory,
    NodeIsolated,
    NodeRestored,
    NodeSample,
    NodeUpdated,
    PoolDefined,
    PriceSet,
)
from events.dispatch import ClusterHeartbeat
from events.fabric import FabricSample
from events.jobs import JobResumed
from events.steps import RankStepTimings
from services.recorder.fabric_rows import NIC_SAMPLES, add_nic_rows

TS = pa.timestamp("ms", tz="UTC")
F32 = pa.float32()
_encoder = msgspec.json.Encoder()

# Tables whose rows are facts with an event id (checked on redelivery), in insert order.
ID_TABLES = ("gpu_samples", "job_events", "fleet_events", "prices", "budgets", "cost_ledger", "events")
# Latest-state tables (ReplacingMergeTree with a version): a repeated row is harmless under FINAL.
STATE_TABLES = ("gpu_inventory", "pools")

SAMPLE_FLOATS = (
    "utilization_pct",
    "memory_utilization_pct",
    "sm_activity_pct",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "power_limit_w",
    "temperature_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
)
SAMPLE_INTS = ("ecc_sbe_volatile", "ecc_dbe_volatile", "pcie_replay_count")

_JOB_KINDS = {
    "io.chamber.jobs.submitted.v1": "submitted",
    "io.chamber.jobs.scheduled.v2": "scheduled",  # v1 is upcast to v2 by the codec
    "io.chamber.jobs.started.v1": "started",
    "io.chamber.jobs.preempted.v1": "preempted",
    "io.chamber.jobs.suspended.v1": "suspended",
    "io.chamber.jobs.resumed.v2": "resumed",  # v1 is upcast to v2 by the codec
    "io.chamber.jobs.requeued.v1": "requeued",
    "io.chamber.jobs.completed.v1": "completed",
    "io.chamber.jobs.failed.v1": "failed",
    "io.chamber.jobs.cancelled.v1": "cancelled",
}


@dataclass(frozen=True)
class Recorded:
    """One consumed event with where it came from."""

    event: Event | LeanNodeSample
    id: str
    source: str
    time: str
    stream: str
    subject: str
    stream_seq: int


def _ms(ts: float) -> int:
    return round(ts * 1000)


def event_time(event: Event) -> float:
    """The time the event is about: `at`, else `observed_at`, else the period start."""
    for name in ("at", "observed_at", "period_start"):
        value = getattr(event, name, None)
        if isinstance(value, int | float):
            return float(value)
    return 0.0


class _Columns:
    def __init__(self) -> None:
        self.data: dict[str, list[Any]] = defaultdict(list)

    def add(self, **values: Any) -> None:
        for name, value in values.items():
            self.data[name].append(value)


# (warehouse column, GpuSample field): attrgetter works on GpuSample and LeanGpuSample alike.
_GPU_FIELDS = (
    ("gpu_index", "index"),
    ("gpu_uuid", "uuid"),
    ("throttle_reasons", "throttle_reasons"),
    *((name, name) for name in (*SAMPLE_FLOATS, *SAMPLE_INTS)),
)


# gc=False: a lean sample holds only strings, numbers and lists of those, so it can never be part of a
# reference cycle; untracked, the ~16,000 objects of one batch no longer trigger (and slow down) the
# cyclic garbage collector, which made decoding and column building about twice as slow.
class LeanGpuSample(msgspec.Struct, gc=False):
    """The GpuSample fields the warehouse stores; decoding into this skips the rest (NVLink, processes)."""

    index: int
    uuid: str
    utilization_pct: float | None = None
    memory_utilization_pct: float | None = None
    sm_activity_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle_reasons: list[str] = []
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    pcie_replay_count: int | None = None


class LeanNodeSample(msgspec.Struct, gc=False):
    """A NodeSample as the recorder reads it: about five times cheaper to decode than the full event."""

    cluster: str
    node: str
    seq: int
    observed_at: float
    interval_s: float
    gpus: list[LeanGpuSample]


assert set(LeanGpuSample.__struct_fields__) <= set(GpuSample.__struct_fields__)
assert set(LeanNodeSample.__struct_fields__) <= set(NodeSample.__struct_fields__)
_SAMPLE_TYPES: dict[str, pa.DataType] = {
    "gpu_index": pa.uint16(),
    "gpu_uuid": pa.string(),
    "throttle_reasons": pa.list_(pa.string()),
    **{name: F32 for name in SAMPLE_FLOATS},
    **{name: pa.int64() for name in SAMPLE_INTS},
}


def sample_columns(items: list[Recorded]) -> pa.Table | None:
    """One row per GPU per NodeSample. Each column is one `map(attrgetter(field), gpus)` in C over the
    batch's GPUs, instead of a Python loop over every field of every GPU."""
    gpus: list[Any] = []
    extend = gpus.extend
    counts: list[int] = []
    # the caller hands only node samples (build_tables selects them)
    samples = cast("list[NodeSample | LeanNodeSample]", [i.event for i in items])
    for sample in samples:
        extend(sample.gpus)
        counts.append(len(sample.gpus))
    if not gpus:
        return None
    # Per-sample values are built once per message and repeated per GPU by Arrow, not by Python.
    parent = pa.array(np.repeat(np.arange(len(items)), counts))
    per_sample: dict[str, tuple[list[Any], pa.DataType]] = {
        "cluster": ([s.cluster for s in samples], pa.string()),
        "node": ([s.node for s in samples], pa.string()),
        "ts": ([_ms(s.observed_at) for s in samples], TS),
        "interval_s": ([s.interval_s for s in samples], F32),
        "seq": ([s.seq for s in samples], pa.uint64()),
        "event_id": ([i.id for i in items], pa.string()),
    }
    columns: dict[str, pa.Array] = {
        name: pa.array(values, dtype).take(parent) for name, (values, dtype) in per_sample.items()
    }
    for name, field in _GPU_FIELDS:
        columns[name] = pa.array(list(map(attrgetter(field), gpus)), _SAMPLE_TYPES[name])
    return pa.table(columns)


def _audit_row(out: _Columns, item: Recorded, e: Event) -> None:
    out.add(
        event_id=item.id,
        type=type(e).ce_type(),
        stream=item.stream,
        subject=item.subject,
        stream_seq=item.stream_seq,
        source=item.source,
        ce_time=item.time,
        at=_ms(event_time(e)),
        team=getattr(e, "team", None) or (e.spec.team if isinstance(e, JobSubmitted) else ""),
        job_id=getattr(e, "job_id", None) or "",
        cluster=getattr(e, "cluster", ""),
        node=getattr(e, "node", ""),
        body=_encoder.encode(e).decode(),
    )


def _job_row(out: _Columns, item: Recorded, e: Event) -> None:
    team = pool = model = priority = ""
    requested = 0
    gpus: list[dict[str, Any]] = []
    if isinstance(e, JobSubmitted):
        team, pool, model = e.spec.team, e.spec.pool or "", e.spec.gpu_model or ""
        priority, requested = str(e.spec.priority), e.spec.total_gpus
    elif isinstance(e, JobScheduled | JobResumed):
        team = e.team if isinstance(e, JobScheduled) else ""
        gpus = [{"cluster": p.cluster, "node": p.node, "gpu_index": i} for p in e.placements for i in p.gpu_indices]
    elif isinstance(e, JobPreempted):
        team = e.team
    out.add(
        event_id=item.id,
        job_id=getattr(e, "job_id", ""),  # every job kind has one
        kind=_JOB_KINDS[type(e).ce_type()],
        at=_ms(event_time(e)),
        stream_seq=item.stream_seq,
        team=team,
        pool=pool,
        gpu_model=model,
        priority=priority,
        gpus_requested=requested,
        gpus=gpus,
    )


_FLEET_KINDS = {
    NodeIsolated: "node_isolated",
    NodeRestored: "node_restored",
    GpuIsolated: "gpu_isolated",
    GpuRestored: "gpu_restored",
}

_SCHEMAS: dict[str, pa.Schema] = {
    "events": pa.schema(
        [("event_id", pa.string()), ("type", pa.string()), ("stream", pa.string()), ("subject", pa.string())]
        + [("stream_seq", pa.uint64()), ("source", pa.string()), ("ce_time", pa.string()), ("at", TS)]
        + [(n, pa.string()) for n in ("team", "job_id", "cluster", "node", "body")]
    ),
    "job_events": pa.schema(
        [("event_id", pa.string()), ("job_id", pa.string()), ("kind", pa.string()), ("at", TS)]
        + [("stream_seq", pa.uint64())]
        + [(n, pa.string()) for n in ("team", "pool", "gpu_model", "priority")]
        + [("gpus_requested", pa.uint32())]
        + [
            (
                "gpus",
                pa.list_(pa.struct([("cluster", pa.string()), ("node", pa.string()), ("gpu_index", pa.uint16())])),
            )
        ]
    ),
    "fleet_events": pa.schema(
        [
            ("event_id", pa.string()),
            ("kind", pa.string()),
            ("cluster", pa.string()),
            ("node", pa.string()),
            ("gpu_index", pa.int16()),
            ("at", TS),
            ("stream_seq", pa.uint64()),
            ("reason", pa.string()),
        ]
    ),
    "gpu_inventory": pa.schema(
        [
            ("cluster", pa.string()),
            ("node", pa.string()),
            ("gpu_index", pa.uint16()),
            ("gpu_uuid", pa.string()),
            ("model", pa.string()),
            ("labels", pa.map_(pa.string(), pa.string())),
            ("observed_at", TS),
        ]
    ),
    "pools": pa.schema(
        [
            ("pool", pa.string()),
            ("gpu_model", pa.string()),
            ("node_selector", pa.map_(pa.string(), pa.string())),
            ("at", TS),
        ]
    ),
    "prices": pa.schema(
        [
            ("event_id", pa.string()),
            ("gpu_model", pa.string()),
            ("at", TS),
            ("price_per_gpu_hour", pa.float64()),
            ("currency", pa.string()),
            ("instance_type", pa.string()),
            ("cluster", pa.string()),
        ]
    ),
    "budgets": pa.schema(
        [
            ("event_id", pa.string()),
            ("team", pa.string()),
            ("at", TS),
            ("amount", pa.float64()),
            ("currency", pa.string()),
            ("period", pa.string()),
        ]
    ),
    "cost_ledger": pa.schema(
        [
            ("event_id", pa.string()),
            ("period_start", TS),
            ("period_end", TS),
            ("gpu_model", pa.string()),
            ("gpu_seconds", pa.float64()),
            ("cost", pa.float64()),
            ("currency", pa.string()),
            ("team", pa.string()),
            ("job_id", pa.string()),
            ("pool", pa.string()),
            ("idle", pa.uint8()),
            ("cluster", pa.string()),
            ("provider", pa.string()),
            ("region", pa.string()),
        ]
    ),
}


_SCHEMAS["nic_samples"] = NIC_SAMPLES  # fabric samples (services/recorder/fabric_rows.py)


def build_tables(items: list[Recorded]) -> dict[str, pa.Table]:
    """Every table's new rows for one consumed batch (tables with no rows are left out)."""
    samples = [i for i in items if isinstance(i.event, NodeSample | LeanNodeSample)]
    cols: dict[str, _Columns] = defaultdict(_Columns)
    for item in items:
        e = item.event
        if isinstance(e, NodeSample | LeanNodeSample):
            continue
        # telemetry and heartbeats, repeated: not audit facts
        if not isinstance(e, NodeInventory | FabricSample | RankStepTimings | ClusterHeartbeat):
            _audit_row(cols["events"], item, e)
        if isinstance(e, FabricSample):
            add_nic_rows(cols["nic_samples"], e, item.id)
        elif type(e).ce_type() in _JOB_KINDS:
            _job_row(cols["job_events"], item, e)
        elif isinstance(e, NodeIsolated | NodeRestored | GpuIsolated | GpuRestored):
            cols["fleet_events"].add(
                event_id=item.id,
                kind=_FLEET_KINDS[type(e)],
                cluster=e.cluster,
                node=e.node,
                gpu_index=e.gpu_index if isinstance(e, GpuIsolated | GpuRestored) else -1,
                at=_ms(e.at),
                stream_seq=item.stream_seq,
                reason=e.reason,
            )
        elif isinstance(e, NodeInventory | NodeDiscovered | NodeUpdated):
            when = e.observed_at if isinstance(e, NodeInventory) else e.at
            for g in e.gpus:
                cols["gpu_inventory"].add(
                    cluster=e.cluster,
                    node=e.node,
                    gpu_index=g.index,
                    gpu_uuid=g.uuid,
                    model=g.model,
                    labels=list(e.labels.items()),
                    observed_at=_ms(when),
                )
        elif isinstance(e, PoolDefined):
            cols["pools"].add(
                pool=e.pool, gpu_model=e.gpu_model or "", node_selector=list(e.node_selector.items()), at=_ms(e.at)
            )
        elif isinstance(e, PriceSet):
            cols["prices"].add(
                event_id=item.id,
                gpu_model=e.gpu_model,
                at=_ms(e.at),
                price_per_gpu_hour=e.price_per_gpu_hour,
                currency=e.currency,
                instance_type=e.instance_type or "",
                cluster=e.cluster or "",
            )
        elif isinstance(e, BudgetSet):
            cols["budgets"].add(
                event_id=item.id, team=e.team, at=_ms(e.at), amount=e.amount, currency=e.currency, period=e.period
            )
        elif isinstance(e, CostAccrued):
            cols["cost_ledger"].add(
                event_id=item.id,
                period_start=_ms(e.period_start),
                period_end=_ms(e.period_end),
                gpu_model=e.gpu_model,
                gpu_seconds=e.gpu_seconds,
                cost=e.cost,
                currency=e.currency,
                team=e.team or "",
                job_id=e.job_id or "",
                pool=e.pool or "",
                idle=int(e.idle),
                cluster=e.cluster or "",
                provider=e.provider or "",
                region=e.region or "",
            )
    tables: dict[str, pa.Table] = {}
    sample_table = sample_columns(samples)
    if sample_table is not None:
        tables["gpu_samples"] = sample_table
    for name, columns in cols.items():
        tables[name] = pa.table(columns.data, schema=_SCHEMAS[name])
    return tables
