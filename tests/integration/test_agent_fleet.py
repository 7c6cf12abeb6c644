"""The simulated fleet against a real nats-server: it feeds JetStream, takes injected faults over
request/reply, and executes the jobs placed on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from msgspec.structs import replace
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import (
    GpuFaultDetected,
    JobCompleted,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeInventory,
    NodeSample,
    Placement,
    decode,
)
from node_agent.agent import Agent, AgentOptions
from node_agent.runner import NodeRunner
from services.runtime import Publisher
from services.runtime.commands import CommandRefused, CommandUnavailable, request
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration


async def read_stream(js: JetStreamContext, subject: str, *, expect: int | None = None) -> list[object]:
    """Every event on `subject` now in its stream, in stream order (an ephemeral ordered read).
    With `expect`, read again (for up to 5 s) until that many are there: streams that copy a gate
    (`sources`) receive what the gate accepted asynchronously; the caller then asserts on the contents."""
    events = await _read_once(js, subject)
    for _ in range(50):
        if expect is None or len(events) >= expect:
            break
        await asyncio.sleep(0.1)
        events = await _read_once(js, subject)
    return events


async def _read_once(js: JetStreamContext, subject: str) -> list[object]:
    sub = await js.pull_subscribe(subject, durable=None)
    events: list[object] = []
    try:
        while True:
            try:
                msgs = await sub.fetch(1000, timeout=0.5)
            except TimeoutError:
                break
            for m in msgs:
                events.append(decode(m.headers, m.data).event)
                await m.ack()
            if len(msgs) < 1000:
                break
    finally:
        await sub.unsubscribe()
    return events


@pytest.fixture
async def fleet(nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path) -> AsyncIterator[Agent]:
    # `js`: the streams exist first, as the services make them; the simulator may not create them
    opts = AgentOptions(
        nats=nats_server.url_for("simulator"), cluster="c1", node="sim", interval_s=0.1, spool_dir=tmp_path / "spool",
        simulate=True, nodes=3, gpus_per_node=4, gpu_model="H100-80GB", seed=3,
    )  # fmt: skip
    agent = Agent(opts)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield agent
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def _more_samples(agent: Agent, n: int, of: NodeRunner | None = None) -> None:
    """Wait until a node (the first, or `of`) has taken `n` more samples: time passes, on the fleet's clock."""
    runner = of or agent.runners[0]
    target = runner.seq + n
    await eventually(lambda: runner.seq >= target)


async def answers(nc: Client) -> bool:
    try:
        await request(nc, "sim", "inject", {"node": "sim-000", "kind": "clear"}, timeout=0.5)
    except CommandUnavailable:
        return False
    return True


async def test_the_simulated_fleet_announces_inventory_and_samples_every_node(
    fleet: Agent, js: JetStreamContext
) -> None:
    await eventually(lambda: fleet.outbox.published >= 3 * 10)
    samples = [
        e for e in await read_stream(js, "chamber.telemetry.sample.c1.*", expect=24) if isinstance(e, NodeSample)
    ]
    inventories = [
        e for e in await read_stream(js, "chamber.telemetry.inventory.c1.*", expect=3) if isinstance(e, NodeInventory)
    ]
    assert {s.node for s in samples} == {"sim-000", "sim-001", "sim-002"}
    assert sorted({i.node for i in inventories}) == ["sim-000", "sim-001", "sim-002"]
    assert all(i.simulated and len(i.gpus) == 4 and i.gpus[0].model == "H100-80GB" for i in inventories)
    per_node = [s.seq for s in samples if s.node == "sim-001"]
    assert per_node == list(range(len(per_node)))


async def test_an_injected_fault_reaches_the_faults_stream_once_and_bad_ones_are_refused(
    fleet: Agent, nc: Client, js: JetStreamContext
) -> None:
    await eventually(lambda: answers(nc))
    result = await request(nc, "sim", "inject", {"node": "sim-002", "kind": "ecc_dbe", "gpu": 1})
    assert result["node"] == "sim-002" and result["gpu"] == 1
    await request(nc, "sim", "inject", {"node": "sim-000", "kind": "xid", "gpu": 3, "xid": 79})

    async def both_faults() -> bool:
        faults = await read_stream(js, "chamber.faults.c1.>")
        return len(faults) >= 2

    await eventually(both_faults)
    await _more_samples(fleet, 5)  # the faults persist for five more samples per node: still one fault each
    faults = [f for f in await read_stream(js, "chamber.faults.c1.>") if isinstance(f, GpuFaultDetected)]
    assert sorted((f.node, f.kind, f.gpu_index, f.xid) for f in faults) == [
        ("sim-000", "xid", 3, 79),
        ("sim-002", "ecc_dbe", 1, None),
    ]
    with pytest.raises(CommandRefused) as refused:
        await request(nc, "sim", "inject", {"node": "sim-009", "kind": "thermal"})
    assert refused.value.field == "node"
    with pytest.raises(CommandRefused) as refused:
        await request(nc, "sim", "inject", {"node": "sim-000", "kind": "xid"})
    assert refused.value.field == "xid" and "--xid" in str(refused.value)


