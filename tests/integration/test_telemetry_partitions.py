"""Partitioned telemetry on a real nats-server whose configuration maps node samples to partitions
(`{{partition(4, node)}}`): each node lands in the stream nats-server's hash picks (an agent's
samples through that partition's gate), the recorder stores every partition once,
recorders share the partitions through leases, and a partition count changed between restarts
is explained and loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import subjects
from events.partitions import partition_of, partition_stream, partition_subject, server_mapping_conf
from events.streams import ENV_TELEMETRY_MAX_BYTES
from node_agent.outbox import Outbox
from node_agent.runner import envelope
from node_agent.spool import Kind, Record, Spool
from services.cli import main as chamber
from services.recorder.partitions import PartitionOwnership, fair_share
from services.runtime import Publisher, connect, ensure_streams
from services.runtime.health import HealthState
from services.runtime.nats_server import NatsServerProcess
from services.runtime.partitions import (
    existing_partitions,
    explain_change,
    explain_mapping,
    explain_unrouted,
    server_partitions,
    telemetry_inputs,
)
from services.warehouse.chdb_backend import ChdbWarehouse
from services.warehouse.migrations import migrate
from tests.builders import a_node_sample
from tests.integration.test_recorder_pipeline import start_recorder
from tests.integration.test_runtime import eventually

pytestmark = pytest.mark.integration
NODES = [f"node-{i:02d}" for i in range(12)]


def mapped_server(tmp_path: Path, partitions: int, store: Path) -> NatsServerProcess:
    conf = tmp_path / f"mapping-{partitions}.conf"
    conf.write_text(server_mapping_conf(partitions) or "# no mapping\n")
    return NatsServerProcess(store, log_file=tmp_path / "nats-server.log", extra_args=["-c", str(conf)])


@pytest.fixture
def four(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NatsServerProcess]:
    monkeypatch.setenv("CHAMBER_TELEMETRY_PARTITIONS", "4")
    server = mapped_server(tmp_path, 4, tmp_path / "jetstream")
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
async def pnc(four: NatsServerProcess) -> AsyncIterator[Client]:
    nc = await connect(four.url, name="test")
    try:
        yield nc
    finally:
        await nc.close()


NOW = time.time()


def sample(node: str, seq: int) -> Any:
    """A recent sample (the raw table keeps 30 days), one second apart per node."""
    return msgspec.structs.replace(a_node_sample(node, seq=seq, gpus=2, cluster="c1"), observed_at=NOW + seq)


async def test_each_node_lands_in_its_partition_and_plain_subscribers_still_see_every_sample(pnc: Client) -> None:
    js = pnc.jetstream()
    changed = await ensure_streams(js)
    assert {f"added {partition_stream(i)}" for i in range(4)} <= set(changed)
    seen: list[str] = []

    async def on(msg: Any) -> None:
        seen.append(msg.subject)

    await pnc.subscribe("chamber.telemetry.sample.>", cb=on)
    publisher = Publisher(js, source="test")
    for node in NODES:
        ack = await publisher.publish(sample(node, 0))
        assert ack.stream == partition_stream(partition_of(node, 4)), node
    await eventually(lambda: len(seen) == len(NODES))
    assert {s.rsplit(".", 2)[1] for s in seen} == set(NODES)
    assert len({partition_of(n, 4) for n in NODES}) > 1  # the nodes really are spread
    assert [s for s, _ in await telemetry_inputs(js)] == ["TELEMETRY", *(partition_stream(i) for i in range(4))]


async def test_the_telemetry_byte_cap_is_the_total_over_the_partition_streams(
    pnc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    cap = 10 * 2**20
    monkeypatch.setenv(ENV_TELEMETRY_MAX_BYTES, str(cap))
    js = pnc.jetstream()
    await ensure_streams(js)
    names = ["TELEMETRY", *(partition_stream(i) for i in range(4))]
    caps = {name: (await js.stream_info(name)).config.max_bytes for name in names}
    assert caps == dict.fromkeys(names, cap // 5)  # TELEMETRY (inventories) and 4 partitions
    assert sum(caps.values()) <= cap
    assert await ensure_streams(js) == []  # a second service with the same settings changes nothing


async def test_the_recorder_stores_every_partition_once(pnc: Client, four: NatsServerProcess, tmp_path: Path) -> None:
    js = pnc.jetstream()
    await ensure_streams(js)
    publisher = Publisher(js, source="test")
    await publisher.publish_many((sample(node, seq), f"{node}-{seq}", None) for node in NODES for seq in range(5))
    warehouse = ChdbWarehouse(tmp_path)
    migrate(warehouse)
    stop, task, writer = await start_recorder(four.url, warehouse)
    try:
        await eventually(lambda: warehouse.count("gpu_samples") == len(NODES) * 5 * 2, within=30)
        assert warehouse.query("SELECT uniqExact(node) FROM gpu_samples").scalar() == len(NODES)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        writer.close()
        warehouse.close()


async def test_recorders_share_the_partitions_and_take_over_a_dead_ones(pnc: Client) -> None:
    js = pnc.jetstream()
    await ensure_streams(js)
    streams = [partition_stream(i) for i in await existing_partitions(js)]
    owners: dict[str, set[str]] = {"a": set(), "b": set()}

    def ownership(holder: str) -> PartitionOwnership:
        async def start(stream: str) -> None:
            owners[holder].add(stream)

        async def stop(stream: str) -> None:
            owners[holder].discard(stream)

        return PartitionOwnership(js, streams, holder, start=start, stop=stop, ttl_s=1.5)

    a, b = ownership("a"), ownership("b")
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    running_a = asyncio.create_task(a.run(stop_a))
    await eventually(lambda: owners["a"] == set(streams), within=10)  # alone: all of them
    running_b = asyncio.create_task(b.run(stop_b))

    def balanced() -> bool:
        return len(owners["a"]) == len(owners["b"]) == 2 and owners["a"].isdisjoint(owners["b"])

    await eventually(balanced, within=15)
    stop_a.set()  # a stops: it gives its leases back, b takes them
    await running_a
    await eventually(lambda: owners["b"] == set(streams) and not owners["a"], within=10)
    stop_b.set()
    await running_b
    assert fair_share(4, 3) == 2 and fair_share(4, 1) == 4


async def test_a_partition_count_changed_between_restarts_is_explained_and_loses_nothing(
    four: NatsServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nc = await connect(four.url, name="test")
    js = nc.jetstream()
    await ensure_streams(js)
    publisher = Publisher(js, source="test")
    await publisher.publish_many((sample(node, 0), f"{node}-before", None) for node in NODES)
    await nc.close()
    four.kill()

    # the operator goes to 2 partitions: the server's mapping and the services' count change together
    monkeypatch.setenv("CHAMBER_TELEMETRY_PARTITIONS", "2")
    two = mapped_server(tmp_path, 2, four.store_dir)
    two.port, two.monitor_port = four.port, four.monitor_port
    two.start()
    try:
        nc = await connect(two.url, name="test")
        js: JetStreamContext = nc.jetstream()
        assert await ensure_streams(js) == []  # no stream dropped or narrowed: P2 and P3 are kept
        existing = await existing_partitions(js)
        assert existing == [0, 1, 2, 3]
        note = explain_change(2, existing)
        assert note is not None and "TELEMETRY_P2, TELEMETRY_P3 receive no new samples" in note
        assert "nothing is lost" in note
        publisher = Publisher(js, source="test")
        for node in NODES:  # new samples follow the new mapping
            ack = await publisher.publish(sample(node, 1), id=f"{node}-after")
            assert ack.stream == partition_stream(partition_of(node, 2))
        # every consumer reads all four partition streams: all samples, before and after, are there
        total = 0
        for stream, _ in await telemetry_inputs(js, samples_only=True):
            total += (await js.stream_info(stream)).state.messages
        assert total == 2 * len(NODES)
        await nc.close()
    finally:
        two.kill()


async def test_with_roles_an_agent_publishes_into_its_partitions_gate_and_the_reader_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAMBER_TELEMETRY_PARTITIONS", "4")
    passwords = tmp_path / "passwords"
    argv = ["nats-config", "--cluster", "c1", "--passwords", str(passwords), "--create-missing"]
    argv += ["--agent-node", "node-03", "--telemetry-partitions", "4", "--out", str(tmp_path / "auth.conf")]
    assert chamber(argv) == 0
    (tmp_path / "nats.conf").write_text(server_mapping_conf(4) + 'include "auth.conf"\n')
    server = NatsServerProcess(tmp_path / "js", extra_args=["-c", str(tmp_path / "nats.conf")])
    server.start()

    def url(user: str) -> str:
        return f"nats://{user}:{(passwords / user).read_text()}@127.0.0.1:{server.port}"

    try:
        admin = await connect(url("admin"), name="admin")
        await ensure_streams(admin.jetstream())
        reader = await connect(url("reader"), name="reader")
        seen: list[str] = []

        async def on(msg: Any) -> None:
            seen.append(msg.subject)

        await reader.subscribe("chamber.telemetry.sample.>", cb=on)
        agent = await connect(url("agent-node-03"), name="agent")
        event = sample("node-03", 0)
        ack = await Publisher(agent.jetstream(), source="agent").publish(
            event, subject=subjects.ingest(subjects.subject_for(event))
        )
        p = partition_of("node-03", 4)
        assert ack.stream == f"AGENT_{partition_stream(p)}"  # the partition's gate
        pull = await reader.jetstream().pull_subscribe(partition_subject(p), durable=None, stream=partition_stream(p))
        [msg] = await pull.fetch(1, timeout=5)
        assert msg.subject == f"chamber.telemetry.sample.c1.node-03.{p}"
        # the stream copied it from the gate: nothing went out on the core subject
        assert seen == []
        for nc in (agent, reader, admin):
            await nc.close()
    finally:
        server.kill()


async def test_a_server_mapping_more_partitions_than_streams_exist_is_explained_and_nothing_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAMBER_TELEMETRY_PARTITIONS", "2")  # the services made 2 partition streams ...
    server = mapped_server(tmp_path, 4, tmp_path / "jetstream")  # ... the server maps 4
    server.start()
    stop = asyncio.Event()
    try:
        nc = await connect(server.url, name="agent")
        js = nc.jetstream()
        await ensure_streams(js)
        node = next(n for n in NODES if partition_of(n, 4) >= 2)  # a node mapped past the streams
        p = partition_of(node, 4)
        spool = Spool(tmp_path / "spool")
        outbox = Outbox(spool, ack_timeout_s=2.0, on_reconnect=lambda: ensure_streams(js))
        health = HealthState(service="agent", nc=nc, checks=[lambda: outbox.problem])  # as the agent wires it
        outbox.attach(nc)
        pump = asyncio.create_task(outbox.run(stop, retry_s=0.05))
        event = sample(node, 0)
        outbox.submit([Record(int(Kind.SAMPLE), subjects.sample("c1", node), *envelope(event, "t", f"{node}/0", NOW))])

        await eventually(lambda: outbox.problem is not None, within=20)
        problem = outbox.problem or ""
        assert f"maps chamber.telemetry.sample.c1.{node} to partition {p}" in problem, problem
        assert (
            f"at least {p + 1} partitions, but only 2 partition streams exist (TELEMETRY_P0..TELEMETRY_P1)" in problem
        )
        assert "CHAMBER_TELEMETRY_PARTITIONS" in problem and "partition(2, node)" in problem
        assert outbox.published == 0 and not spool.empty()  # spooled, not dropped
        live, ready, body = health.report()
        assert live and not ready and body["problems"] == [problem]

        # The operator's view: `chamber streams` learns the server's count from probes no stream stores.
        assert await server_partitions(nc) == 4
        out = await asyncio.to_thread(lambda: _cli(["streams", "--nats", server.url]))
        assert "telemetry partitions: server mapping 4, configured 2, partition streams 2" in out, out
        assert "maps node samples to 4 partitions, but 2 partition streams exist" in out
        assert "CHAMBER_TELEMETRY_PARTITIONS=4" in out

        monkeypatch.setenv("CHAMBER_TELEMETRY_PARTITIONS", "4")  # the fix: the services follow the server
        await ensure_streams(js)
        assert await outbox.drained(20)
        assert outbox.problem is None and health.report()[1]

        # the sample, once (the stream copies it from its gate); the diagnosis's probe was never stored
        async def copied_once() -> bool:
            return (await js.stream_info(partition_stream(p))).state.messages == 1

        await eventually(copied_once)
        assert await server_partitions(nc) == 4  # probes with every stream in place: still none stored
        assert [(await js.stream_info(partition_stream(i))).state.messages for i in range(4)].count(0) >= 3
        stop.set()
        await asyncio.wait_for(pump, 10)
        await nc.close()
    finally:
        stop.set()
        server.kill()


def _cli(argv: list[str]) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert chamber(argv) == 0
    return buffer.getvalue()


async def test_without_a_mapping_the_server_has_one_partition(nats_server: NatsServerProcess, nc: Client) -> None:
    assert await server_partitions(nc) == 1


def test_a_mapping_and_streams_that_disagree_are_explained_with_both_numbers() -> None:
    assert explain_mapping(4, 4, [0, 1, 2, 3]) is None
    assert explain_mapping(1, 1, []) is None
    more = explain_mapping(8, 4, [0, 1, 2, 3]) or ""
    assert "maps node samples to 8 partitions, but 4 partition streams exist" in more
    assert "partitions 4..7 spool" in more and "CHAMBER_TELEMETRY_PARTITIONS=8" in more
    fewer = explain_mapping(1, 4, [0, 1, 2, 3]) or ""
    assert "maps node samples to 1 partition(s)" in fewer and "Nothing is lost" in fewer


def test_an_agent_that_may_not_probe_still_says_the_mapping_outruns_the_streams() -> None:
    """With roles an agent may not subscribe, so the probe does not come back: a sample with no stream
    can only mean a partition past the streams (unmapped, it would land in TELEMETRY)."""
    line = explain_unrouted("chamber.telemetry.sample.c1.node-03", None, [0, 1], 2)
    assert "more than the 2 partition streams that exist (TELEMETRY_P0..TELEMETRY_P1)" in line
    assert "CHAMBER_TELEMETRY_PARTITIONS" in line and "partition(2, node)" in line
