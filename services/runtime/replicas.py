"""How many copies JetStream keeps of each stream and KV bucket.

The number comes from configuration ($CHAMBER_NATS_REPLICAS, set by `--replicas` and by the chart
from `nats.replicas`); without it, 3 when the server we are connected to reports a JetStream
cluster of 3 or more servers, else 1. Replicas follow the cluster and are never lowered by
Chamber: an operator who raised a stream to R3 by hand keeps R3 (see `streams.ensure_streams`).

A request the cluster cannot meet (R3 on one server, R5 on three) is refused at start, naming
both numbers, instead of letting the server answer with a bare placement error.
"""

from __future__ import annotations

import os
from typing import Any

from services.errors import UsageError

ENV = "CHAMBER_NATS_REPLICAS"
MAX_REPLICAS = 5  # JetStream's own limit for a stream's RAFT group


class ReplicasUnavailable(UsageError):
    """More replicas requested than the NATS cluster has JetStream servers."""


def requested_replicas(environ: dict[str, str] | None = None) -> int | None:
    """$CHAMBER_NATS_REPLICAS as a number, None when unset; a bad value is a clear error."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return None
    return parse_replicas(raw, source=ENV)


def parse_replicas(raw: str | int, *, source: str = "--replicas") -> int:
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{source} must be a whole number of replicas (1-{MAX_REPLICAS}), got {raw!r}") from None
    if not 1 <= value <= MAX_REPLICAS:
        raise UsageError(f"{source} must be between 1 and {MAX_REPLICAS} (JetStream's limit), got {value}")
    return value


def cluster_size(server_info: dict[str, Any]) -> int | None:
    """JetStream servers in the cluster, from the INFO the server sent us: 1 when not clustered, else
    the client URLs the cluster advertises (each server announces its own); None when the cluster
    hides them (`no_advertise`): then the server's own placement answer decides."""
    if not server_info.get("cluster"):
        return 1
    urls = {str(u) for u in server_info.get("connect_urls") or []}
    return len(urls) or None


def resolve_replicas(server_info: dict[str, Any], requested: int | None, *, known_peers: int = 0) -> int:
    """The replica count to ask for: the configured one if the cluster can hold it, else a refusal;
    unconfigured, 3 on a cluster of 3 or more, else 1. `known_peers`: servers the cluster evidently
    has (an existing stream's replicas), which counts while one of them is down and so not advertised
    (a rolling restart must not make services refuse to start)."""
    size = cluster_size(server_info)
    if size is not None and server_info.get("cluster"):
        size = max(size, known_peers)
    if requested is None:
        return 3 if size is not None and size >= 3 else 1
    if size is not None and requested > size:
        where = server_info.get("cluster") or "a single server (not clustered)"
        raise ReplicasUnavailable(
            f"{requested} stream replicas requested ({ENV} / --replicas) but the NATS cluster {where} "
            f"has {size} JetStream server(s); add servers or ask for at most {size}"
        )
    return requested


def _client(js_or_nc: Any) -> Any:
    return getattr(js_or_nc, "_nc", js_or_nc)


def replicas_for(js_or_nc: Any, *, known_peers: int = 0, fresh: bool = False) -> int:
    """The replica count for a JetStream context or client: the one `remember`ed for this connection
    (what `ensure_streams` settled on) unless `fresh`, else from configuration and the server's INFO
    (no I/O)."""
    nc = _client(js_or_nc)
    remembered = getattr(nc, _REMEMBERED, None)
    if remembered is not None and not fresh:
        return int(remembered)
    info = getattr(nc, "_server_info", None) or {}
    return resolve_replicas(info, requested_replicas(), known_peers=known_peers)


def remember(js_or_nc: Any, replicas: int) -> None:
    """Keep the count for this connection, so KV buckets created later agree with the streams."""
    setattr(_client(js_or_nc), _REMEMBERED, replicas)


_REMEMBERED = "_chamber_replicas"
