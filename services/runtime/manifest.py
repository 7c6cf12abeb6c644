"""What a service declares about its use of the bus, from which its NATS permissions are derived
(`chamber nats-config`, services/cli/nats_config.py): nothing in a role's permissions is written by
hand, and nothing a service does at run time is missing from its manifest (tests run every service
under the permissions derived here, and fail on any refusal).

Each `services/<name>/service.py` exports `ROLE = Manifest(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass

SNAPSHOT_BUCKET_PREFIX = "chamber_snapshots_"  # one object store per service: chamber_snapshots_<service>
LEASE_BUCKET_PREFIX = "chamber_lease_"  # one KV bucket per service: chamber_lease_<service>, key = lease name


def snapshot_bucket(service: str) -> str:
    return f"{SNAPSHOT_BUCKET_PREFIX}{_bucket_token(service)}"


def lease_bucket(service: str) -> str:
    return f"{LEASE_BUCKET_PREFIX}{_bucket_token(service)}"


def _bucket_token(name: str) -> str:
    """A bucket name allows letters, digits, `-` and `_` only."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name.strip().lower()) or "_"


@dataclass(frozen=True)
class Manifest:
    """`reads`: streams it follows through consumers of its own (ephemeral ones the server names,
    and `durables`); TELEMETRY stands for its partition streams too. `publishes`: event subjects it
    owns (`{cluster}` is replaced by the deployment's cluster). `buckets`: KV buckets it writes (and
    may create; never update or delete). `reads_buckets`: KV buckets of others it reads.
    `snapshots`: it saves its state in its own object store. `leases`: it takes leader leases (in
    its own lease bucket). `sends_commands`: the services it sends commands to ("*": every one)."""

    reads: tuple[str, ...] = ()
    durables: tuple[tuple[str, str], ...] = ()  # (stream, consumer name) it owns
    publishes: tuple[str, ...] = ()
    buckets: tuple[str, ...] = ()
    reads_buckets: tuple[str, ...] = ()
    snapshots: bool = False
    leases: bool = False
    commands: bool = True  # serves chamber.cmd.<service>.>
    sends_commands: tuple[str, ...] = ()
    why: str = ""  # one line for `chamber nats-config --explain`
