"""The bus's one-time set-up, done by the operator (`chamber setup`, `chamber up`, the chart's
set-up Job) and never by a service: the design's streams, every service's KV buckets, lease buckets
and snapshot stores (from the service manifests), and their replicas.

Services and agents may not create, update or delete streams (their NATS roles refuse it: a stream
created with someone else's subjects would record their traffic); they find what is set up here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from nats.js import JetStreamContext

from services.runtime.buckets import open_kv, open_object_store
from services.runtime.manifest import Manifest, lease_bucket, snapshot_bucket
from services.runtime.streams import ensure_bucket_replicas, ensure_streams

LEASE_TTL_S = 15.0  # the leases' default (--leader-lease-ttl, --partition-lease-ttl): a key expires after it
# Buckets whose entries expire (the bucket's max age), by name; others keep their last value.
BUCKET_TTL_S = {"chamber_recorders": LEASE_TTL_S}


def lease_ttl_s() -> float:
    """The lease buckets' entry lifetime: `$CHAMBER_LEADER_LEASE_TTL_S` (what the chart gives the
    scheduler and this set-up alike), else the default. A lease adopts its bucket's."""
    from services.runtime.lease import ENV_TTL

    raw = os.environ.get(ENV_TTL, "").strip()
    try:
        value = float(raw) if raw else LEASE_TTL_S
    except ValueError:
        return LEASE_TTL_S
    return value if math.isfinite(value) and value > 0 else LEASE_TTL_S


@dataclass(frozen=True)
class Bucket:
    name: str
    owner: str
    kind: str  # "kv" or "object"
    ttl_s: float | None = None


def buckets(manifests: Mapping[str, Manifest]) -> list[Bucket]:
    """Every bucket the services write, each with the service that owns it."""
    out: list[Bucket] = []
    for service, m in sorted(manifests.items()):
        out += [Bucket(b, service, "kv", BUCKET_TTL_S.get(b)) for b in m.buckets]
        if m.leases:
            out.append(Bucket(lease_bucket(service), service, "kv", lease_ttl_s()))
        if m.snapshots:
            out.append(Bucket(snapshot_bucket(service), service, "object"))
    return out


def service_manifests() -> dict[str, Manifest]:
    """The manifests of the services found: every `services/<name>/service.py` with a `ROLE` (the
    packages `chamber service` discovers too)."""
    import importlib
    import pkgutil

    import services

    found: dict[str, Manifest] = {}
    for info in pkgutil.iter_modules(services.__path__):
        if not info.ispkg or info.name in ("cli", "runtime", "stack"):
            continue
        try:
            module = importlib.import_module(f"services.{info.name}.service")
        except ModuleNotFoundError as exc:
            if exc.name != f"services.{info.name}.service":
                raise
            continue
        if isinstance(getattr(module, "ROLE", None), Manifest):
            found[getattr(module, "NAME", info.name)] = module.ROLE
    return dict(sorted(found.items()))


async def set_up(js: JetStreamContext, manifests: Mapping[str, Manifest] | None = None) -> list[str]:
    """Create or update the streams, create the buckets; returns what changed."""
    changed = await ensure_streams(js)
    for bucket in buckets(manifests if manifests is not None else service_manifests()):
        if bucket.kind == "object":
            await open_object_store(js, bucket.name, description=f"state snapshots of {bucket.owner}")
        else:
            config: dict[str, object] = {"history": 1, "description": f"written by {bucket.owner}"}
            if bucket.ttl_s is not None:
                config["ttl"] = bucket.ttl_s
            await open_kv(js, bucket.name, **config)
    changed += await ensure_bucket_replicas(js)
    return changed
