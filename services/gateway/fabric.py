"""The fabric in the gateway's read model and on `/metrics`: each node's latest NICs (from FabricSample)
with error, pause and flap counts summed since the gateway started (Prometheus counters; a gateway
restart is a counter reset, which Prometheus' rate() handles)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from events.fabric import FabricSample, LinkState, NicSample

NodeKey = tuple[str, str]


@dataclass
class NicTotals:
    errors: int = 0
    pause: int = 0
    flaps: int = 0


@dataclass
class FabricView:
    latest: dict[NodeKey, FabricSample] = field(default_factory=dict)
    totals: dict[tuple[str, str, str], NicTotals] = field(default_factory=dict)  # (cluster, node, nic)


def fold(view: FabricView, sample: FabricSample) -> None:
    key = (sample.cluster, sample.node)
    prev = view.latest.get(key)
    if prev is not None and sample.observed_at <= prev.observed_at:
        return  # a replayed or late sample: already counted
    view.latest[key] = sample
    for n in sample.nics:
        t = view.totals.setdefault((sample.cluster, sample.node, n.name), NicTotals())
        t.errors += n.errors or 0
        t.pause += n.pause or 0
        t.flaps += n.flaps or 0


# (name, help) of the per-NIC series; labels cluster, node, nic, leaf.
NIC_SERIES: tuple[tuple[str, str], ...] = (
    ("chamber_nic_up", "1 if the NIC link is up, 0 if down or unknown"),
    ("chamber_nic_rate_gbps", "the NIC link's trained rate in Gb/s"),
    ("chamber_nic_tx_bytes_per_second", "bytes sent per second over the last interval"),
    ("chamber_nic_rx_bytes_per_second", "bytes received per second over the last interval"),
    ("chamber_nic_errors", "symbol / receive / CRC errors counted since the gateway started"),
    ("chamber_nic_pause_frames", "pause frames (PFC) or xmit-wait ticks counted since the gateway started"),
    ("chamber_nic_flaps", "link flaps counted since the gateway started"),
)


class FabricCollector(Collector):
    def __init__(self, view: Callable[[], FabricView]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        labels = ["cluster", "node", "nic", "leaf"]
        helps = dict(NIC_SERIES)
        up, rate, tx, rx = (
            GaugeMetricFamily(name, helps[name], labels=labels)
            for name in ("chamber_nic_up", "chamber_nic_rate_gbps", "chamber_nic_tx_bytes_per_second",
                         "chamber_nic_rx_bytes_per_second")
        )  # fmt: skip
        errors, pause, flaps = (
            CounterMetricFamily(name, helps[name], labels=labels)
            for name in ("chamber_nic_errors", "chamber_nic_pause_frames", "chamber_nic_flaps")
        )
        for (cluster, node), sample in sorted(view.latest.items()):
            leaf = sample.labels.get("leaf", "")
            for n in sample.nics:
                lv = [cluster, node, n.name, leaf]
                up.add_metric(lv, 1.0 if n.state is LinkState.UP else 0.0)
                _maybe(rate, lv, n.rate_gbps)
                _maybe(tx, lv, n.tx_bytes_per_s)
                _maybe(rx, lv, n.rx_bytes_per_s)
                t = view.totals.get((cluster, node, n.name), NicTotals())
                errors.add_metric(lv, t.errors)
                pause.add_metric(lv, t.pause)
                flaps.add_metric(lv, t.flaps)
        yield from (up, rate, tx, rx, errors, pause, flaps)


def _maybe(metric: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        metric.add_metric(labels, value)


def nic_rows(view: FabricView) -> list[dict[str, object]]:
    """Latest NICs per node, JSON-ready (for the API / dashboard)."""
    out: list[dict[str, object]] = []
    for (cluster, node), s in sorted(view.latest.items()):
        out.append({"cluster": cluster, "node": node, "labels": s.labels, "nics": [_nic(n) for n in s.nics]})
    return out


def _nic(n: NicSample) -> dict[str, object]:
    return {
        "nic": n.name,
        "gpu": n.gpu_index,
        "state": n.state.value,
        "rate_gbps": n.rate_gbps,
        "tx_bytes_per_s": n.tx_bytes_per_s,
        "errors": n.errors,
        "pause": n.pause,
        "flaps": n.flaps,
    }
