"""Issue 5's scenario end to end on the REAL simulated fleet: every part is its own process.

`chamber agent --simulate` is the fleet and the executor (it reports JobStarted, and JobCompleted after
a job's --sim-duration); `chamber service discovery` turns its heartbeats into nodes; `chamber service
health` isolates a node on a fatal XID; `chamber service quota` and `chamber service scheduler` decide.
The test only drives the `chamber` CLI and watches the JOBS and FLEET subjects.

Scenario on 4 nodes of 8 GPUs, three teams with 8 GPUs each: nlp runs its own job and a low-priority
sweep that borrows every idle GPU; vision submits a high-priority job that reclaims its guarantee, so
the sweep is suspended, then resumed when that job completes; the sweep is cancelled; a fatal XID under
nlp's job isolates its node, and the job is requeued and resumes on another node.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import (
    JobCancelled,
    JobCompleted,
    JobPreempted,
    JobRequeued,
    JobResumed,
    JobScheduled,
    JobStarted,
    JobSuspended,
    NodeDiscovered,
    NodeIsolated,
    decode,
)
from tests.e2e.test_scheduler_e2e import CHAMBER, achamber
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer

pytestmark = [pytest.mark.e2e, pytest.mark.bus_cluster("e2e")]

CLUSTER = "e2e"
NODES = [f"sim-{i:03d}" for i in range(4)]


@pytest.fixture
def fleet(nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path) -> Iterator[None]:
    # `js`: the streams exist before the simulator starts, which may not create them
    parts = {
        "agent": ["agent", "--simulate", "--nodes", str(len(NODES)), "--interval", "0.5", "--spool", str(tmp_path)],
        "discovery": ["service", "discovery", "--tick", "0.5", "--view-every", "1"],
        "health": ["service", "health", "--tick", "0.5"],
        "quota": ["service", "quota", "--interval", "0.5"],
        "scheduler": ["service", "scheduler", "--interval", "0.2"],
    }
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CHAMBER_CLUSTER": CLUSTER}
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):  # no Kubernetes, even in a CI pod: the fleet is simulated
        env.pop(var, None)
    procs = []
    for name, argv in parts.items():
        log = (tmp_path / f"{name}.log").open("w")
        role = "simulator" if name == "agent" else name  # each process logs in as its own role
        argv = [CHAMBER, *argv, "--nats", nats_server.url_for(role)]  # the cluster comes from $CHAMBER_CLUSTER
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env))
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


class Seen:
    def __init__(self) -> None:
        self.events: list[Any] = []

    async def on(self, msg: Any) -> None:
        self.events.append(decode(msg.headers, msg.data).event)

    def of(self, kind: type, job: str | None = None) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind) and (job is None or e.job_id == job)]


@pytest.fixture
async def seen(nc: Client) -> AsyncIterator[Seen]:
    watched = Seen()
    subs = [await nc.subscribe(subject, cb=watched.on) for subject in ("chamber.jobs.>", "chamber.fleet.>")]
    yield watched
    for sub in subs:
        await sub.unsubscribe()


async def test_borrow_reclaim_resume_and_a_fatal_xid_moves_the_job_on_the_simulated_fleet(
    nats_server: SecuredNatsServer, fleet: None, seen: Seen
) -> None:
    url = nats_server.url
    await eventually(lambda: {e.node for e in seen.of(NodeDiscovered)} == set(NODES), within=30)

    def quota_set(team: str) -> bool:
        args = [CHAMBER, "quota", "set", team, "--gpus", "8", "--nats", url]
        return subprocess.run(args, capture_output=True, timeout=60, check=False).returncode == 0

    for team in ("vision", "nlp", "speech"):
        await eventually(lambda team=team: asyncio.to_thread(quota_set, team), within=30)  # type: ignore[misc]

    # nlp runs its own job and a low-priority sweep that borrows every idle GPU of the fleet
    await achamber(url, "submit", "--team", "nlp", "--gpus", "8", "--id", "own")
    await achamber(
        url,
        "submit",
        "--team",
        "nlp",
        "--gpus",
        "8",
        "--replicas",
        "3",
        "--priority",
        "low",
        "--checkpoint-interval",
        "60",
        "--id",
        "sweep",
    )  # fmt: skip  (no --sim-duration: the sweep runs until it is cancelled)
    # the simulated executor, not the test, reports both running
    await eventually(lambda: {e.job_id for e in seen.of(JobStarted)} == {"own", "sweep"}, within=30)
    await eventually(lambda: _borrowed(url, "nlp", 24), within=15)  # 8 own within quota, the sweep's 24 borrowed

    # vision, a lender, needs its guarantee back for a high-priority job: the sweep is reclaimed
    await achamber(
        url, "submit", "--team", "vision", "--gpus", "8", "--priority", "high", "--id", "urgent", "--sim-duration", "10"
    )
    await eventually(lambda: bool(seen.of(JobStarted, "urgent")), within=30)
    [preempted] = seen.of(JobPreempted)
    assert (preempted.job_id, preempted.reason.value, preempted.preemptor_job_id) == ("sweep", "reclaim", "urgent")
    assert seen.of(JobSuspended, "sweep") and not seen.of(JobCompleted, "sweep")
    why = await achamber(url, "explain", "sweep")
    assert "suspended" in why and "preempted by urgent (reclaim" in why

    # the executor completes the urgent job after its 10 s (time enough for `explain` on a busy machine);
    # the sweep resumes and runs again
    await eventually(lambda: bool(seen.of(JobCompleted, "urgent")), within=30)
    await eventually(lambda: bool(seen.of(JobResumed, "sweep")), within=30)
    await eventually(lambda: len(seen.of(JobStarted, "sweep")) == 2, within=30)
    assert [e.job_id for e in seen.of(JobResumed)] == ["sweep"]
    await achamber(url, "cancel", "sweep")  # its nodes are free again
    await eventually(lambda: bool(seen.of(JobCancelled, "sweep")), within=15)

    # a fatal XID under `own`: health isolates its node; the job is requeued and resumes elsewhere
    [scheduled] = seen.of(JobScheduled, "own")
    [(_, own_node)] = {(p.cluster, p.node) for p in scheduled.placements}
    await achamber(url, "sim-fault", own_node, "xid", "--xid", "79")
    await eventually(lambda: [e.node for e in seen.of(NodeIsolated)] == [own_node], within=30)
    await eventually(lambda: bool(seen.of(JobRequeued, "own")), within=30)
    await eventually(lambda: len(seen.of(JobStarted, "own")) == 2, within=30)
    # the requeue says why, with the faults behind the isolation
    [isolated], [requeued] = seen.of(NodeIsolated), seen.of(JobRequeued, "own")
    assert requeued.node == own_node and f"{own_node}: {isolated.reason}" in requeued.reason
    assert requeued.fault_ids == isolated.fault_ids and requeued.fault_ids
    [moved] = [e for e in seen.of(JobScheduled, "own") + seen.of(JobResumed, "own") if e is not scheduled]
    assert [p.node for p in moved.placements] != [own_node] and len(moved.placements) == 1
    why = await achamber(url, "explain", "own")
    assert f"is running on {moved.placements[0].node}" in why


async def _borrowed(url: str, team: str, gpus: int) -> bool:
    rows = json.loads(await achamber(url, "quota", "list", "--json"))["teams"]
    return any(r["team"] == team and r["borrowed"] == gpus for r in rows)
