"""NCCL RAS: the asyncio client against a fake RAS server on loopback replaying transcripts in the formats
of NCCL's RAS guide (tests/data/nccl_ras/); a hang (counts frozen across 3 queries) is flagged within
three query intervals; a transient MISMATCH while counts advance gives no alert; PEER_DEAD isolates the
dead process's node (and so requeues its job) within 65 s of the peer stopping."""

from __future__ import annotations

import asyncio

import pytest

from events.fabric import FabricSample, JobSlowdownDetected
from events.faults import FaultKind, GpuFaultDetected
from events.fleet import NodeDiscovered, NodeIsolated
from events.jobs import JobScheduled, Placement
from events.telemetry import GpuInfo
from node_agent import ras_watch
from node_agent.ras import RasClient, RasError, parse_diagnostics, parse_monitor, parse_status_text
from node_agent.ras_poller import RasPoller
from services.health import core as health
from services.health.policy import load_policy
from services.perf import core as perf
from tests.ras_fake import FakeRas, transcript

NODES = {"n1": "10.20.0.12", "n2": "10.20.0.13"}


# --- parsing the documented formats ----------------------------------------------------------------


def test_the_text_status_of_a_healthy_job_lists_its_communicator_group_running_ok() -> None:
    status = parse_status_text(transcript("status_ok.txt"))
    assert [(c.comm, c.status, c.errors) for c in status.comms] == [("#0", "RUNNING", ())]
    assert status.dead == []


def test_a_text_mismatch_names_the_communicator_hash_and_the_highest_operation() -> None:
    status = parse_status_text(transcript("status_mismatch_1.txt"))
    (comm,) = status.comms
    assert (comm.comm, comm.status, comm.errors, comm.ops) == ("5c1e9a07d2b43f18", "RUNNING", ("MISMATCH",), 7137)


def test_incomplete_is_not_dead_and_dead_names_the_process_node_and_gpu() -> None:
    incomplete = parse_status_text(transcript("status_incomplete.txt"))
    assert incomplete.dead == [] and incomplete.comms[0].errors == ("INCOMPLETE",)
    dead = parse_status_text(transcript("status_dead.txt"))
    assert [(p.host, p.pid, p.gpus) for p in dead.dead] == [("10.20.0.13", 702245, (5,))]


def test_monitor_peer_dead_reads_in_text_and_json_and_diagnostics_lines_parse() -> None:
    import json

    text = parse_monitor(transcript("monitor.txt").splitlines()[2])
    js = parse_monitor(json.loads(transcript("monitor.json")))
    assert text == js and text is not None and (text.host, text.pid, text.gpus) == ("10.20.0.13", 702245, (5,))
    assert parse_monitor("RAS Monitor Mode - watching for peer changes (Ctrl+C to exit)...") is None
    lines = parse_diagnostics(transcript("diagnostics.txt"))
    assert [d.level for d in lines] == ["OK", "OK", "INFO"] and "NCCL_IB_HCA" in lines[2].text
    with pytest.raises(RasError, match="BUSY"):
        parse_diagnostics("BUSY: diagnostics already in progress\n")


# --- the client on the wire ------------------------------------------------------------------------


async def test_the_client_handshakes_sets_json_and_sums_the_ranks_collective_counts() -> None:
    fake = await FakeRas(json=[transcript("status_1.json")]).start()
    try:
        status = await RasClient(port=fake.port).status("json")
    finally:
        await fake.close()
    assert fake.commands[:3] == ["CLIENT PROTOCOL 2", "SET FORMAT json", "STATUS"]
    (comm,) = status.comms
    # per rank: Broadcast 2 + AllGather 2050 + ReduceScatter 2050 + AllReduce 4100 (+1 on odd ranks)
    assert comm.comm == "0x5c1e9a07d2b43f18" and comm.ops == 8 * (2 + 2050 + 2050 + 4100) + 4
    assert comm.status == "RUNNING" and comm.errors == ()


async def test_an_nccl_without_json_is_read_in_text_and_a_closed_port_is_a_clear_error() -> None:
    fake = await FakeRas(text=[transcript("status_mismatch_1.txt")], json_supported=False).start()
    try:
        status = await RasClient(port=fake.port).status_any()
        diag = FakeRas(diagnostics=transcript("diagnostics.txt"))
        await diag.start()
        lines = await RasClient(port=diag.port).diagnostics()
        await diag.close()
    finally:
        await fake.close()
    assert status.format == "text" and status.comms[0].ops == 7137 and len(lines) == 3
    with pytest.raises(RasError, match="not reachable"):
        await RasClient(port=fake.port, timeout_s=0.5).status()


# --- hang, transient mismatch, dead peer through the perf and health cores --------------------------


def _perf_with_job() -> perf.PerfState:
    state = perf.PerfState()
    placements = [Placement(cluster="c", node=n, gpu_indices=list(range(8))) for n in NODES]
    perf.evolve(state, JobScheduled(job_id="train", at=0.0, team="t", placements=placements, pool="default"))
    return state


def _sample(poller: RasPoller, node: str, t: float) -> FabricSample:
    return FabricSample(
        cluster="c",
        node=node,
        seq=int(t),
        observed_at=t,
        interval_s=5.0,
        nics=[],
        comms=poller.comms() or [],
        dead_peers=poller.take_dead(),
        addresses=[NODES[node]],
    )


