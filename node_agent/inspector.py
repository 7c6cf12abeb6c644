"""NCCL Inspector output, read by the agent: per GPU, communicator and collective, the bus bandwidth and
execution time (attached to the node's FabricSample as `collectives`).

Formats (github.com/NVIDIA/nccl, plugins/profiler/inspector/README.md):
- Prometheus textfile (`NCCL_INSPECTOR_PROM_DUMP=1`, files rewritten in `NCCL_INSPECTOR_DUMP_DIR` at most
  every 30 s for node exporter's textfile collector): `nccl_bus_bandwidth_gbs`,
  `nccl_collective_exec_time_microseconds`, `nccl_p2p_bus_bandwidth_gbs`, `nccl_p2p_exec_time_microseconds`
  with labels `node`, `gpu` ("GPU0"), `comm_name`, `n_nodes`, `nranks`, `collective` (or `p2p_operation`),
  `message_size` (a bucket such as "4-5GB"), `algo_proto`.
- OTLP/HTTP metrics (`NCCL_INSPECTOR_OTEL_EXPORT=1`, JSON encoding, POSTed to
  `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, default http://localhost:4318/v1/metrics): the same metric names
  and attributes on each data point (`gpu`, `comm_name`, `collective`, `message_size`; `comm_id` in verbose
  mode), in the OTLP JSON shape resourceMetrics -> scopeMetrics -> metrics -> gauge|sum -> dataPoints
  (opentelemetry-proto's JSON mapping: `attributes` as key / {stringValue|intValue|doubleValue}, values
  as `asDouble` or `asInt`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events.fabric import CollectiveBandwidth

BUSBW = ("nccl_bus_bandwidth_gbs", "nccl_p2p_bus_bandwidth_gbs")
EXEC = ("nccl_collective_exec_time_microseconds", "nccl_p2p_exec_time_microseconds")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_GPU = re.compile(r"(\d+)$")

Key = tuple[int, str, str, str]  # (gpu, comm, collective, message_size)


def _merge(points: Iterable[tuple[str, dict[str, str], float]]) -> list[CollectiveBandwidth]:
    """Metric points (name, labels, value) into one record per GPU, communicator, collective, size."""
    busbw: dict[Key, float] = {}
    exec_us: dict[Key, float] = {}
    nranks: dict[Key, int] = {}
    for name, labels, value in points:
        if name not in BUSBW and name not in EXEC:
            continue
        m = _GPU.search(labels.get("gpu", ""))
        if m is None:
            continue
        comm = labels.get("comm_id") or labels.get("comm_name", "")
        coll = labels.get("collective") or labels.get("p2p_operation", "")
        key = (int(m.group(1)), comm, coll, labels.get("message_size", labels.get("coll_msg_size_bytes", "")))
        (busbw if name in BUSBW else exec_us)[key] = value
        if labels.get("nranks", "").isdigit():
            nranks[key] = int(labels["nranks"])
    return [
        CollectiveBandwidth(
            gpu_index=k[0],
            comm=k[1],
            collective=k[2],
            message_size=k[3],
            busbw_gbs=busbw.get(k),
            exec_time_us=exec_us.get(k),
            nranks=nranks.get(k),
        )
        for k in sorted(set(busbw) | set(exec_us))
    ]


def parse_prometheus(text: str) -> list[CollectiveBandwidth]:
    points = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if m is None:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"') for k, v in _LABEL.findall(m.group(3) or "")}
        points.append((m.group(1), labels, value))
    return _merge(points)


def _attr_value(v: Any) -> str:
    if not isinstance(v, dict):
        return ""
    for k in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if k in v:
            return str(v[k])
    return ""


def _attrs(items: Any) -> dict[str, str]:
    if not isinstance(items, list):
        return {}
    return {str(a.get("key")): _attr_value(a.get("value")) for a in items if isinstance(a, dict)}


def _objects(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _obj(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def parse_otlp_json(doc: Any) -> list[CollectiveBandwidth]:
    """An OTLP/HTTP ExportMetricsServiceRequest in its JSON encoding (anything else in it is skipped)."""
    points = []
    for rm in _objects(_obj(doc).get("resourceMetrics")):
        resource = _attrs(_obj(rm.get("resource")).get("attributes"))
        for sm in _objects(rm.get("scopeMetrics")):
            for metric in _objects(sm.get("metrics")):
                name = str(metric.get("name", ""))
                body = _obj(metric.get("gauge") or metric.get("sum"))
                for dp in _objects(body.get("dataPoints")):
                    raw: Any = dp.get("asDouble", dp.get("asInt"))  # asInt is a string in OTLP JSON
                    try:
                        value = float(raw)
                    except (TypeError, ValueError):
                        continue
                    points.append((name, {**resource, **_attrs(dp.get("attributes"))}, value))
    return _merge(points)


@dataclass
class InspectorDir:
    """The Prometheus textfiles Inspector writes (`NCCL_INSPECTOR_DUMP_DIR`), read each interval."""

    path: Path
    _cache: dict[Path, tuple[float, list[CollectiveBandwidth]]] = field(default_factory=dict)

    def read(self) -> list[CollectiveBandwidth]:
        out: list[CollectiveBandwidth] = []
        try:
            files = sorted(p for p in self.path.iterdir() if p.suffix == ".prom")
        except OSError:
            return []
        for p in files:
            try:
                mtime = p.stat().st_mtime
                cached = self._cache.get(p)
                if cached is None or cached[0] != mtime:  # rewritten at most every 30 s: parse on change
                    cached = (mtime, parse_prometheus(p.read_text(errors="replace")))
                    self._cache[p] = cached
            except OSError:
                continue
            out += cached[1]
        return out


@dataclass
class OtlpStore:
    """The latest Inspector series received over OTLP/HTTP (`otlp_app` serves POST /v1/metrics)."""

    latest: dict[Key, CollectiveBandwidth] = field(default_factory=dict)

    def add(self, records: list[CollectiveBandwidth]) -> None:
        for r in records:
            self.latest[(r.gpu_index, r.comm, r.collective, r.message_size)] = r

    def read(self) -> list[CollectiveBandwidth]:
        return [self.latest[k] for k in sorted(self.latest)]


def otlp_app(store: OtlpStore) -> Any:
    """An aiohttp application accepting Inspector's OTLP/HTTP JSON metrics on /v1/metrics (bind it to
    loopback: Inspector runs on the same node). Protobuf bodies are refused with 415 (Inspector sends JSON)."""
    from aiohttp import web

    async def metrics(request: web.Request) -> web.Response:
        if "json" not in request.headers.get("Content-Type", ""):
            return web.json_response({"error": "only application/json (OTLP JSON encoding)"}, status=415)
        try:
            doc = json.loads(await request.text())
        except ValueError:
            return web.json_response({"error": "body is not JSON"}, status=400)
        store.add(parse_otlp_json(doc))
        return web.json_response({"partialSuccess": {}})

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/v1/metrics", metrics)
    return app
