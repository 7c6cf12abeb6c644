"""Partitioned telemetry: node samples split over N streams by a NATS subject mapping on the node token.

One JetStream stream is bounded by its one RAFT leader, so a large fleet splits its hottest stream.
NATS documents how (https://docs.nats.io/nats-concepts/subject_mapping#deterministic-subject-token-partitioning):
the server rewrites every published subject with a mapping, here

    chamber.telemetry.sample.<c>.<n>  ->  chamber.telemetry.sample.<c>.<n>.<p>   p = partition(N, node)

and each partition p has its own stream, TELEMETRY_P<p>. A node always lands in the same partition
(so its samples stay in order), and the agent publishes as it always did: into its gate
(events/streams.py), which the same mapping splits alike (`chamber.ingest.telemetry.sample...`, one
gate AGENT_TELEMETRY_P<p> per partition). A consumer filtered on `chamber.telemetry.sample.>` still
receives every sample (the partition is one more trailing token); one on `chamber.telemetry.sample.*.*`
would not, so external tools use `>`.

With partitions the TELEMETRY stream keeps the other telemetry (inventories: five-token subjects,
`chamber.telemetry.*.*.*`, which never overlap the six-token partitioned samples). With one
partition (the default) nothing changes: no mapping, TELEMETRY holds everything.

A partition count that changes between restarts loses nothing: streams are added for new partitions,
and a stream no longer in the mapping receives nothing new but is read by every consumer until its
messages expire (TELEMETRY's max age). The mapping in the server and the count given to Chamber
must agree; `server_mapping` writes the server's side.
"""

from __future__ import annotations

import dataclasses
import re

from events.streams import INGEST_PREFIX, STREAMS, TELEMETRY, StreamSpec, with_gates

MAX_PARTITIONS = 64
SAMPLE_SUBJECT = "chamber.telemetry.sample.*.*"
UNPARTITIONED_SUBJECTS = ("chamber.telemetry.*.*.*",)  # kind.cluster.node: inventories (and old samples)
PREFIX = f"{TELEMETRY.name}_P"
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)$")


class PartitionError(ValueError):
    pass


def check_partitions(value: int) -> int:
    if not 1 <= value <= MAX_PARTITIONS:
        raise PartitionError(f"telemetry partitions must be between 1 and {MAX_PARTITIONS}, got {value}")
    return value


def partition_stream(index: int) -> str:
    return f"{PREFIX}{index}"


def partition_index(stream: str) -> int | None:
    """The partition a stream name stands for, None if it is not a partition stream."""
    match = _NAME.match(stream)
    return int(match.group(1)) if match else None


def partition_subject(index: int) -> str:
    return f"{SAMPLE_SUBJECT}.{index}"


def server_mapping(partitions: int) -> dict[str, str]:
    """The account mapping a nats-server needs (`mappings { ... }`); none for one partition."""
    if check_partitions(partitions) == 1:
        return {}
    # wildcard 1 is the cluster token, 2 the node token: a node keeps its partition. What agents
    # publish (the ingest prefix, into the gates) is split alike, each partition its own gate.
    destination = "chamber.telemetry.sample.{{wildcard(1)}}.{{wildcard(2)}}.{{partition(N,2)}}"
    destination = destination.replace("(N,", f"({partitions},")
    ingest = INGEST_PREFIX + SAMPLE_SUBJECT.removeprefix("chamber.")
    return {SAMPLE_SUBJECT: destination, ingest: INGEST_PREFIX + destination.removeprefix("chamber.")}


def server_mapping_conf(partitions: int) -> str:
    """The mapping as nats-server configuration text (empty for one partition)."""
    mapping = server_mapping(partitions)
    if not mapping:
        return ""
    body = "\n".join(f'  "{src}": "{dst}"' for src, dst in mapping.items())
    return f"mappings {{\n{body}\n}}\n"


def partition_of(node: str, partitions: int) -> int:
    """The partition nats-server's `partition(N, node)` picks: FNV-1a (32 bit) of the token, mod N."""
    h = 0x811C9DC5
    for byte in node.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def telemetry_specs(partitions: int, *, existing: int = 0) -> tuple[StreamSpec, ...]:
    """TELEMETRY and its partition streams for `partitions` (plus `existing` ones kept from a larger
    count before). TELEMETRY narrows to five-token subjects as soon as any partition stream exists."""
    check_partitions(partitions)
    count = max(partitions, existing) if partitions > 1 or existing else 0
    if count == 0:
        return (TELEMETRY,)
    narrowed = dataclasses.replace(TELEMETRY, subjects=UNPARTITIONED_SUBJECTS)
    parts = tuple(
        dataclasses.replace(
            TELEMETRY,
            name=partition_stream(i),
            subjects=(partition_subject(i),),
            description=f"GPU samples of the nodes in telemetry partition {i}",
        )
        for i in range(count)
    )
    return (narrowed, *parts)


def stream_specs(partitions: int, *, existing: int = 0) -> tuple[StreamSpec, ...]:
    """Every stream of the design, TELEMETRY split as `telemetry_specs` says, with the gates agents
    publish into (events/streams.py `with_gates`: split alike, each partition its own gate)."""
    rest = tuple(s for s in STREAMS if s.name != TELEMETRY.name)
    return with_gates((*telemetry_specs(partitions, existing=existing), *rest))
