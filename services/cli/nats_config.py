"""`chamber nats-config`: the nats-server `authorization` block for Chamber's roles.

Every permission is derived from what a role declares (a service's `ROLE` manifest,
services/runtime/manifest.py; the fixed roles below), down to the JetStream API subject, and each
comes with the reason `--explain ROLE` prints:

- `svc-<service>`  publishes the subjects it owns and dead letters of the streams it reads; reads its
                   streams through consumers it creates (ephemeral, server-named) and its own
                   durables; writes only its own KV buckets, lease bucket and snapshot store; serves
                   `chamber.cmd.<service>.>` (the gateway alone sends commands to others). It may not
                   create, update, delete or purge a stream (the set-up does that: `chamber setup`).
- `agent-<node>`   publishes only its node's telemetry and faults, into the gate streams that bound
                   each node's rate and message size (`chamber.ingest.…`, events/streams.py), never
                   straight into TELEMETRY or FAULTS; reads stream info and its node's keys of the
                   step-log bucket (one consumer, named and filtered for the node).
- `agent`          (--shared-agent) the same for any node of this cluster.
- `agents-<c>`     (each --actuator-cluster C but this one) the node agents of member cluster C, which
                   report to this control plane: any node's telemetry and faults of cluster C only.
                   The services that publish per-cluster subjects (`{cluster}` in their manifests:
                   discovery's and health's fleet events, perf's faults) get them for C too.
- `simulator`      (--simulator) the simulated fleet: any node's telemetry and faults of this cluster,
                   job progress (`chamber.jobs.<job>`), reads JOBS through its own consumers, answers
                   `chamber.cmd.sim.>`.
- `actuator-<c>`   (--actuator-cluster C) a cluster's dispatch actuator: offers its cluster's
                   workloads, reports the copies it holds and beats for that cluster only; reads
                   DISPATCH through consumers of its own.
- `reader`         read-only external subscriber: core and JetStream reads of the event streams
                   through consumers of its own; no events, commands, streams or purges.
- `setup`          (--setup-user) creates and updates the streams and buckets (`chamber setup`);
                   never deletes or purges.
- `admin`          the operator's `chamber` CLI: everything.

Everywhere: a user subscribes under `_INBOX.<user>.>` only (clients connect with that inbox prefix,
services/runtime/credentials.py), so no one reads another client's replies; a durable consumer one
role owns is out of every other role's reach (deny rules beat the wildcards that let a role manage
the server-named ephemerals it creates).

Passwords come from a directory holding one file per user (a mounted Kubernetes Secret), or are
created there with `--create-missing`. Clients put them in the URL: nats://USER:PASSWORD@host:4222.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from events import subjects
from events.channels import STEP_LOG_BUCKET
from events.partitions import partition_stream
from events.steps import step_log_consumer, step_log_keys_of
from events.streams import DISPATCH, GATE_PER_WINDOW, GATE_WINDOW_S, GATES, STREAMS, StreamSpec
from services.cli.common import add_cluster_option
from services.cli.errors import UsageError
from services.runtime.credentials import inbox_prefix
from services.runtime.manifest import Manifest, lease_bucket, snapshot_bucket

DEFAULT_SERVICES = ("discovery", "health", "quota", "scheduler", "billing", "recorder", "gateway", "perf")
# Not in the default set (one cluster needs none; the chart runs it with dispatch.enabled): added with
# `--actuator-cluster`, or named with `--service`.
MULTI_CLUSTER_SERVICES = ("dispatch",)
EVENT_STREAMS = tuple(s.name for s in STREAMS if s.name != "DEAD")
SIM_COMMANDS = "sim"  # the simulated fleet's command subject token (node_agent/agent.py SIM_SERVICE)


@dataclass(frozen=True)
class Grant:
    """One subject in an allow or deny list, with the reason it is there."""

    subject: str
    why: str


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    deny_publish: tuple[str, ...] = ()
    allow_responses: bool = False
    reasons: Mapping[str, str] = field(default_factory=dict, compare=False)  # subject -> why (for --explain)

    @staticmethod
    def of(
        publish: Iterable[Grant],
        subscribe: Iterable[Grant] = (),
        deny_publish: Iterable[Grant] = (),
        *,
        allow_responses: bool = False,
    ) -> Permissions:
        reasons: dict[str, str] = {}

        def unique(grants: Iterable[Grant], kind: str) -> tuple[str, ...]:
            out: dict[str, None] = {}
            for g in grants:
                out.setdefault(g.subject)
                reasons.setdefault(f"{kind} {g.subject}", g.why)
            return tuple(out)

        return Permissions(
            publish=unique(publish, "publish"),
            subscribe=unique(subscribe, "subscribe"),
            deny_publish=unique(deny_publish, "deny"),
            allow_responses=allow_responses,
            reasons=reasons,
        )

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
    why: str = ""
    limits: tuple[str, ...] = ()  # what the server bounds beyond permissions, and why (for --explain)


# --- building blocks ---------------------------------------------------------------------------


def _streams(names: Iterable[str], partitions: int) -> list[str]:
    """Stream names, TELEMETRY standing for its partition streams too (events/partitions.py)."""
    out: list[str] = []
    for name in names:
        out.append(name)
        if name == "TELEMETRY" and partitions > 1:
            out += [partition_stream(i) for i in range(partitions)]
    return out


def _inbox(user: str) -> Grant:
    return Grant(f"{inbox_prefix(user)}.>", "its own replies (JetStream API answers, pulled messages, command replies)")


def _api_basics() -> list[Grant]:
    why = "JetStream account info, stream names and info (finding streams; read-only)"
    return [Grant("$JS.API.INFO", why), Grant("$JS.API.STREAM.NAMES", why), Grant("$JS.API.STREAM.INFO.*", why)]


def _api_of(streams: Iterable[str], what: str) -> list[Grant]:
    """JetStream basics of a process outside the control plane (a node agent, a member cluster's
    actuator): account info and the info of `streams` only (it checks they exist). No other
    stream's: a stream's info lists its subjects on request (job ids, teams, every KV key)."""
    why = f"JetStream account info, and the info of {what} (read-only)"
    return [Grant("$JS.API.INFO", why), *(Grant(f"$JS.API.STREAM.INFO.{s}", why) for s in streams)]


def _agent_api() -> list[Grant]:
    return _api_of((g.name for g in GATES), "the streams it publishes to")


def _consumer_reads(stream: str, durables: Iterable[str], why: str) -> list[Grant]:
    """Read `stream` through consumers of its own: create ephemerals (random names, so the name is
    a wildcard, fenced by `_others_durables`), its durables by name, pull, ack, delete. Never the
    unnamed create (`$JS.API.CONSUMER.CREATE.<stream>`): the server takes a durable's name from its
    body and would change that durable (another role's, say) through it."""
    out = [
        Grant(f"$JS.API.CONSUMER.CREATE.{stream}.>", f"{why}: create a consumer by name (ephemerals too)"),
        Grant(f"$JS.API.CONSUMER.INFO.{stream}.*", f"{why}: its consumers' positions"),
        Grant(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*", f"{why}: pull from its consumers"),
        Grant(f"$JS.API.CONSUMER.DELETE.{stream}.*", f"{why}: remove its ephemeral consumers"),
        Grant(f"$JS.API.STREAM.MSG.GET.{stream}", f"{why}: read one message"),
        Grant(f"$JS.API.DIRECT.GET.{stream}", f"{why}: read one message"),
        Grant(f"$JS.API.DIRECT.GET.{stream}.>", f"{why}: read one message by subject"),
        Grant(f"$JS.ACK.{stream}.>", f"{why}: acknowledge what it was delivered"),
        Grant(f"$JS.FC.{stream}.>", f"{why}: flow control of push consumers"),
    ]
    for name in durables:
        out.append(Grant(f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{name}", f"{why}: its durable consumer {name}"))
    return out


def _others_durables(mine: set[tuple[str, str]], every: Iterable[tuple[str, str]]) -> list[Grant]:
    """Deny everything on the durable consumers other roles own: no delete, pull, ack, change."""
    out: list[Grant] = []
    for stream, name in sorted(set(every) - mine):
        why = f"the durable consumer {stream}/{name} belongs to another role"
        out += [
            Grant(f"$JS.API.CONSUMER.*.{stream}.{name}", why),  # CREATE (update), DELETE, INFO, PAUSE, ...
            Grant(f"$JS.API.CONSUMER.*.*.{stream}.{name}", why),  # MSG.NEXT, DURABLE.CREATE, LEADER.STEPDOWN
            Grant(f"$JS.API.CONSUMER.CREATE.{stream}.{name}.>", why),
            Grant(f"$JS.ACK.{stream}.{name}.>", why),
        ]
    return out


def _kv(bucket: str, *, write: bool, why: str) -> list[Grant]:
    stream = f"KV_{bucket}"
    out = [
        Grant(f"$JS.API.DIRECT.GET.{stream}.>", f"{why}: read keys"),
        Grant(f"$JS.API.DIRECT.GET.{stream}", f"{why}: read keys"),
        Grant(f"$JS.API.STREAM.MSG.GET.{stream}", f"{why}: read keys"),
        Grant(f"$JS.API.CONSUMER.CREATE.{stream}", f"{why}: list and watch keys"),
        Grant(f"$JS.API.CONSUMER.CREATE.{stream}.>", f"{why}: list and watch keys"),
        Grant(f"$JS.API.CONSUMER.DELETE.{stream}.*", f"{why}: end a watch"),
        Grant(f"$JS.API.CONSUMER.INFO.{stream}.*", f"{why}: list keys (a watch's pending count)"),
        Grant(f"$JS.FC.{stream}.>", f"{why}: list and watch keys"),
    ]
    if write:
        out.append(Grant(f"$KV.{bucket}.>", f"{why}: put and delete keys"))
    return out


def _object_store(bucket: str, why: str) -> list[Grant]:
    stream = f"OBJ_{bucket}"
    return [
        Grant(f"$O.{bucket}.>", f"{why}: write chunks and metadata"),
        Grant(f"$JS.API.DIRECT.GET.{stream}.>", f"{why}: read metadata"),
        Grant(f"$JS.API.DIRECT.GET.{stream}", f"{why}: read metadata"),
        Grant(f"$JS.API.STREAM.MSG.GET.{stream}", f"{why}: read metadata"),
        Grant(f"$JS.API.CONSUMER.CREATE.{stream}", f"{why}: read chunks"),
        Grant(f"$JS.API.CONSUMER.CREATE.{stream}.>", f"{why}: read chunks"),
        Grant(f"$JS.API.CONSUMER.DELETE.{stream}.*", f"{why}: read chunks"),
        Grant(f"$JS.API.STREAM.PURGE.{stream}", f"{why}: drop the chunks a new snapshot replaces (own store only)"),
        Grant(f"$JS.FC.{stream}.>", f"{why}: read chunks"),
    ]


def _node_subjects(cluster: str, node: str | None) -> list[Grant]:
    """One node's telemetry and fault subjects, as agents publish them: into the gate streams, under
    the ingest prefix (events/streams.py), never straight into TELEMETRY or FAULTS. `None`: any node
    of the cluster (a `*` wildcard). nats-server checks publish permissions on the subject after its
    mappings, so a node's samples are also allowed with the partition token the telemetry mapping
    appends (events/partitions.py)."""
    who = f"node {node}" if node is not None else f"any node of cluster {cluster}"
    if node is not None:
        sample = subjects.sample(cluster, node)
        subjects_ = [
            sample,
            f"{sample}.*",
            subjects.inventory(cluster, node),
            subjects.fabric(cluster, node),
            subjects.steps(cluster, node),
        ]
        fault = subjects.faults(cluster, node)
    else:
        c = subjects.token(cluster)
        subjects_ = [
            f"chamber.telemetry.sample.{c}.*",
            f"chamber.telemetry.sample.{c}.*.*",
            f"chamber.telemetry.inventory.{c}.*",
            f"chamber.telemetry.fabric.{c}.*",
            f"chamber.telemetry.steps.{c}.*",
        ]
        fault = f"chamber.faults.{c}.*"
    gate = f"through its gate: at most {GATE_PER_WINDOW} a subject in {GATE_WINDOW_S:g} s"
    return [Grant(subjects.ingest(s), f"telemetry of {who}, {gate}") for s in subjects_] + [
        Grant(subjects.ingest(fault), f"GPU faults of {who}, {gate}")
    ]


# --- roles ---------------------------------------------------------------------------------------


def every_durable(manifests: Mapping[str, Manifest], partitions: int = 1) -> list[tuple[str, str]]:
    out = []
    for m in manifests.values():
        for stream, name in m.durables:
            out += [(s, name) for s in _streams([stream], partitions)]
    return out


def _owned(service: str, manifest: Manifest, cluster: str, members: Sequence[str]) -> list[Grant]:
    """The subjects a service owns: `{cluster}` stands for this cluster and, on a control plane, for
    each member cluster whose agents report here (their nodes' events are the service's to publish)."""
    out: list[Grant] = []
    for s in manifest.publishes:
        out.append(Grant(s.replace("{cluster}", subjects.token(cluster)), f"events {service} owns"))
        if "{cluster}" in s:
            out += [
                Grant(
                    s.replace("{cluster}", subjects.token(m)),
                    f"events {service} owns, for member cluster {m} (its agents report to this control plane)",
                )
                for m in members
            ]
    return out


def service_user(
    service: str,
    manifest: Manifest,
    cluster: str,
    manifests: Mapping[str, Manifest],
    partitions: int = 1,
    members: Sequence[str] = (),
) -> User:
    user = f"svc-{service}"
    publish: list[Grant] = _owned(service, manifest, cluster, members) + _api_basics()
    mine: set[tuple[str, str]] = set()
    for stream in _streams(manifest.reads, partitions):
        durables = [name for s, name in manifest.durables if stream in _streams([s], partitions)]
        mine |= {(stream, d) for d in durables}
        publish += _consumer_reads(stream, durables, f"reads {stream}")
        publish.append(Grant(subjects.dead(stream), f"dead-letters poison messages of {stream}"))
    for bucket in manifest.buckets:
        publish += _kv(bucket, write=True, why=f"its KV bucket {bucket}")
    for bucket in manifest.reads_buckets:
        publish += _kv(bucket, write=False, why=f"reads the KV bucket {bucket}")
    if manifest.leases:
        publish += _kv(lease_bucket(service), write=True, why="its leader leases")
    if manifest.snapshots:
        publish += _object_store(snapshot_bucket(service), "its state snapshots")
    for target in manifest.sends_commands:
        name = ">" if target == "*" else f"{subjects.token(target)}.>"
        publish.append(Grant(f"chamber.cmd.{name}", "sends commands (the one door: HTTP API to services)"))
    subscribe = [_inbox(user)]
    if manifest.commands:
        subscribe.append(Grant(f"chamber.cmd.{subjects.token(service)}.>", f"serves {service}'s commands"))
    deny = _others_durables(mine, every_durable(manifests, partitions))
    deny += [  # its own durables are its position: deleting one would restart or lose it
        Grant(f"$JS.API.CONSUMER.DELETE.{stream}.{name}", f"its durable consumer {stream}/{name} is never deleted")
        for stream, name in sorted(mine)
    ]
    return User(
        user,
        "service",
        Permissions.of(publish, subscribe, deny, allow_responses=manifest.commands),
        manifest.why,
    )


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n // 1024} KiB"


def _gate_limit(gate: StreamSpec) -> str:
    subjects_ = ", ".join(gate.subjects)
    return (
        f"{subjects_} (stream {gate.name}): at most {gate.max_msgs_per_subject} messages a subject in any "
        f"{gate.max_age_s:g} s, each at most {_size(gate.max_msg_size)}; {_size(gate.max_bytes or 0)} in all"
    )


AGENT_LIMITS = (
    *(_gate_limit(g) for g in GATES),
    "a subject is one node's one kind (samples, inventory, fabric, step timings, faults): a node that "
    "publishes faster is refused the excess (discard new per subject) and other nodes are not affected",
    "any message: the server's max_payload (1 MiB unless nats-server is told otherwise); a client that "
    "sends more is disconnected",
    "why streams: nats-server has no per-user publish rate, and no per-user message size in its "
    "configuration file; these limits hold whatever the agent's code does",
)


def _step_log_reads(cluster: str, node: str | None) -> list[Grant]:
    """Read one node's keys of the step-log bucket (None: any node's) through a consumer named for
    the node and filtered to its keys; the filter is in the API subject, so no other key is reachable."""
    stream = f"KV_{STEP_LOG_BUCKET}"
    name = step_log_consumer(node) if node is not None else "*"
    keys = f"$KV.{STEP_LOG_BUCKET}.{step_log_keys_of(cluster, node)}"
    why = "the step logs of the jobs on its node (the scheduler names them from workload annotations)"
    return [
        Grant(f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{keys}", why),
        Grant(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}", why),
        Grant(f"$JS.API.CONSUMER.DELETE.{stream}.{name}", why),
    ]


def agent_user(cluster: str, node: str) -> User:
    user = f"agent-{node}"
    return User(
        user,
        "agent",
        Permissions.of(
            [*_node_subjects(cluster, node), *_step_log_reads(cluster, node), *_agent_api()], [_inbox(user)]
        ),
        f"the node agent of {node}: its own node's samples, inventory, fabric and faults",
        AGENT_LIMITS,
    )


def shared_agent_user(cluster: str, name: str = "agent", why: str = "") -> User:
    return User(
        name,
        "agent",
        Permissions.of(
            [*_node_subjects(cluster, None), *_step_log_reads(cluster, None), *_agent_api()], [_inbox(name)]
        ),
        why or f"one user for every node agent of cluster {cluster}",
        (*AGENT_LIMITS, "one user for every node: it may name any node, so the per-node bounds do not hold it"),
    )


MEMBER_AGENTS = "agents-"  # + cluster: never `agent` nor `agent-<node>` (the fifth character differs)


def member_agent_name(cluster: str) -> str:
    return f"{MEMBER_AGENTS}{subjects.token(cluster)}"


def member_agent_user(cluster: str) -> User:
    """The node agents of a member cluster (an actuator-only install that also runs agents), logged in
    to the control plane's NATS: the shared agent's grants, for that cluster's subjects only."""
    return shared_agent_user(
        cluster,
        member_agent_name(cluster),
        f"one user for every node agent of member cluster {cluster}, reporting to this control plane",
    )


def member_clusters(cluster: str, actuator_clusters: Sequence[str]) -> list[str]:
    """The clusters named with --actuator-cluster other than this one (the control plane's own)."""
    own = subjects.token(cluster)
    return [c for c in dict.fromkeys(actuator_clusters) if subjects.token(c) != own]


def actuator_user(cluster: str, manifests: Mapping[str, Manifest] | None = None) -> User:
    """A cluster's dispatch actuator (services/dispatch/service.py `--actuator`): its cluster's
    offers, copy phases and heartbeat, nothing about another cluster; reads DISPATCH."""
    c = subjects.token(cluster)
    user = f"actuator-{c}"
    publish = [
        Grant(f"chamber.dispatch.offer.{c}.*", f"offers the workloads created in cluster {cluster}"),
        Grant(f"chamber.dispatch.copy.{c}.*", f"reports the copies cluster {cluster} holds"),
        Grant(f"chamber.dispatch.heartbeat.{c}", f"says cluster {cluster} is answering"),
        *_api_of([DISPATCH.name], "DISPATCH, the one stream it reads"),
        *_consumer_reads("DISPATCH", [], "reads DISPATCH (offers, decisions, copy phases)"),
        Grant(subjects.dead("DISPATCH"), "dead-letters poison messages of DISPATCH"),
    ]
    deny = _others_durables(set(), every_durable(manifests if manifests is not None else service_manifests()))
    return User(
        user,
        "actuator",
        Permissions.of(publish, [_inbox(user)], deny),
        f"the dispatch actuator of cluster {cluster}: its copies, its origins' offers, its heartbeat",
    )


def simulator_user(cluster: str, manifests: Mapping[str, Manifest] | None = None) -> User:
    """The simulated fleet replays JOBS with an ephemeral consumer at every start (its executor),
    reports job progress and serves `chamber.cmd.sim.*` (fault injection)."""
    publish = [
        *_node_subjects(cluster, None),
        Grant("chamber.jobs.*", "job progress of the simulated executor (JobStarted, JobCompleted)"),
        *_api_basics(),
        *_consumer_reads("JOBS", [], "reads JOBS (placements to run)"),
        Grant(subjects.dead("JOBS"), "dead-letters poison messages of JOBS"),
    ]
    deny = _others_durables(set(), every_durable(manifests if manifests is not None else service_manifests()))
    subscribe = [_inbox("simulator"), Grant(f"chamber.cmd.{SIM_COMMANDS}.>", "serves fault injection")]
    return User(
        "simulator",
        "simulator",
        Permissions.of(publish, subscribe, deny, allow_responses=True),
        f"the simulated fleet of cluster {cluster} and its job executor",
        (*AGENT_LIMITS, "one user for every node: it may name any node, so the per-node bounds do not hold it"),
    )


def reader_user(partitions: int = 1, manifests: Mapping[str, Manifest] | None = None) -> User:
    publish = [*_api_basics(), Grant("$JS.API.STREAM.LIST", "lists the streams")]
    for stream in _streams(EVENT_STREAMS, partitions):
        publish += _consumer_reads(stream, [], f"reads {stream}")
    core = [
        Grant(p, "core subscription to live events") for s in STREAMS if s.name in EVENT_STREAMS for p in s.subjects
    ]
    deny = _others_durables(
        set(), every_durable(manifests if manifests is not None else service_manifests(), partitions)
    )
    return User(
        "reader",
        "reader",
        Permissions.of(publish, [_inbox("reader"), *core], deny),
        "read-only external subscriber: every event stream, through consumers of its own",
    )


def setup_user() -> User:
    why = "sets up the streams and buckets (`chamber setup`): creates and updates, never deletes or purges"
    publish = [
        Grant("$JS.API.INFO", why),
        Grant("$JS.API.STREAM.NAMES", why),
        Grant("$JS.API.STREAM.LIST", why),
        Grant("$JS.API.STREAM.INFO.*", why),
        Grant("$JS.API.STREAM.CREATE.*", why),
        Grant("$JS.API.STREAM.UPDATE.*", why),
    ]
    return User("setup", "setup", Permissions.of(publish, [_inbox("setup")]), why)


def service_manifests(services: Sequence[str] | None = None) -> dict[str, Manifest]:
    """The `ROLE` manifests of the services found (all, or those named)."""
    from services.runtime.setup import service_manifests as found

    manifests = found()
    if services is None:
        return manifests
    unknown = sorted(set(services) - set(manifests))
    if unknown:
        raise UsageError(f"--service {', '.join(unknown)}: no such service (known: {', '.join(sorted(manifests))})")
    return {s: manifests[s] for s in services}


def users(
    cluster: str,
    *,
    services: Sequence[str] = DEFAULT_SERVICES,
    agent_nodes: Sequence[str] = (),
    shared_agent: bool = False,
    simulator: bool = False,
    telemetry_partitions: int = 1,
    setup: bool = True,
    actuator_clusters: Sequence[str] = (),
) -> list[User]:
    every = service_manifests()
    chosen = service_manifests(services)
    members = member_clusters(cluster, actuator_clusters)
    out = [service_user(s, m, cluster, every, telemetry_partitions, members) for s, m in chosen.items()]
    out += [agent_user(cluster, n) for n in agent_nodes]
    if shared_agent:
        out.append(shared_agent_user(cluster))
    out += [member_agent_user(c) for c in members]
    if simulator:
        out.append(simulator_user(cluster, every))
    out += [actuator_user(c, every) for c in dict.fromkeys(actuator_clusters)]
    out.append(reader_user(telemetry_partitions, every))
    if setup:
        out.append(setup_user())
    out.append(User("admin", "admin", None, "the operator's chamber CLI: everything"))
    _refuse_collisions(out)
    return out


def _refuse_collisions(users_: Sequence[User]) -> None:
    """Two roles under one name would share a password and the server would keep one of them."""
    seen: dict[str, User] = {}
    for user in users_:
        other = seen.setdefault(user.name, user)
        if other is not user:
            raise UsageError(
                f"NATS user {user.name!r} would be both {other.role} ({other.why}) and {user.role} ({user.why}): "
                "rename the node or cluster"
            )


# --- output ----------------------------------------------------------------------------------------


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


TITLES = {"publish": "may publish", "subscribe": "may subscribe", "deny": "may NOT publish (wins over the above)"}


def explain(user: User) -> str:
    """What a user may do and why, one subject a line."""
    lines = [f"{user.name} ({user.role}): {user.why}"]
    p = user.permissions
    if p is None:
        return "\n".join([*lines, "  may publish and subscribe to everything"])
    for kind, items in (("publish", p.publish), ("subscribe", p.subscribe), ("deny", p.deny_publish)):
        if not items:
            continue
        lines.append(f"  {TITLES[kind]}:")
        width = max((len(s) for s in items), default=0)
        lines += [f"    {s:<{width}}  {p.reasons.get(f'{kind} {s}', '')}" for s in items]
    if p.allow_responses:
        lines.append("  may answer requests it receives (allow_responses)")
    lines.append("  anything else: refused by the server")
    if user.limits:
        lines.append("  limits the server enforces on what it publishes:")
        lines += [f"    {line}" for line in user.limits]
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("nats-config", help="generate nats-server's authorization block from Chamber's roles")
    add_cluster_option(p)
    p.add_argument("--passwords", type=Path, metavar="DIR", help="one file per user name (required unless --explain)")
    p.add_argument("--create-missing", action="store_true", help="generate passwords missing from DIR")
    p.add_argument("--service", action="append", dest="services", metavar="NAME", help="repeatable (default: all)")
    p.add_argument("--agent-node", action="append", default=[], metavar="NODE", help="a per-node agent user")
    p.add_argument("--shared-agent", action="store_true", help="one agent user for any node of the cluster")
    p.add_argument("--simulator", action="store_true", help="a user for the simulated fleet")
    p.add_argument(
        "--actuator-cluster",
        action="append",
        default=[],
        metavar="CLUSTER",
        help="a dispatch actuator user for this cluster (actuator-CLUSTER; repeatable); another cluster than "
        "--cluster is a member: its node agents' user (agents-CLUSTER) and the services' grants for it",
    )
    p.add_argument("--out", type=Path, help="write here (default: stdout)")
    p.add_argument(
        "--explain",
        metavar="USER",
        help="print what USER (svc-scheduler, reader, agent-NODE, agents-CLUSTER, ...) may do and why, "
        "instead of the block",
    )
    p.add_argument(
        "--telemetry-partitions",
        default=os.environ.get("CHAMBER_TELEMETRY_PARTITIONS") or "1",
        metavar="N",
        help="node-sample partition streams the reader may read and services may not delete (default 1)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.runtime.partitions import parse_partitions

    for cluster in args.actuator_cluster:
        if not cluster or any(c.isspace() or c in "*>." for c in cluster):
            raise UsageError(f"--actuator-cluster {cluster!r}: give a cluster name")
    for node in args.agent_node:
        if not node or any(c.isspace() or c in "*>." for c in node):
            raise UsageError(f"--agent-node {node!r}: give a Kubernetes node name")
    explaining = args.explain is not None
    multi_cluster = bool(args.actuator_cluster) or (
        explaining and args.explain.startswith(("actuator-", "svc-dispatch"))
    )
    chosen = users(
        args.cluster,
        # with cluster actuators comes the dispatcher that they serve
        services=args.services or (*DEFAULT_SERVICES, *(MULTI_CLUSTER_SERVICES if multi_cluster else ())),
        agent_nodes=[
            *args.agent_node,
            *([args.explain[6:]] if explaining and args.explain.startswith("agent-") else []),
        ],
        shared_agent=args.shared_agent or (explaining and args.explain == "agent"),
        simulator=args.simulator or (explaining and args.explain == "simulator"),
        actuator_clusters=[
            *args.actuator_cluster,
            *([args.explain[9:]] if explaining and args.explain.startswith("actuator-") else []),
            *(
                [args.explain.removeprefix(MEMBER_AGENTS)]
                if explaining and args.explain.startswith(MEMBER_AGENTS)
                else []
            ),
        ],
        telemetry_partitions=parse_partitions(args.telemetry_partitions),
    )
    if explaining:
        found = {u.name: u for u in chosen}
        if args.explain not in found:
            raise UsageError(f"--explain {args.explain!r}: no such user (users: {', '.join(sorted(found))})")
        print(explain(found[args.explain]))
        return 0
    if args.passwords is None:
        raise UsageError("--passwords DIR is required (where each user's password is, or is created)")
    text = render(chosen, PasswordSource(args.passwords, create_missing=args.create_missing))
    if args.out is None:
        print(text, end="")
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds passwords
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return 0
