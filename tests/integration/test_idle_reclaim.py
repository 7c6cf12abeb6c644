"""Idle reclaim end to end on the secured bus: the team's policy set by command, live telemetry, the
perf process's idle decider and the scheduler, each under the permissions its manifest derives. A
bursty job (busy with short gaps) keeps its GPUs; an idle one is suspended as a preemption, stays
suspended with free GPUs, and resumes when its owner asks."""

from __future__ import annotations

import argparse
import asyncio
import time

import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import JobPreempted, JobResumed, JobScheduled, PreemptionReason
from events.idle import IdleModeName, JobIdleDetected, JobResumeRequested
from events.telemetry import GpuSample, NodeSample
from services.billing import service as billing_service
from services.cli import main
from services.runtime import Publisher
from services.runtime.commands import CommandRefused, request
from services.scheduler import service as scheduler_service
from tests.integration.test_perf_service import running_perf
from tests.integration.test_runtime import eventually
from tests.integration.test_scheduler_service import JobEvents, Running, answers
from tests.scheduler_builders import a_node, a_quota
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration
WINDOW_S = 3.0  # idle_minutes 0.05: seconds, so the test runs in seconds
BURST_GAP_S = 1.5  # the control's idle gaps: shorter than the window


def sample(seq: int, now: float, placements: dict[str, list[int]], started: float) -> NodeSample:
    """One sample of n1: the notebook's GPUs idle (SM ~0 %, memory fixed); the control's busy for 1 s,
    then idle for `BURST_GAP_S`, again and again."""
    busy = (now - started) % (1.0 + BURST_GAP_S) < 1.0
    gpus = [GpuSample(index=i, uuid=f"GPU-c1-n1-{i}", sm_activity_pct=1.0, memory_used_mib=20_000.0)
            for i in placements["notebook"]]  # fmt: skip
    gpus += [GpuSample(index=i, uuid=f"GPU-c1-n1-{i}", sm_activity_pct=90.0 if busy else 0.5,
                       memory_used_mib=30_000.0) for i in placements["train"]]  # fmt: skip
    return NodeSample(cluster="c1", node="n1", seq=seq, observed_at=now, interval_s=0.25, gpus=gpus)


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out + err


async def test_an_idle_job_is_suspended_and_resumed_by_its_owner_and_a_bursty_one_is_not(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = JobEvents()
    sub = await nc.subscribe("chamber.jobs.>", cb=seen.handler)
    publisher = Publisher(js, source="test/discovery")
    now = time.time()  # facts of today: billing accrues periods from the earliest fact on
    await publisher.publish(a_node("n1", gpus=4, at=now))
    await publisher.publish(msgspec.structs.replace(a_quota("vision", 4), at=now))
    sched = Running(scheduler_service, nats_server.url_for("scheduler"))
    stop_billing = asyncio.Event()
    billing_args = argparse.Namespace(
        nats=nats_server.url_for("billing"), period=300.0, settle=30.0, tick=1.0, price=[]
    )
    billing = asyncio.create_task(billing_service.run(billing_args, stop_billing))
    async with running_perf(nats_server.url_for("perf")):
        try:
            await eventually(lambda: answers(nc, "perf", "idle", {}))
            with pytest.raises(CommandRefused) as refused:
                await request(nc, "perf", "idle_policy", {"team": "vision", "mode": "reclaim"})
            assert refused.value.field == "mode"
            code, out = await cli(
                capsys, "idle", "policy", "Vision", "--mode", "suspend", "--idle-minutes", str(WINDOW_S / 60),
                "--grace-minutes", "0", "--nats", nats_server.url,
            )  # fmt: skip
            assert code == 0 and "team vision: idle policy suspend (idle: SM below 5 %" in out, out
            await eventually(lambda: answers(nc, "scheduler", "queue", {}))
            for job in ("notebook", "train"):
                await request(nc, "scheduler", "submit", {"team": "vision", "gpus": 2, "id": job})
            await eventually(lambda: all(seen.of(JobScheduled, j) for j in ("notebook", "train")))
            placements = {j: seen.of(JobScheduled, j)[0].placements[0].gpu_indices for j in ("notebook", "train")}

            started, seq = time.time(), 0
            while not seen.of(JobPreempted, "notebook") and time.time() - started < 30:
                await publisher.publish(sample(seq, time.time(), placements, started))
                seq += 1
                await asyncio.sleep(0.25)
            for _ in range(int(2 * WINDOW_S / 0.25)):  # two windows more: the control must stay
                await publisher.publish(sample(seq, time.time(), placements, started))
                seq += 1
                await asyncio.sleep(0.25)

            [verdict] = seen.of(JobIdleDetected, "notebook")
            assert verdict.action is IdleModeName.SUSPEND and verdict.gpus == 2 and verdict.team == "vision"
            [preempted] = seen.of(JobPreempted, "notebook")
            assert preempted.reason is PreemptionReason.IDLE and "chamber resume notebook" in preempted.detail
            assert seen.of(JobIdleDetected, "train") == [] and seen.of(JobPreempted, "train") == []
            text = (await request(nc, "scheduler", "explain", {"job": "notebook"}))["text"]
            assert "suspended as idle" in text
            assert not seen.of(JobResumed, "notebook")  # free GPUs, yet it waits for its owner

            with pytest.raises(CommandRefused, match="not suspended as idle"):
                await request(nc, "scheduler", "resume", {"job": "train"})
            code, out = await cli(capsys, "resume", "notebook", "--by", "alice", "--nats", nats_server.url)
            assert code == 0 and "job notebook queued again" in out, out
            await eventually(lambda: bool(seen.of(JobResumed, "notebook")))
            assert [e.by for e in seen.of(JobResumeRequested, "notebook")] == ["alice"]
            # billing: the notebook's 2 GPUs from its suspension to its resume
            suspended_s = seen.of(JobResumed, "notebook")[0].at - preempted.at
            expected = round(2 * suspended_s / 3600.0, 3)

            async def reclaimed() -> bool:
                answer = await request(nc, "billing", "reclaimed", {})
                return answer["gpu_hours_by_team"].get("vision") == expected

            await eventually(reclaimed)
            code, out = await cli(capsys, "idle", "--nats", nats_server.url)
            assert code == 0 and "team vision: suspend" in out and f"vision {expected:g}" in out, out
        finally:
            stop_billing.set()
            await asyncio.wait_for(billing, 15)
            await sched.close()
            await sub.unsubscribe()
