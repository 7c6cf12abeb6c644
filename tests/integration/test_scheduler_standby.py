"""Two scheduler processes sharing a NATS KV leader lease: one schedules, the other is a hot standby
folding the same log. When the leader dies (SIGKILL: its lease must expire) or stops (SIGTERM: it
hands the lease back), the standby takes over and schedules new work, and no job is placed twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import JobScheduled, decode
from services.runtime import Publisher
from services.runtime.commands import CommandRefused, CommandUnavailable, request
from tests.integration.test_runtime import eventually
from tests.scheduler_builders import a_node, a_quota
from tests.secured_bus import SecuredNatsServer, lease_bucket_with_ttl

pytestmark = pytest.mark.integration
CHAMBER = str(Path(sys.executable).parent / "chamber")
TTL_S = 1.5


@pytest.fixture(autouse=True)
async def short_lease_bucket(nats_server: SecuredNatsServer) -> None:
    await lease_bucket_with_ttl(nats_server, "scheduler", TTL_S)


class Replicas:
    def __init__(self, url: str, logs: Path) -> None:
        self.url, self.logs = url, logs
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.log_paths: dict[int, Path] = {}

    def start(self) -> int:
        path = self.logs / f"scheduler-{len(self.procs)}.log"
        log = path.open("w")
        argv = [CHAMBER, "service", "scheduler", "--nats", self.url, "--interval", "0.1"]
        argv += ["--leader-lease", "scheduler", "--leader-lease-ttl", str(TTL_S)]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs[proc.pid] = proc
        self.log_paths[proc.pid] = path
        return proc.pid

    def cycles(self, pid: int) -> int:
        """Scheduling cycles that decided something, from the replica's own log."""
        return self.log_paths[pid].read_text().count('"event": "cycle"')

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def replicas(nats_server: SecuredNatsServer, tmp_path: Path) -> Iterator[Replicas]:
    running = Replicas(nats_server.url_for("scheduler"), tmp_path)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
async def scheduled(nc: Client) -> AsyncIterator[list[JobScheduled]]:
    seen: list[JobScheduled] = []

    async def on(msg: Any) -> None:
        event = decode(msg.headers, msg.data).event
        if isinstance(event, JobScheduled):
            seen.append(event)

    sub = await nc.subscribe("chamber.jobs.>", cb=on)
    yield seen
    await sub.unsubscribe()


async def leader_pid(js: JetStreamContext) -> int | None:
    try:
        kv = await js.key_value("chamber_lease_scheduler")
        entry = await kv.get("leader")
    except Exception:  # no bucket or no live entry yet
        return None
    return int(entry.value.decode().rsplit(":", 1)[1]) if entry.value else None


async def submitted(nc: Client, job: str, gpus: int) -> bool:
    try:
        # allow_wait: a job larger than any node (the "huge" one) would be refused at submit otherwise
        request_ = {"team": "vision", "gpus": gpus, "id": job, "allow_wait": True}
        await request(nc, "scheduler", "submit", request_, timeout=1.0)
    except CommandUnavailable:  # no replica answering right now
        return False
    except CommandRefused as refused:  # a retry after an answer that was lost on the way
        return "exists already" in str(refused)
    return True


async def queue_row(nc: Client, job: str) -> dict[str, Any]:
    rows = (await request(nc, "scheduler", "queue", {}, timeout=5.0))["jobs"]
    return next((row for row in rows if row["id"] == job), {})


async def test_the_standby_takes_over_when_the_leader_dies_or_stops_and_nothing_is_placed_twice(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, replicas: Replicas, scheduled: list[JobScheduled]
) -> None:
    await Publisher(js, source="test/discovery").publish(a_node("n1", gpus=8))
    await Publisher(js, source="test/quota").publish(a_quota("vision", 8))  # teams without a quota are refused
    pids = {replicas.start(), replicas.start()}

    async def elected() -> int | None:
        pid = await leader_pid(js)
        return pid if pid in pids and replicas.procs[pid].poll() is None else None

    await eventually(elected, within=30)
    first = await elected()
    assert first is not None
    await eventually(lambda: submitted(nc, "a", 2), within=30)
    await eventually(lambda: [e.job_id for e in scheduled] == ["a"], within=15)
    [standby] = pids - {first}
    assert replicas.cycles(first) >= 1 and replicas.cycles(standby) == 0

    # either replica answers `queue` (one queue group), and both say why a job waits
    await eventually(lambda: submitted(nc, "huge", 9), within=15)

    # (each replica folds the other's submit a moment later: wait until both agree)
    async def both_say_why() -> bool:
        reasons = {(await queue_row(nc, "huge")).get("reason", "") for _ in range(8)}
        return len(reasons) == 1 and "the largest node of pool default has 8" in reasons.pop()

    await eventually(both_say_why, within=15)

    # the leader dies without a word: its lease expires and the standby schedules the next job
    replicas.procs[first].send_signal(signal.SIGKILL)
    await eventually(lambda: submitted(nc, "b", 2), within=15)
    await eventually(lambda: [e.job_id for e in scheduled] == ["a", "b"], within=15)
    second = await elected()
    assert second == standby and replicas.cycles(second) >= 1

    # a fresh replica joins as standby; the leader stops cleanly and hands the lease back
    third = replicas.start()
    pids.add(third)
    await eventually(lambda: submitted(nc, "c", 2), within=15)
    await eventually(lambda: [e.job_id for e in scheduled] == ["a", "b", "c"], within=15)
    assert replicas.cycles(third) == 0
    replicas.procs[second].send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(replicas.procs[second].wait, 15) == 0
    await eventually(lambda: submitted(nc, "d", 2), within=15)
    await eventually(lambda: [e.job_id for e in scheduled] == ["a", "b", "c", "d"], within=15)
    assert await elected() == third and replicas.cycles(third) >= 1

    await asyncio.sleep(5 * 0.1)  # a few more cycles of the new leader: nothing is decided again
    assert [e.job_id for e in scheduled] == ["a", "b", "c", "d"]
    gpus = [i for e in scheduled for p in e.placements for i in p.gpu_indices]
    assert sorted(gpus) == list(range(8))  # four jobs of two GPUs: every GPU given out exactly once
