"""Builders for health and discovery scenarios: a fleet, a fault, a clean or dirty sample."""

from __future__ import annotations

from events import GpuFaultDetected, GpuInfo, GpuSample, NodeDiscovered, NodeInventory, NodeSample
from events.faults import FaultKind, Severity
from events.telemetry import RowRemapState

T0 = 1_700_000_000.0


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index:02d}"


def gpus(node: str, n: int = 8, model: str = "H100-80GB") -> list[GpuInfo]:
    return [GpuInfo(index=i, uuid=gpu_uuid(node, i), model=model) for i in range(n)]


def a_node_discovered(node: str, *, cluster: str = "c1", n_gpus: int = 8, at: float = T0) -> NodeDiscovered:
    return NodeDiscovered(cluster=cluster, node=node, at=at, gpus=gpus(node, n_gpus))


def a_fleet(n: int, *, cluster: str = "c1", n_gpus: int = 8) -> list[NodeDiscovered]:
    return [a_node_discovered(f"n{i:03d}", cluster=cluster, n_gpus=n_gpus) for i in range(n)]


def an_inventory(node: str, *, cluster: str = "c1", n_gpus: int = 8, at: float = T0, **kw: object) -> NodeInventory:
    return NodeInventory(cluster=cluster, node=node, observed_at=at, gpus=gpus(node, n_gpus), **kw)  # type: ignore[arg-type]


def a_fault(
    node: str = "n000",
    *,
    kind: FaultKind = FaultKind.XID,
    xid: int | None = None,
    gpu: int | None = 0,
    at: float = T0,
    severity: Severity = Severity.CRITICAL,
    cluster: str = "c1",
    fault_id: str | None = None,
) -> GpuFaultDetected:
    return GpuFaultDetected(
        fault_id=fault_id or f"{node}-{kind}-{xid}-{gpu}-{at}",
        cluster=cluster,
        node=node,
        kind=kind,
        severity=severity,
        observed_at=at,
        gpu_index=gpu,
        gpu_uuid=gpu_uuid(node, gpu) if gpu is not None else None,
        xid=xid,
    )


def a_sample(
    node: str = "n000",
    *,
    at: float = T0,
    seq: int = 0,
    n_gpus: int = 8,
    cluster: str = "c1",
    dbe: dict[int, int] | None = None,
    remap_pending: set[int] | None = None,
    util: float = 50.0,
    interval_s: float = 1.0,
) -> NodeSample:
    dbe = dbe or {}
    remap_pending = remap_pending or set()
    return NodeSample(
        cluster=cluster,
        node=node,
        seq=seq,
        observed_at=at,
        interval_s=interval_s,
        gpus=[
            GpuSample(
                index=i,
                uuid=gpu_uuid(node, i),
                utilization_pct=util,
                ecc_dbe_volatile=dbe.get(i, 0),
                row_remap=RowRemapState(pending=i in remap_pending, failure=False),
            )
            for i in range(n_gpus)
        ],
    )
