"""Warehouse rows for fabric samples: one `nic_samples` row per NIC per FabricSample."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from events.fabric import FabricSample

TS = pa.timestamp("ms", tz="UTC")

NIC_SAMPLES = pa.schema(
    [
        ("cluster", pa.string()),
        ("node", pa.string()),
        ("nic", pa.string()),
        ("nic_index", pa.uint16()),
        ("gpu_index", pa.int16()),
        ("leaf", pa.string()),
        ("ts", TS),
        ("interval_s", pa.float32()),
        ("state", pa.string()),
        ("rate_gbps", pa.float32()),
        ("tx_bytes_per_s", pa.float64()),
        ("rx_bytes_per_s", pa.float64()),
        ("errors", pa.int64()),
        ("discards", pa.int64()),
        ("pause", pa.int64()),
        ("flaps", pa.int64()),
        ("event_id", pa.string()),
    ]
)


def add_nic_rows(out: Any, event: FabricSample, event_id: str) -> None:
    """`out` is the recorder's column collector (`rows._Columns`)."""
    ts = round(event.observed_at * 1000)
    leaf = event.labels.get("leaf", "")
    for n in event.nics:
        out.add(
            cluster=event.cluster,
            node=event.node,
            nic=n.name,
            nic_index=n.index,
            gpu_index=n.gpu_index,
            leaf=leaf,
            ts=ts,
            interval_s=event.interval_s,
            state=n.state.value,
            rate_gbps=n.rate_gbps,
            tx_bytes_per_s=n.tx_bytes_per_s,
            rx_bytes_per_s=n.rx_bytes_per_s,
            errors=n.errors,
            discards=n.discards,
            pause=n.pause,
            flaps=n.flaps,
            event_id=event_id,
        )
