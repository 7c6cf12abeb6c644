"""Chamber on a real 3-server JetStream cluster (three `nats-server` processes joined by routes on
loopback): the simulated fleet, discovery, two scheduler replicas sharing a lease, and the recorder.

The machine that leads JOBS and TELEMETRY dies (kill -9 of its nats-server, and of the scheduler
replica that held the lease there, as a node failure takes down every pod on it), then comes back.
Shown: every stream and KV bucket is R3 without being asked (a cluster of 3); a publish acked by
JetStream is never lost; the warehouse holds no duplicate; the lease moves to the standby, which
goes on placing jobs, submitted through a CLI whose first server in `--nats` is the dead one.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import JobScheduled, decode
from events.streams import STREAMS
from services.runtime import Publisher, connect
from services.runtime.commands import request
from services.runtime.nats_cluster import NatsCluster, move_leader, stream_leader
from tests.builders import a_node_sample
from tests.integration.test_runtime import eventually

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")
LEASE_TTL_S = 3.0
KV_BUCKETS = ("KV_chamber_lease_scheduler",)


class Processes:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *argv: str, **env: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("a")
        proc = subprocess.Popen(
            [CHAMBER, *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        )
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        self.procs[name].kill()
        self.procs[name].wait()

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
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path / "nats") as running:
        yield running


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
async def client(cluster: NatsCluster) -> AsyncIterator[Client]:
    nc = await connect(cluster.url, name="test")
    try:
        yield nc
    finally:
        await nc.close()


def scheduler(procs: Processes, url: str, pod: str) -> None:
    argv = ["service", "scheduler", "--nats", url, "--interval", "0.2"]
    argv += ["--leader-lease", "scheduler", "--leader-lease-ttl", str(LEASE_TTL_S)]
    procs.start(pod, *argv, POD_NAME=pod)


async def lease_holder(js: JetStreamContext) -> str | None:
    try:
        entry = await (await js.key_value("chamber_lease_scheduler")).get("leader")
    except Exception:  # no bucket, no live entry, or an election in progress
        return None
    return entry.value.decode().split(":", 1)[0] if entry.value else None


def quota_set(url: str) -> bool:
    """A team needs a quota before it submits (the scheduler's door)."""
    argv = [CHAMBER, "quota", "set", "vision", "--gpus", "16", "--nats", url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        print("quota set:", done.stderr.strip()[-500:])  # shown if the test fails
    return done.returncode == 0


def submit(url: str, job: str) -> bool:
    argv = [CHAMBER, "submit", "--team", "vision", "--gpus", "2", "--id", job, "--nats", url]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return result.returncode == 0 or "exists already" in result.stderr


async def replicated(js: JetStreamContext, names: list[str]) -> bool:
    """Every named stream has 3 replicas, a leader and two current followers."""
    for name in names:
        try:
            info = await js.stream_info(name)
        except Exception:
            return False
        peers = info.cluster.replicas if info.cluster else None
        if info.config.num_replicas != 3 or not info.cluster.leader or len(peers or []) != 2:  # type: ignore[union-attr]
            return False
        if not all(p.current and not p.offline for p in peers or []):
            return False
    return True


class Probe:
    """Publishes node samples into TELEMETRY through the whole test and keeps the ids JetStream
    acked; a publish that fails is retried with the same id (deduplicated if it had landed)."""

    def __init__(self, js: JetStreamContext) -> None:
        self.publisher = Publisher(js, source="test/probe")
        self.acked: list[str] = []
        self.failures = 0

    async def run(self, stop: asyncio.Event) -> None:
        seq = 0
        while not stop.is_set():
            sample = msgspec.structs.replace(
                a_node_sample("probe", seq=seq, gpus=1, cluster="probe"), observed_at=time.time()
            )
            event_id = f"probe-{seq}"
            try:
                await self.publisher.publish(sample, id=event_id)
            except Exception:
                self.failures += 1
                await asyncio.sleep(0.1)
                continue
            self.acked.append(event_id)
            seq += 1
            await asyncio.sleep(0.05)


async def sql(nc: Client, query: str) -> list[list[Any]]:
    return list((await request(nc, "recorder", "sql", {"sql": query}, timeout=10))["rows"])


async def caught_up(js: JetStreamContext) -> bool:
    for spec in STREAMS:
        if spec.name == "DEAD":
            continue
        try:
            info = await js.consumer_info(spec.name, "recorder")
        except Exception:
            return False
        if info.num_pending or info.num_ack_pending:
            return False
    return True


async def test_the_leader_of_jobs_and_telemetry_dies_and_nothing_acked_is_lost_or_doubled(
    cluster: NatsCluster, procs: Processes, client: Client, tmp_path: Path
) -> None:
    js = client.jetstream()
    url = cluster.url
    procs.start("agent", "agent", "--simulate", "--nodes", "2", "--gpus-per-node", "8", "--cluster", "kill",
                "--interval", "0.5", "--nats", url, "--spool", str(tmp_path / "spool"))  # fmt: skip
    procs.start("discovery", "service", "discovery", "--nats", url)
    procs.start("quota", "service", "quota", "--nats", url)
    procs.start("recorder", "service", "recorder", "--nats", url, "--data-dir", str(tmp_path / "warehouse"),
                "--flush-interval", "0.2", "--ack-wait", "5", "--telemetry-consumers", "1")  # fmt: skip
    scheduler(procs, url, "sched-a")
    scheduler(procs, url, "sched-b")

    # 1. streams and KV buckets are R3 with nothing configured: the cluster has three servers
    await eventually(lambda: replicated(js, [s.name for s in STREAMS]), within=60)
    await eventually(lambda: replicated(js, list(KV_BUCKETS)), within=30)
    listed = await asyncio.to_thread(
        subprocess.run, [CHAMBER, "streams", "--json", "--nats", url], capture_output=True, text=True, check=True
    )
    by_name = {s["name"]: s for s in json.loads(listed.stdout)["streams"]}
    assert all(by_name[s.name]["replicas"] == 3 and len(by_name[s.name]["followers"]) == 2 for s in STREAMS)

    # 2. the fleet is seen and a job is placed
    await eventually(lambda: lease_holder(js), within=30)
    await eventually(lambda: asyncio.to_thread(quota_set, url), within=60)
    await eventually(lambda: asyncio.to_thread(submit, url, "before"), within=60)
    scheduled: dict[str, JobScheduled] = {}

    async def placed(job: str) -> bool:
        """Read JOBS from the start (a fresh consumer each time: one that lived on a killed server
        would be gone) and keep every placement."""
        try:
            sub = await js.pull_subscribe("chamber.jobs.>", stream="JOBS")
            try:
                while msgs := await sub.fetch(500, timeout=1):
                    for msg in msgs:
                        event = decode(msg.headers, msg.data).event
                        if isinstance(event, JobScheduled):
                            scheduled[event.job_id] = event
            except TimeoutError:
                pass
            finally:
                await sub.unsubscribe()
        except Exception:  # an election in progress
            return False
        return job in scheduled

    await eventually(lambda: placed("before"), within=60)

    # 3. one server leads both JOBS and TELEMETRY; the lease holder runs beside it
    victim = await stream_leader(js, "JOBS")
    assert victim is not None
    await move_leader(client, "TELEMETRY", victim)
    holder = await lease_holder(js)
    assert holder in ("sched-a", "sched-b")
    standby = "sched-b" if holder == "sched-a" else "sched-a"

    stop_probe = asyncio.Event()
    probe = Probe(js)
    probing = asyncio.create_task(probe.run(stop_probe))
    await eventually(lambda: len(probe.acked) >= 20, within=30)

    # 4. kill -9 that machine: its nats-server and the scheduler replica holding the lease
    dead = cluster.server(victim)
    dead.kill()
    procs.kill(holder)
    killed_at = time.monotonic()
    acked_before_kill = len(probe.acked)
    await eventually(lambda: len(probe.acked) > acked_before_kill, within=30)
    first_publish_s = time.monotonic() - killed_at

    # the CLI is given the dead server first: it goes on to the next one
    survivors_first = ",".join([dead.url, *(s.url for s in cluster.servers if s is not dead)])
    # the JOBS stream may still be electing its new leader: a client retries (the id makes it idempotent)
    await eventually(lambda: asyncio.to_thread(submit, survivors_first, "during"), within=60)
    await eventually(lambda: placed("during"), within=60)
    assert await lease_holder(js) == standby
    assert await stream_leader(js, "JOBS") != victim and await stream_leader(js, "TELEMETRY") != victim

    # 5. the machine comes back; its replicas catch up; the standby keeps leading and placing
    await asyncio.to_thread(dead.start)
    scheduler(procs, url, holder)
    assert await asyncio.to_thread(submit, url, "after")
    await eventually(lambda: placed("after"), within=60)
    await eventually(lambda: replicated(js, [s.name for s in STREAMS] + list(KV_BUCKETS)), within=60)
    stop_probe.set()
    await probing

    # 6. everything acked is in the streams and the warehouse, once
    await eventually(lambda: caught_up(js), within=60)
    acked = set(probe.acked)
    stored = {row[0] for row in await sql(client, "SELECT event_id FROM gpu_samples WHERE cluster = 'probe'")}
    assert acked <= stored, f"acked but lost: {sorted(acked - stored)[:5]}"
    [[rows, distinct]] = await sql(client, "SELECT count(), uniqExact(event_id, gpu_index) FROM gpu_samples")
    assert rows == distinct
    [[events, distinct_events]] = await sql(client, "SELECT count(), uniqExact(event_id) FROM events")
    assert events == distinct_events
    jobs = {row[0] for row in await sql(client, "SELECT DISTINCT job_id FROM job_events")}
    assert {"before", "during", "after"} <= jobs
    placements = [p for e in scheduled.values() for p in e.placements]
    gpus = [(p.node, i) for p in placements for i in p.gpu_indices]
    assert len(gpus) == len(set(gpus))  # no GPU given out twice across the leader change
    print(
        f"\ncluster kill: first accepted publish {first_publish_s:.2f}s after kill -9; "
        f"{len(acked)} probe samples acked, {probe.failures} publish attempts failed and were retried"
    )