async def test_a_silent_node_stops_sampling_until_cleared(fleet: Agent, nc: Client) -> None:
    await eventually(lambda: answers(nc))
    await request(nc, "sim", "inject", {"node": "sim-001", "kind": "agent_silent"})
    runner = next(r for r in fleet.runners if r.node == "sim-001")
    frozen = runner.seq
    await _more_samples(fleet, 5, of=next(r for r in fleet.runners if r is not runner))  # the others go on
    assert runner.seq == frozen
    await request(nc, "sim", "inject", {"node": "sim-001", "kind": "clear"})
    await eventually(lambda: runner.seq > frozen)


async def test_the_fleet_starts_placed_jobs_and_completes_them_after_their_duration(
    fleet: Agent, nc: Client, js: JetStreamContext
) -> None:
    publisher = Publisher(js, source="test-scheduler")
    spec = JobSpec(team="vision", gpus_per_replica=2, sim_duration_s=0.6)
    await publisher.publish(JobSubmitted(job_id="train-1", at=1.0, spec=spec), id="train-1-submitted")
    loop = asyncio.get_running_loop()
    at = time.time()
    placement = Placement(cluster="c1", node="sim-001", gpu_indices=[0, 2])
    await publisher.publish(
        JobScheduled(job_id="train-1", at=at, team="vision", placements=[placement], pool="default"),
        id="train-1-scheduled",
    )
    node = fleet.fleet.nodes["sim-001"] if fleet.fleet else None
    assert node is not None
    await eventually(lambda: node.gpus[0].job == "train-1" and node.gpus[2].job == "train-1")
    started = loop.time()

    async def finished() -> bool:
        events = await read_stream(js, "chamber.jobs.train-1")
        return any(isinstance(e, JobCompleted) for e in events)

    await eventually(finished)
    events = await read_stream(js, "chamber.jobs.train-1")
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["JobSubmitted", "JobScheduled", "JobStarted", "JobCompleted"]
    assert isinstance(events[2], JobStarted) and events[2].at == at
    assert isinstance(events[3], JobCompleted) and events[3].at == pytest.approx(at + 0.6)
    assert loop.time() - started >= 0.3
    await eventually(lambda: node.gpus[0].job is None)


async def test_a_restarted_fleet_replays_jobs_and_decides_nothing_twice(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    publisher = Publisher(js, source="test-scheduler")
    spec = JobSpec(team="vision", gpus_per_replica=1, sim_duration_s=0.3)
    at = time.time()
    for job, duration in (("short", 0.3), ("long", None)):
        await publisher.publish(JobSubmitted(job_id=job, at=1.0, spec=replace(spec, sim_duration_s=duration)), id=job)
        placement = Placement(cluster="c1", node="sim-000", gpu_indices=[0 if job == "short" else 1])
        await publisher.publish(
            JobScheduled(job_id=job, at=at, team="vision", placements=[placement], pool="default"), id=f"{job}-s"
        )
    # Other teams' jobs: a restarted fleet reads these between a placement and its JobStarted.
    filler = [JobSubmitted(job_id=f"other-{i}", at=1.0, spec=spec) for i in range(1500)]
    await publisher.publish_many((e, e.job_id, 1.0) for e in filler)
    opts = AgentOptions(
        nats=nats_server.url_for("simulator"), cluster="c1", node="sim", interval_s=0.1, spool_dir=tmp_path,
        simulate=True, nodes=1, gpus_per_node=2,
    )  # fmt: skip

    async def run_fleet_until(done: object) -> Agent:
        agent = Agent(opts)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await eventually(lambda: done(agent))  # type: ignore[operator]
        await _more_samples(agent, 5)  # time for a late job event to appear (none may)
        stop.set()
        await asyncio.wait_for(task, 15)
        return agent

    first = await run_fleet_until(lambda a: a.job_events == 3)  # long started; short started and completed
    assert first.fleet is not None
    second = await run_fleet_until(lambda a: a.fleet.nodes["sim-000"].gpus[1].job == "long")
    assert second.job_events == 0
    assert second.fleet is not None and second.fleet.nodes["sim-000"].gpus[0].job is None
