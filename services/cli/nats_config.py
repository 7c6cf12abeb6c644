"""`chamber nats-config`: the nats-server `authorization` block for Chamber's roles.

Roles (least privilege, one NATS user each):
- `svc-<service>`  publishes only the subjects its service owns (design table), plus dead letters and
                   the JetStream API it needs (never deleting or purging the event streams); serves its
                   own commands. Only the gateway may send commands to other services.
- `agent-<node>`   publishes only `chamber.telemetry.{sample,inventory,fabric}.<cluster>.<node>` and
                   `chamber.faults.<cluster>.<node>`; may read stream info (it runs `ensure_streams`),
                   nothing else: it cannot create, change or delete streams.
- `agent`          (--shared-agent) one user for every node agent of the cluster, when nodes are not
                   known up front: the same subjects for any node of *this* cluster only.
- `simulator`      (--simulator) the simulated fleet: any node's telemetry and faults in this cluster,
                   reads JOBS placements and reports job progress (it stands in for the executor),
                   answers fault injection on `chamber.cmd.sim.*`.
- `reader`         read-only external subscriber: core and JetStream reads of the event streams
                   through consumers (its read cursors); no events, commands, streams or purges.
- `admin`          the operator's `chamber` CLI: everything.

Passwords come from a directory holding one file per user (a mounted Kubernetes Secret), or are
created there with `--create-missing`. Clients put them in the URL: nats://USER:PASSWORD@host:4222.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from events import subjects
from events.partitions import partition_stream
from events.streams import STREAMS
from services.cli.common import add_cluster_option
from services.cli.errors import UsageError
from services.runtime.snapshots import BUCKET as SNAPSHOT_BUCKET

DEFAULT_SERVICES = ("discovery", "health", "quota", "scheduler", "billing", "recorder", "gateway", "perf")
EVENT_STREAMS = tuple(s.name for s in STREAMS if s.name != "DEAD")
INBOX = "_INBOX.>"


def owned_subjects(service: str, cluster: str) -> list[str]:
    """What each service publishes (DESIGN.md, services table). Unknown services own nothing."""
    fleet = f"chamber.fleet.{subjects.token(cluster)}.*"
    return {
        "discovery": [fleet],
        "health": [fleet],
        "quota": ["chamber.quota.>"],
        "scheduler": ["chamber.jobs.>"],
        "billing": ["chamber.billing.>"],
        "perf": ["chamber.jobs.*.perf", f"chamber.faults.{subjects.token(cluster)}.*"],
    }.get(service, [])


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    deny_publish: tuple[str, ...] = ()
    allow_responses: bool = False

    def to_conf(self) -> dict[str, object]:
        out: dict[str, object] = {}
        publish: dict[str, object] = {"allow": list(self.publish)}
        if self.deny_publish:
            publish["deny"] = list(self.deny_publish)
        out["publish"] = publish
        out["subscribe"] = {"allow": list(self.subscribe)}
        if self.allow_responses:
            out["allow_responses"] = True
        return out


@dataclass(frozen=True)
class User:
    name: str
    role: str
    permissions: Permissions | None  # None: everything (admin)


def _read_streams(streams: Iterable[str]) -> list[str]:
    """Read a stream through consumers: info, create, fetch, ack, delete; nothing that changes the stream."""
    out = ["$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST"]
    for s in streams:
        out += [
            f"$JS.API.STREAM.INFO.{s}",
            f"$JS.API.STREAM.MSG.GET.{s}",
            f"$JS.API.CONSUMER.CREATE.{s}",
            f"$JS.API.CONSUMER.CREATE.{s}.>",
            f"$JS.API.CONSUMER.INFO.{s}.*",
            f"$JS.API.CONSUMER.DELETE.{s}.*",
            f"$JS.API.CONSUMER.MSG.NEXT.{s}.*",
            f"$JS.ACK.{s}.>",
            f"$JS.FC.{s}.>",
        ]
    return out


def _partition_streams(partitions: int) -> list[str]:
    """TELEMETRY_P0..N-1 when telemetry is partitioned (see events/partitions.py), else none."""
    return [partition_stream(i) for i in range(partitions)] if partitions > 1 else []


def _protect_streams(partitions: int = 1) -> tuple[str, ...]:
    """No service deletes, purges or deletes messages from the event history (KV buckets, also
    streams, stay manageable). Stream UPDATE stays allowed: every service ensures the streams' config."""
    verbs = ("DELETE", "PURGE", "MSG.DELETE")
    names = [s.name for s in STREAMS] + _partition_streams(partitions)
    return tuple(f"$JS.API.STREAM.{verb}.{name}" for name in names for verb in verbs)


def service_user(service: str, cluster: str, partitions: int = 1) -> User:
    publish = [*owned_subjects(service, cluster), "chamber.dead.>", "$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$KV.>"]
    # The snapshot object store (services/runtime/snapshots.py) writes its chunks and metadata on
    # `$O.<bucket>.>`; without it every snapshot save was refused (found by the tests' secured bus).
    publish.append(f"$O.{SNAPSHOT_BUCKET}.>")
    if service == "gateway":
        publish.append("chamber.cmd.>")
    return User(
        f"svc-{service}",
        "service",
        Permissions(
            publish=tuple(publish),
            subscribe=(INBOX, f"chamber.cmd.{subjects.token(service)}.>"),
            deny_publish=_protect_streams(partitions),
            allow_responses=True,
        ),
    )