async def _polled(fake: FakeRas, queries: int, interval: float = 5.0) -> tuple[perf.PerfState, list[float]]:
    """`queries` STATUS queries `interval` s apart; each answer goes into a fabric sample of n1."""
    t = [1000.0]
    poller = RasPoller(client=RasClient(port=fake.port), interval_s=interval, clock=lambda: t[0])
    state = _perf_with_job()
    flagged = []
    for q in range(queries):
        t[0] = 1000.0 + q * interval
        await poller.poll_once()
        perf.evolve(state, _sample(poller, "n1", t[0]))
        for event, _ in perf.decide(state, t[0]):
            perf.evolve(state, event)
            if isinstance(event, JobSlowdownDetected):
                flagged.append(t[0])
                assert event.pattern == "nccl_hang" and event.culprit.value == "unknown"
    return state, flagged


@pytest.mark.parametrize("fmt", ["json", "text"])
async def test_counts_frozen_across_three_queries_are_a_hang_flagged_within_three_intervals(fmt: str) -> None:
    # the counts advance once (query 0 -> 1), then stop: queries 1, 2, 3 show the same counts
    if fmt == "json":
        fake = FakeRas(json=[transcript("status_1.json"), transcript("status_2.json")])
    else:
        fake = FakeRas(
            text=[transcript("status_mismatch_1.txt"), transcript("status_mismatch_2.txt")], json_supported=False
        )
    await fake.start()
    try:
        _, flagged = await _polled(fake, queries=6)
    finally:
        await fake.close()
    last_advance = 1005.0
    assert flagged and flagged[0] - last_advance <= 3 * 5.0
    assert len(flagged) == 1  # one episode, not one per query


async def test_a_transient_mismatch_while_counts_advance_gives_no_alert() -> None:
    answers = [transcript(f"status_mismatch_{n}.txt") for n in (1, 2, 3)]
    fake = await FakeRas(text=answers, json_supported=False).start()
    try:
        state, flagged = await _polled(fake, queries=3)
    finally:
        await fake.close()
    assert flagged == [] and state.jobs["train"].hang is None
    w = ras_watch.RasWatch()
    for text in answers:
        ras_watch.observe(w, parse_status_text(text), 0.0)
    assert w.comms[0].errors == ["MISMATCH"] and w.comms[0].frozen_queries == 1


@pytest.mark.parametrize("fmt", ["json", "text"])
async def test_peer_dead_on_monitor_isolates_its_node_within_65_s_of_the_peer_stopping(fmt: str) -> None:
    stopped_at = 1000.0
    declared_at = stopped_at + 60.0  # NCCL RAS declares a process dead after 60 s unreachable
    chunk = transcript("monitor.json") if fmt == "json" else transcript("monitor.txt").splitlines()[2] + "\n"
    fake = await FakeRas(monitor=[(0.05, chunk)], json_supported=(fmt == "json")).start()
    t = [stopped_at]
    poller = RasPoller(client=RasClient(port=fake.port), clock=lambda: t[0])
    stop = asyncio.Event()
    pstate = _perf_with_job()
    hstate = health.new_state(load_policy())
    for n in NODES:
        gpus = [GpuInfo(index=i, uuid=f"GPU-{n}-{i}", model="H100-80GB") for i in range(8)]
        health.evolve(hstate, NodeDiscovered(cluster="c", node=n, at=0.0, gpus=gpus))
    for n in NODES:  # both agents report their addresses before anything happens
        perf.evolve(pstate, _sample(poller, n, stopped_at))
    task = asyncio.create_task(poller._monitor(stop))
    try:
        t[0] = declared_at
        for _ in range(100):  # the MONITOR line arrives over the socket
            await asyncio.sleep(0.05)
            if poller.watch.dead:
                break
        isolated = None
        now = declared_at
        while isolated is None and now <= stopped_at + 65.0:
            now += 1.0  # the agent's next 1 Hz fabric sample, then perf and health decide
            perf.evolve(pstate, _sample(poller, "n1", now))
            faults = []
            for event, _ in perf.decide(pstate, now):
                perf.evolve(pstate, event)
                if isinstance(event, GpuFaultDetected):
                    faults.append(event)
            for f in faults:
                assert f.kind is FaultKind.NCCL_PEER_DEAD and f.node == "n2" and f.gpu_index is None
                health.evolve(hstate, f)
            for d in health.decide(hstate, now):
                health.evolve(hstate, d)
                if isinstance(d.event, NodeIsolated):
                    isolated = (now, d)
    finally:
        stop.set()
        task.cancel()
        await fake.close()
    assert isolated is not None, "no isolation within 65 s"
    at, decision = isolated
    assert decision.node == "n2" and decision.action == "isolate_node" and at - stopped_at <= 65.0
    # the scheduler requeues the jobs of an isolated node (services/scheduler/core/state.py, NodeIsolated)
    assert perf.decide(pstate, at + 1.0) == []  # reported once


async def test_a_dead_peer_in_the_json_status_is_reported_once() -> None:
    fake = await FakeRas(json=[transcript("status_missing.json"), transcript("status_dead.json")]).start()
    try:
        poller = RasPoller(client=RasClient(port=fake.port), clock=lambda: 5.0)
        await poller.poll_once()
        assert poller.take_dead() == []  # unresponsive, not yet dead
        await poller.poll_once()
        await poller.poll_once()
        dead = poller.take_dead()
    finally:
        await fake.close()
    assert [(d.host, d.pid, d.gpus) for d in dead] == [("10.20.0.13", 611205, [1])]
