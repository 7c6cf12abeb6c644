"""End to end: the quota and scheduler services as processes, driven by the `chamber` CLI.

The simulated fleet and discovery are separate services; here the test publishes the fleet events
discovery would (NodeDiscovered, NodeIsolated) and plays the executor (JobStarted, JobCompleted).
Scenario: three teams with quotas; a low-priority job borrows idle GPUs; a high-priority job of a
lending team reclaims them; the borrower is suspended, then resumed when that job completes; a node
is isolated under a running job, which resumes on another node.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import JobCompleted, JobPreempted, JobRequeued, JobResumed, JobScheduled, JobStarted, NodeIsolated, decode
from services.runtime import Publisher
from tests.integration.test_runtime import eventually
from tests.scheduler_builders import a_node
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")


def chamber(url: str, *args: str) -> str:
    result = subprocess.run([CHAMBER, *args, "--nats", url], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


async def achamber(url: str, *args: str) -> str:
    return await asyncio.to_thread(chamber, url, *args)


@pytest.fixture
def services(nats_server: SecuredNatsServer, tmp_path: Path) -> Iterator[None]:
    procs = []
    for name, extra in (("quota", ["--interval", "0.5"]), ("scheduler", ["--interval", "0.2"])):
        log = (tmp_path / f"{name}.log").open("w")
        procs.append(
            subprocess.Popen(
                [CHAMBER, "service", name, "--nats", nats_server.url_for(name), *extra],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        )
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
async def jobs_seen(nc: Client) -> AsyncIterator[list[Any]]:
    seen: list[Any] = []

    async def on(msg: Any) -> None:
        seen.append(decode(msg.headers, msg.data).event)

    sub = await nc.subscribe("chamber.jobs.>", cb=on)
    yield seen
    await sub.unsubscribe()


async def queue(url: str) -> dict[str, dict[str, Any]]:
    return {j["id"]: j for j in json.loads(await achamber(url, "queue", "--json"))["jobs"]}


async def state_is(url: str, job: str, state: str) -> bool:
    return (await queue(url)).get(job, {}).get("state") == state


async def test_borrow_reclaim_suspend_resume_and_requeue_on_isolation(
    nats_server: SecuredNatsServer, js: JetStreamContext, services: None, jobs_seen: list[Any]
) -> None:
    url = nats_server.url
    discovery = Publisher(js, source="test/discovery")
    executor = Publisher(js, source="test/executor")
    for node in ("n1", "n2", "n3"):
        await discovery.publish(a_node(node, gpus=8))

    def quota_set(team: str) -> bool:
        args = [CHAMBER, "quota", "set", team, "--gpus", "8", "--nats", url]
        return subprocess.run(args, capture_output=True, timeout=60, check=False).returncode == 0

    for team in ("vision", "nlp", "speech"):
        await eventually(lambda team=team: asyncio.to_thread(quota_set, team), within=30)  # type: ignore[misc]

    # nlp runs its own job and a low-priority sweep that borrows the idle GPUs of vision and speech
    assert (await achamber(url, "submit", "--team", "nlp", "--gpus", "8", "--id", "own")).strip() == "own"
    out = await achamber(
        url, "submit", "--team", "nlp", "--gpus", "8", "--replicas", "2", "--priority", "low",
        "--checkpoint-interval", "60", "--name", "sweep", "--json",
    )  # fmt: skip
    sweep = json.loads(out)["id"]
    await eventually(lambda: state_is(url, sweep, "running"), within=30)
    for job in ("own", sweep):
        await executor.publish(JobStarted(job_id=job, at=0.0 + 1))
    await eventually(lambda: _borrowed(url, "nlp", 16), within=15)  # 8 own + 16 of the sweep, 8 guaranteed

    # vision, a lender, needs its guarantee back for a high-priority job: the sweep is reclaimed
    await achamber(
        url, "submit", "--team", "vision", "--gpus", "8", "--priority", "high", "--id", "urgent", "--sim-duration", "5"
    )
    await eventually(lambda: state_is(url, "urgent", "running"), within=30)
    assert await state_is(url, sweep, "suspended")
    [preempted] = [e for e in jobs_seen if isinstance(e, JobPreempted)]
    assert (preempted.job_id, preempted.reason.value, preempted.preemptor_job_id) == (sweep, "reclaim", "urgent")
    why = await achamber(url, "explain", sweep)
    assert "suspended" in why and "preempted by urgent (reclaim" in why
    header, *lines = (await achamber(url, "queue")).splitlines()
    assert header.split()[:2] == ["POS", "ID"] and "SCORE" in header and "GUARD" in header
    [row] = [line.split() for line in lines if sweep in line]
    assert row[0] == "1" and "suspended" in row  # first in the next cycle's order: the only queued job

    # the executor reports the urgent job done: the sweep resumes on its own, keeping its place
    await executor.publish(JobCompleted(job_id="urgent", at=1e9))
    await eventually(lambda: state_is(url, sweep, "running"), within=30)
    assert [e.job_id for e in jobs_seen if isinstance(e, JobResumed)] == [sweep]

    # a node is isolated under `own`; a spare node has come up, so `own` resumes there
    await discovery.publish(a_node("n4", gpus=8))
    own_node = next(iter((await queue(url))["own"]["placement"]))
    await discovery.publish(NodeIsolated(cluster="c1", node=own_node, at=2e9, reason="xid 79: fallen off the bus"))
    await eventually(lambda: _runs_on(url, "own", "n4"), within=30)
    assert [e.job_id for e in jobs_seen if isinstance(e, JobRequeued)] == ["own"]
    assert "is running on n4" in await achamber(url, "explain", "own")
    assert len([e for e in jobs_seen if isinstance(e, JobScheduled) and e.job_id == "own"]) == 1


async def _borrowed(url: str, team: str, gpus: int) -> bool:
    rows = json.loads(await achamber(url, "quota", "list", "--json"))["teams"]
    return any(r["team"] == team and r["borrowed"] == gpus for r in rows)


async def _runs_on(url: str, job: str, node: str) -> bool:
    row = (await queue(url)).get(job, {})
    return row.get("state") == "running" and list(row.get("placement", {})) == [node]