def _node_subjects(cluster: str, node: str | None) -> list[str]:
    """One node's telemetry and fault subjects; `None`: any node of the cluster (a `*` wildcard).
    nats-server checks publish permissions on the subject after its mappings, so a node's samples
    are also allowed with the partition token the telemetry mapping appends (events/partitions.py)."""
    if node is not None:
        sample = subjects.sample(cluster, node)
        return [
            sample,
            f"{sample}.*",
            subjects.inventory(cluster, node),
            subjects.fabric(cluster, node),
            subjects.steps(cluster, node),
            subjects.faults(cluster, node),
        ]
    c = subjects.token(cluster)
    return [
        f"chamber.telemetry.sample.{c}.*",
        f"chamber.telemetry.sample.{c}.*.*",
        f"chamber.telemetry.inventory.{c}.*",
        f"chamber.telemetry.fabric.{c}.*",
        f"chamber.telemetry.steps.{c}.*",
        f"chamber.faults.{c}.*",
    ]


def _stream_exists_checks() -> list[str]:
    """Read-only stream info: the agent runs `ensure_streams` (a no-op once the services made them)."""
    return ["$JS.API.INFO", "$JS.API.STREAM.INFO.*"]


def agent_user(cluster: str, node: str) -> User:
    return User(
        f"agent-{node}",
        "agent",
        Permissions(publish=(*_node_subjects(cluster, node), *_stream_exists_checks()), subscribe=(INBOX,)),
    )


def shared_agent_user(cluster: str) -> User:
    return User(
        "agent",
        "agent",
        Permissions(publish=(*_node_subjects(cluster, None), *_stream_exists_checks()), subscribe=(INBOX,)),
    )


def simulator_user(cluster: str) -> User:
    """The simulated fleet also replays JOBS with its own durable consumer (recreated at start) and
    serves `chamber.cmd.sim.*` (fault injection)."""
    return User(
        "simulator",
        "simulator",
        Permissions(
            publish=(
                *_node_subjects(cluster, None),
                "chamber.jobs.>",
                *_stream_exists_checks(),
                *_read_streams(["JOBS"]),
                "$JS.API.CONSUMER.DURABLE.CREATE.JOBS.*",
            ),
            subscribe=(INBOX, "chamber.jobs.>", "chamber.cmd.sim.>"),
            allow_responses=True,
        ),
    )


def reader_user(partitions: int = 1) -> User:
    return User(
        "reader",
        "reader",
        Permissions(
            publish=tuple(_read_streams([*EVENT_STREAMS, *_partition_streams(partitions)])),
            subscribe=(INBOX, *(p for s in STREAMS if s.name in EVENT_STREAMS for p in s.subjects)),
        ),
    )


def users(
    cluster: str,
    *,
    services: Sequence[str] = DEFAULT_SERVICES,
    agent_nodes: Sequence[str] = (),
    shared_agent: bool = False,
    simulator: bool = False,
    telemetry_partitions: int = 1,
) -> list[User]:
    out = [service_user(s, cluster, telemetry_partitions) for s in services]
    out += [agent_user(cluster, n) for n in agent_nodes]
    if shared_agent:
        out.append(shared_agent_user(cluster))
    if simulator:
        out.append(simulator_user(cluster))
    out += [reader_user(telemetry_partitions), User("admin", "admin", None)]
    return out


@dataclass
class PasswordSource:
    directory: Path
    create_missing: bool = False
    created: list[str] = field(default_factory=list)

    def password(self, user: str) -> str:
        path = self.directory / user
        if path.is_file():
            value = path.read_text().strip()
            if value:
                return value
        if not self.create_missing:
            raise UsageError(
                f"no password for NATS user {user!r}: put one in {path} or pass --create-missing to generate it"
            )
        value = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32))  # URL-safe
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value)
        self.created.append(user)
        return value


def render(users_: Sequence[User], passwords: PasswordSource) -> str:
    """The `authorization { users = [...] }` block (values JSON-quoted, which nats-server accepts)."""
    lines = ["# Generated by `chamber nats-config`; do not edit by hand.", "authorization {", "  users = ["]
    for user in users_:
        entry: dict[str, object] = {"user": user.name, "password": passwords.password(user.name)}
        if user.permissions is not None:
            entry["permissions"] = user.permissions.to_conf()
        lines.append(f"    # role: {user.role}")
        lines.append("    " + json.dumps(entry))
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("nats-config", help="generate nats-server's authorization block from Chamber's roles")
    add_cluster_option(p)
    p.add_argument("--passwords", type=Path, required=True, metavar="DIR", help="one file per user name")
    p.add_argument("--create-missing", action="store_true", help="generate passwords missing from DIR")
    p.add_argument("--service", action="append", dest="services", metavar="NAME", help="repeatable (default: all)")
    p.add_argument("--agent-node", action="append", default=[], metavar="NODE", help="a per-node agent user")
    p.add_argument("--shared-agent", action="store_true", help="one agent user for any node of the cluster")
    p.add_argument("--simulator", action="store_true", help="a user for the simulated fleet")
    p.add_argument("--out", type=Path, help="write here (default: stdout)")
    p.add_argument(
        "--telemetry-partitions",
        default=os.environ.get("CHAMBER_TELEMETRY_PARTITIONS") or "1",
        metavar="N",
        help="node-sample partition streams the reader may read and services may not delete (default 1)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.runtime.partitions import parse_partitions

    for node in args.agent_node:
        if not node or any(c.isspace() for c in node):
            raise UsageError(f"--agent-node {node!r}: give a Kubernetes node name")
    chosen = users(
        args.cluster,
        services=args.services or DEFAULT_SERVICES,
        agent_nodes=args.agent_node,
        shared_agent=args.shared_agent,
        simulator=args.simulator,
        telemetry_partitions=parse_partitions(args.telemetry_partitions),
    )
    text = render(chosen, PasswordSource(args.passwords, create_missing=args.create_missing))
    if args.out is None:
        print(text, end="")
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds passwords
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return 0
