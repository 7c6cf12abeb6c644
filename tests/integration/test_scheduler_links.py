"""The scheduler service learns link health from the log (a NIC fault on FAULTS, a perf verdict on
JOBS) and places a new gang away from those nodes, against a real nats-server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import FaultKind, GpuFaultDetected, JobScheduled, Severity
from events.fabric import CulpritKind, JobSlowdownDetected
from services.runtime import Publisher
from services.runtime.commands import request
from services.scheduler import service as scheduler_service
from tests.integration.test_runtime import eventually
from tests.integration.test_scheduler_service import JobEvents, Running, answers
from tests.scheduler_builders import a_node, a_quota
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration


@pytest.fixture
async def watched(nc: Client) -> AsyncIterator[JobEvents]:
    seen = JobEvents()
    sub = await nc.subscribe("chamber.jobs.>", cb=seen.handler)
    yield seen
    await sub.unsubscribe()


async def test_a_gang_is_placed_away_from_a_faulty_nic_and_a_perf_culprit(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, watched: JobEvents
) -> None:
    now = time.time()
    publisher = Publisher(js, source="test/fleet")
    for i in range(1, 5):
        await publisher.publish(a_node(f"n{i}"))
    await publisher.publish(a_quota("vision", 16))
    agent = Publisher(js, source="test/agent")
    await agent.publish(
        GpuFaultDetected(
            fault_id="n1/nic2/errors",
            cluster="c1",
            node="n1",
            kind=FaultKind.NIC_ERRORS,
            severity=Severity.WARNING,
            observed_at=now,
            gpu_index=2,
            detail="150 symbol errors in 60 s",
        )
    )
    perf = Publisher(js, source="test/perf")
    await perf.publish(
        JobSlowdownDetected(
            job_id="other",
            episode=1,
            at=now,
            since=now - 5,
            culprit=CulpritKind.NIC,
            score=0.7,
            confidence=0.9,
            cluster="c1",
            node="n2",
            nic="mlx5_0/1",
            gpu_index=0,
        )
    )
    sched = Running(scheduler_service, nats_server.url_for("scheduler"))
    try:
        await eventually(lambda: answers(nc, "scheduler", "queue", {}))
        spec = {"team": "vision", "gpus_per_replica": 8, "replicas": 2, "id": "gang-1"}
        await request(nc, "scheduler", "submit", spec)
        await eventually(lambda: bool(watched.of(JobScheduled, "gang-1")))
        [scheduled] = watched.of(JobScheduled, "gang-1")
        assert sorted(p.node for p in scheduled.placements) == ["n3", "n4"]
        text = (await request(nc, "scheduler", "explain", {"job": "gang-1"}))["text"]
        assert "kept off degraded links (n1: nic_errors (rail of GPU 2)" in text
        assert "n2: NIC mlx5_0/1 slowed job other" in text
    finally:
        await sched.close()
