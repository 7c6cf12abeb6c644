"""`chamber service perf` against a real nats-server and the simulated fleet: a GPU slowed through the
`sim.inject` command slows the gang, and the service publishes the verdict, the straggler fault, and
answers `status`, `fabric` and `explain`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import GpuFaultDetected, JobScheduled, JobSpec, JobSubmitted, Placement
from events.fabric import CulpritKind, JobSlowdownDetected
from node_agent.agent import Agent, AgentOptions
from services.perf import service as perf_service
from services.perf.scenario import busy_job_id
from services.runtime import Publisher
from services.runtime.commands import CommandRefused, CommandUnavailable, request
from tests.integration.test_agent_fleet import read_stream
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration
SEED = 3


@contextlib.asynccontextmanager
async def running_fleet(url: str, spool: Path) -> AsyncIterator[Agent]:
    """Two simulated nodes x 4 GPUs sampling every 0.25 s."""
    opts = AgentOptions(
        nats=url, cluster="c1", node="sim", interval_s=0.25, spool_dir=spool, simulate=True, nodes=2,
        gpus_per_node=4, gpu_model="H100-80GB", seed=SEED,
    )  # fmt: skip
    agent = Agent(opts)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield agent
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)  # generous: the machine is shared


@contextlib.asynccontextmanager
async def running_perf(url: str) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(perf_service.run(argparse.Namespace(nats=url, tick=0.25), stop))
    try:
        yield None
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)  # generous: the machine is shared


@pytest.fixture
async def fleet(nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path) -> AsyncIterator[Agent]:
    # `js`: the streams exist first, as the services make them; the simulator may not create them
    async with running_fleet(nats_server.url_for("simulator"), tmp_path / "spool") as agent:
        yield agent


@pytest.fixture
async def perf(nats_server: SecuredNatsServer) -> AsyncIterator[None]:
    async with running_perf(nats_server.url_for("perf")):
        yield None


async def answers(nc: Client, service: str, verb: str, payload: dict) -> bool:
    try:
        await request(nc, service, verb, payload, timeout=0.5)
    except CommandUnavailable:
        return False
    return True


async def test_a_slowed_gpu_is_found_as_the_culprit_of_its_gang(
    fleet: Agent, perf: None, nc: Client, js: JetStreamContext
) -> None:
    await eventually(lambda: answers(nc, "sim", "inject", {"node": "sim-000", "kind": "clear"}))
    await eventually(lambda: answers(nc, "perf", "status", {}))
    job = busy_job_id(SEED)
    publisher = Publisher(js, source="test-scheduler")
    await publisher.publish(
        JobSubmitted(job_id=job, at=time.time(), spec=JobSpec(team="t", gpus_per_replica=4, replicas=2))
    )
    placements = [Placement(cluster="c1", node=n, gpu_indices=[0, 1, 2, 3]) for n in ("sim-000", "sim-001")]
    await publisher.publish(JobScheduled(job_id=job, at=time.time(), team="t", placements=placements, pool="default"))

    async def healthy() -> bool:
        jobs = (await request(nc, "perf", "status", {}))["jobs"]
        return bool(jobs) and jobs[0]["verdict"] == "healthy"

    await eventually(healthy, within=40)
    with pytest.raises(CommandRefused) as refused:
        await request(nc, "sim", "inject", {"node": "sim-001", "kind": "nic_down", "nic": 4})
    assert refused.value.field == "nic" and "NICs 0..3" in str(refused.value)
    await request(nc, "sim", "inject", {"node": "sim-001", "kind": "gpu_slow", "gpu": 2})

    async def verdict() -> list[JobSlowdownDetected]:
        return [e for e in await read_stream(js, f"chamber.jobs.{job}.perf") if isinstance(e, JobSlowdownDetected)]

    await eventually(lambda: _nonempty(verdict()), within=40)
    (found,) = await verdict()
    assert (found.culprit, found.node, found.gpu_index) == (CulpritKind.GPU, "sim-001", 2)
    faults = [f for f in await read_stream(js, "chamber.faults.c1.sim-001") if isinstance(f, GpuFaultDetected)]
    assert [(f.kind, f.gpu_index) for f in faults if f.kind == "straggler"] == [("straggler", 2)]
    status = (await request(nc, "perf", "status", {}))["jobs"][0]
    assert status["verdict"] == "slow" and status["culprit"] == "gpu"
    nodes = (await request(nc, "perf", "fabric", {}))["nodes"]
    assert [(n["node"], len(n["nics"]), n["leaf"]) for n in nodes] == [
        ("sim-000", 4, "leaf-0"),
        ("sim-001", 4, "leaf-0"),
    ]
    lines = (await request(nc, "perf", "explain", {"job": job}))["lines"]
    assert "culprit gpu sim-001 GPU 2" in lines[0]
    # folded once, when the verdict came back from JOBS (not also when it was published)
    assert len([line for line in lines if "slow (episode 1" in line]) == 1, lines
    heat = await request(nc, "perf", "ranks", {"job": job})
    assert len(heat["ranks"]) == 8 and heat["culprit"]["gpu"] == 2 and heat["activity_pct"]
    straggler = heat["ranks"].index({"node": "sim-001", "gpu": 2})
    last = heat["activity_pct"][-1]
    assert last[straggler] > max(v for i, v in enumerate(last) if i != straggler)  # busy while its peers wait
    with pytest.raises(CommandRefused):
        await request(nc, "perf", "ranks", {"job": "no-such-job"})


async def _nonempty(found: object) -> bool:
    return bool(await found)  # type: ignore[misc]


async def test_step_timings_published_live_name_a_slow_worker_with_all_its_gpus(
    perf: None, nc: Client, js: JetStreamContext
) -> None:
    """RankStepTimings on chamber.telemetry.steps.<cluster>.<node>, as chamber_hooks via the agent sends
    them: the service names the slow tensor-parallel worker and raises a straggler fault per GPU."""
    from events.steps import RankStep, RankStepTimings
    from services.perf.step_cases import make

    await eventually(lambda: answers(nc, "perf", "status", {}))
    case = make("slow_worker_tp4", 2)
    job = case.rows[0]["job"]
    publisher = Publisher(js, source="test")
    nodes = sorted({str(r["node"]) for r in case.rows})
    placements = [Placement(cluster="c1", node=n, gpu_indices=list(range(8))) for n in nodes]
    await publisher.publish(JobScheduled(job_id=job, at=time.time(), team="t", placements=placements, pool="default"))

    async def tracked() -> bool:
        return any(j["job"] == job for j in (await request(nc, "perf", "status", {}))["jobs"])

    await eventually(tracked, within=20)
    fields = set(RankStep.__struct_fields__)
    by_step: dict[tuple[int, str], list[RankStep]] = {}
    for r in case.rows:
        step = RankStep(**{k: v for k, v in r.items() if k in fields})  # type: ignore[arg-type]
        by_step.setdefault((step.step, str(r["node"])), []).append(step)
    for (_step, node), rows in sorted(by_step.items()):
        t = max(s.step_end_s for s in rows)
        await publisher.publish(
            RankStepTimings(cluster="c1", node=node, job_id=str(job), observed_at=t, steps=rows, source="hook")
        )

    async def verdict() -> list[JobSlowdownDetected]:
        return [e for e in await read_stream(js, f"chamber.jobs.{job}.perf") if isinstance(e, JobSlowdownDetected)]

    await eventually(lambda: _nonempty(verdict()), within=40)
    found = (await verdict())[0]
    assert found.pattern == "slow_worker" and found.node == case.target_node
    assert found.gpu_indices == list(case.target_gpus) and found.ranks == list(case.target_ranks)
    faults = [
        f for f in await read_stream(js, f"chamber.faults.c1.{case.target_node}") if isinstance(f, GpuFaultDetected)
    ]
    assert {f.gpu_index for f in faults if f.kind == "straggler"} == set(case.target_gpus)
