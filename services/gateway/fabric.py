"""The fabric in the gateway's read model and on `/metrics`: each node's latest NICs (from FabricSample)
with error, pause and flap counts summed since the gateway started (Prometheus counters; a gateway
restart is a counter reset, which Prometheus' rate() handles)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from events.fabric import FabricSample, JobSlowdownCleared, JobSlowdownDetected, LinkState, NicSample

NodeKey = tuple[str, str]
MAX_SLOWDOWNS = 500  # episodes kept for the panel; the warehouse keeps them all


@dataclass
class NicTotals:
    errors: int = 0
    pause: int = 0
    flaps: int = 0


@dataclass
class FabricView:
    latest: dict[NodeKey, FabricSample] = field(default_factory=dict)
    totals: dict[tuple[str, str, str], NicTotals] = field(default_factory=dict)  # (cluster, node, nic)
    slowdowns: dict[str, Slowdown] = field(default_factory=dict)  # by job: its latest episode


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
        if not view.latest:  # no fabric samples (yet): no NIC series, not empty families
            return
        labels = ["cluster", "node", "nic", "leaf"]
        helps = dict(NIC_SERIES)
        up, rate, tx, rx = (
            GaugeMetricFamily(name, helps[name], labels=labels)
            for name in (
                "chamber_nic_up",
                "chamber_nic_rate_gbps",
                "chamber_nic_tx_bytes_per_second",
                "chamber_nic_rx_bytes_per_second",
            )
        )
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


# --- the dashboard's fabric panel (`GET /api/fabric`) ---------------------------------------------

PAUSE_FLAG_PER_S = 1000.0  # pause frames per second on one NIC: congestion worth showing


class NicRow(msgspec.Struct, kw_only=True):
    nic: str
    gpu: int | None
    state: str
    rate_gbps: float | None
    tx_gbps: float | None
    errors: int | None
    pause: int | None
    flaps: int | None
    flags: list[str]


class FabricNode(msgspec.Struct, kw_only=True):
    cluster: str
    node: str
    leaf: str | None
    observed_at: float
    nics: list[NicRow]
    flagged: int


class Slowdown(msgspec.Struct, kw_only=True):
    job_id: str
    episode: int
    since: float
    at: float
    culprit: str
    score: float
    node: str | None = None
    gpu_index: int | None = None
    nic: str | None = None
    leaf: str | None = None
    reason: str = ""
    cleared_at: float | None = None
    cleared_reason: str = ""


class FabricAnswer(msgspec.Struct, kw_only=True):
    nodes: list[FabricNode]
    slowdowns: list[Slowdown]  # open episodes first, then the latest cleared ones


def fold_verdict(view: FabricView, event: JobSlowdownDetected | JobSlowdownCleared) -> None:
    if isinstance(event, JobSlowdownDetected):
        view.slowdowns[event.job_id] = Slowdown(
            job_id=event.job_id,
            episode=event.episode,
            since=event.since,
            at=event.at,
            culprit=event.culprit.value,
            score=event.score,
            node=event.node,
            gpu_index=event.gpu_index,
            nic=event.nic,
            leaf=event.leaf,
            reason=event.reason,
        )
        return
    s = view.slowdowns.get(event.job_id)
    if s is not None and s.episode == event.episode:
        s.cleared_at, s.cleared_reason = event.at, event.reason
    while len(view.slowdowns) > MAX_SLOWDOWNS:  # forget the oldest cleared ones
        oldest = min((s for s in view.slowdowns.values() if s.cleared_at is not None), key=lambda s: s.at, default=None)
        if oldest is None:
            break
        del view.slowdowns[oldest.job_id]


def _flags(n: NicSample, typical: float | None, interval_s: float) -> list[str]:
    flags = []
    if n.state is LinkState.DOWN:
        flags.append("down")
    if n.flaps:
        flags.append("flap")
    if n.rate_gbps and typical and n.rate_gbps < 0.75 * typical:
        flags.append("downshift")
    if n.errors:
        flags.append("errors")
    if n.pause and n.pause / max(interval_s, 1e-9) >= PAUSE_FLAG_PER_S:
        flags.append("pause")
    return flags


def answer(view: FabricView) -> FabricAnswer:
    nodes = []
    for (cluster, node), s in sorted(view.latest.items()):
        rates = sorted(n.rate_gbps for n in s.nics if n.rate_gbps)
        typical = rates[len(rates) // 2] if rates else None
        rows = [
            NicRow(
                nic=n.name,
                gpu=n.gpu_index,
                state=n.state.value,
                rate_gbps=n.rate_gbps,
                tx_gbps=None if n.tx_bytes_per_s is None else round(n.tx_bytes_per_s * 8 / 1e9, 2),
                errors=n.errors,
                pause=n.pause,
                flaps=n.flaps,
                flags=_flags(n, typical, s.interval_s),
            )
            for n in s.nics
        ]
        nodes.append(
            FabricNode(
                cluster=cluster,
                node=node,
                leaf=s.labels.get("leaf"),
                observed_at=s.observed_at,
                nics=rows,
                flagged=sum(1 for r in rows if r.flags),
            )
        )
    slow = sorted(view.slowdowns.values(), key=lambda s: (s.cleared_at is not None, -s.at, s.job_id))
    return FabricAnswer(nodes=nodes, slowdowns=slow)
