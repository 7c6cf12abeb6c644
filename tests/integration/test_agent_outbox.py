"""The outbox with a real nats-server: spooling while NATS is unreachable, shedding samples before
faults when the spool is full, flushing in order, and JetStream dropping what is sent twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from events import FaultKind, GpuFaultDetected, Severity, subjects
from node_agent.outbox import Outbox
from node_agent.runner import envelope
from node_agent.spool import Kind, Record, Spool
from services.runtime import connect, ensure_streams
from tests.builders import a_node_sample
from tests.integration.test_agent_fleet import read_stream
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration


def sample_record(seq: int) -> Record:
    event = a_node_sample("n1", seq=seq, cluster="c1")
    return Record(int(Kind.SAMPLE), subjects.sample("c1", "n1"), *envelope(event, "test", f"c1/n1/{seq}", 1.0 + seq))


def fault_record(seq: int) -> Record:
    fid = f"c1/n1/{seq}/fault/0"
    event = GpuFaultDetected(
        fault_id=fid, cluster="c1", node="n1", kind=FaultKind.ECC_DBE, severity=Severity.CRITICAL,
        observed_at=1.0 + seq, gpu_index=0,
    )  # fmt: skip
    return Record(int(Kind.FAULT), subjects.faults("c1", "n1"), *envelope(event, "test", fid, 1.0 + seq))


async def test_an_outage_that_overflows_the_spool_loses_old_samples_never_faults(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    spool = Spool(tmp_path, max_bytes=60_000, segment_bytes=8192)
    outbox = Outbox(spool, on_reconnect=lambda: ensure_streams(js))
    stop = asyncio.Event()
    pump = asyncio.create_task(outbox.run(stop, retry_s=0.05))
    offered = []
    for seq in range(120):  # NATS "unreachable": the outbox has no connection yet
        offered.append(sample_record(seq))
        if seq % 10 == 0:
            offered.append(fault_record(seq))
        outbox.submit(offered[-1:] if seq % 10 else offered[-2:])
        await asyncio.sleep(0)
    await asyncio.sleep(0.2)
    assert outbox.published == 0 and not spool.empty()
    assert spool.stats.dropped_samples > 0 and spool.stats.dropped_faults == 0

    nc = await connect(nats_server.url_for("agent"), name="agent")
    outbox.attach(nc)
    assert await outbox.drained(15)
    faults = await read_stream(js, "chamber.faults.c1.n1", expect=12)
    samples = await read_stream(js, "chamber.telemetry.sample.c1.n1", expect=120 - spool.stats.dropped_samples)
    assert [f.observed_at for f in faults] == [1.0 + s for s in range(0, 120, 10)]  # type: ignore[attr-defined]
    seqs = [s.seq for s in samples]  # type: ignore[attr-defined]
    assert seqs == list(range(120 - len(seqs), 120))  # the newest samples, in order
    assert len(seqs) + spool.stats.dropped_samples == 120

    published = [r for r in offered if r.kind == Kind.FAULT or int(r.msg_id.split("/")[2]) in seqs]
    outbox.submit(published)  # sent again (acks that were lost): JetStream drops the duplicates
    assert await outbox.drained(15)
    assert len(await read_stream(js, "chamber.telemetry.sample.c1.n1")) == len(seqs)
    assert len(await read_stream(js, "chamber.faults.c1.n1")) == 12
    stop.set()
    await pump
    await nc.close()


async def test_a_record_the_server_refuses_for_good_is_dropped_and_counted_and_the_rest_goes_on(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    """A fault over FAULTS' size limit (the stream refuses it) and a sample over the server's
    max_payload (the server would close the connection) would be refused at every retry: each is
    dropped and counted, and the records around them still arrive, in order, under the agent's user."""
    from events.streams import FAULTS

    spool = Spool(tmp_path)
    outbox = Outbox(spool)
    big = fault_record(1)
    too_big_for_faults = Record(big.kind, big.subject, big.headers, big.body + b" " * FAULTS.max_msg_size)
    nc = await connect(nats_server.url_for("agent"), name="agent")
    over_payload = Record(int(Kind.SAMPLE), subjects.sample("c1", "n1"), {}, b"x" * nc.max_payload)
    outbox.attach(nc)
    stop = asyncio.Event()
    pump = asyncio.create_task(outbox.run(stop, retry_s=0.05))
    try:
        outbox.submit([sample_record(0), too_big_for_faults, fault_record(2), over_payload, sample_record(3)])
        assert await outbox.drained(10)
        assert (outbox.refused, outbox.published) == (2, 3)
        assert [s.seq for s in await read_stream(js, "chamber.telemetry.sample.c1.n1", expect=2)] == [0, 3]  # type: ignore[attr-defined]
        assert [f.observed_at for f in await read_stream(js, "chamber.faults.c1.n1", expect=1)] == [3.0]  # type: ignore[attr-defined]
        assert nc.is_connected and spool.empty()
    finally:
        stop.set()
        await pump
        await nc.close()


async def test_a_backlog_over_the_gates_rate_is_refused_then_sent_again_in_order_losing_nothing(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    """A node's backlog (an outage's spool) larger than its gate takes in one window: the server
    refuses the excess, the outbox waits and sends it again in small batches, and every sample
    reaches TELEMETRY once, in order. (The gate is narrowed to 40 a second so the test is short.)"""
    from dataclasses import replace

    from events.streams import AGENT_TELEMETRY

    narrow = replace(AGENT_TELEMETRY, max_age_s=1.0, duplicate_window_s=1.0, max_msgs_per_subject=40)
    assert await ensure_streams(js, [narrow]) == ["updated AGENT_TELEMETRY"]
    spool = Spool(tmp_path)
    outbox = Outbox(spool, throttle_s=0.2)
    backlog = [sample_record(seq) for seq in range(130)]
    outbox.submit(backlog)  # no connection yet: all of it spooled, as after an outage
    stop = asyncio.Event()
    pump = asyncio.create_task(outbox.run(stop, retry_s=0.05))
    nc = await connect(nats_server.url_for("agent"), name="agent")
    try:
        await asyncio.sleep(0.1)
        assert not spool.empty()
        outbox.attach(nc)
        assert await outbox.drained(9)
        assert outbox.throttled > 0 and outbox.refused == 0 and outbox.published == 130
        samples = await read_stream(js, "chamber.telemetry.sample.c1.n1", expect=130)
        assert [s.seq for s in samples] == list(range(130))  # type: ignore[attr-defined]
    finally:
        stop.set()
        await pump
        await nc.close()
