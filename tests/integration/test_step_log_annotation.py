"""A workload's `chamber.io/step-log` annotation reaches the agent of each node it runs on: the
scheduler's actuator lists the workload from the Kubernetes API stub, writes its node's key in the
step-log bucket (as `svc-scheduler`), and a real agent (as `agent`, on the secured bus) reads its
node's keys, tails the job's per-rank files and publishes their rows as RankStepTimings; rows of
another node are not published, and the tail stops when the job does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest
from kubernetes import client
from nats.js import JetStreamContext

from events import JobCompleted
from events.channels import STEP_LOG_BUCKET
from events.steps import RankStepTimings, StepLogEntry
from node_agent.agent import Agent, AgentOptions
from services.kube.cluster import KubernetesWorkloads
from services.runtime.buckets import live_keys
from services.scheduler.step_logs import STEP_LOG_ANNOTATION, desired_step_logs, step_log_path, sync_step_logs
from tests.integration.test_agent_fleet import read_stream
from tests.integration.test_runtime import eventually
from tests.kube_stub import KubeStub
from tests.kube_workloads import a_batch_job
from tests.scheduler_builders import Driver, a_node, a_quota
from tests.secured_bus import SecuredNatsServer, connect_as
from tests.unit.fake_pynvml import FakeNvml

pytestmark = pytest.mark.integration
JOB = "k8s-c1-ml-train"


def a_row(rank: int, step: int, job: str = JOB, **extra: object) -> str:
    row = {"job": job, "rank": rank, "step": step, "step_start_s": 10.0 * step, "step_end_s": 10.0 * step + 9}
    return json.dumps({**row, "compute_s": 7.0, "gpu_index": rank, **extra}) + "\n"


def test_only_absolute_plain_paths_are_handed_out() -> None:
    assert step_log_path({STEP_LOG_ANNOTATION: " /scratch/./steps-{rank}.jsonl "}) == "/scratch/steps-{rank}.jsonl"
    for bad in ("scratch/steps.jsonl", "/scratch/../etc/shadow", "/a\x00b", 42, "/" + "a" * 2000):
        assert step_log_path({STEP_LOG_ANNOTATION: bad}) is None


async def test_the_annotated_step_log_is_tailed_by_the_agent_of_the_jobs_node(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    # a held Job asking 1 x 4 GPUs, naming its per-rank step logs; admitted onto n1
    job = a_batch_job("train", parallelism=1)
    job["metadata"].setdefault("annotations", {})[STEP_LOG_ANNOTATION] = "/scratch/steps-rank{rank}.jsonl"
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    with KubeStub() as api:
        api.add(job)
        workloads = KubernetesWorkloads(client.ApiClient(client.Configuration(host=api.url)))
        workloads.detect(lambda kind: None)
        listed = workloads.list()
    from services.scheduler.kubernetes import reconcile

    [(submitted, _)], _ = reconcile(d.state, listed, "c1", now=1.0)
    d.given(submitted)
    d.cycle(now=2.0)
    desired = desired_step_logs(d.state, listed, "c1")
    assert {k: msgspec.json.decode(v, type=StepLogEntry) for k, v in desired.items()} == {
        f"c1.n1.{JOB}": StepLogEntry(job=JOB, path="/scratch/steps-rank{rank}.jsonl", gpu_indices=[0, 1, 2, 3])
    }

    scheduler = await connect_as(nats_server, "scheduler")
    kv = await scheduler.jetstream().key_value(STEP_LOG_BUCKET)
    written = await sync_step_logs(scheduler.jetstream(), kv, "c1", desired, None)

    scratch = tmp_path / "host" / "scratch"
    scratch.mkdir(parents=True)
    (scratch / "steps-rank0.jsonl").write_text(a_row(0, 1))
    # rank 1's hook did not know the Chamber job id (StepLog's default "job"): the file is the job's all the same
    (scratch / "steps-rank1.jsonl").write_text(a_row(1, 1, job="job") + a_row(9, 1, node="n2", gpu_index=1))
    opts = AgentOptions(
        nats=nats_server.url_for("agent"),
        cluster="c1",
        node="n1",
        interval_s=0.1,
        spool_dir=tmp_path / "spool",
        step_log_root=tmp_path / "host",
        step_log_poll_s=0.2,
    )
    agent = Agent(opts, nvml=FakeNvml(gpus=4))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))

    async def steps() -> list[tuple[int, int]]:
        events = await read_stream(js, "chamber.telemetry.steps.c1.n1")
        return sorted((r.rank, r.step) for e in events if isinstance(e, RankStepTimings) for r in e.steps)

    try:
        await eventually(lambda: _has(steps(), [(0, 1), (1, 1)]), within=15)
        with (scratch / "steps-rank0.jsonl").open("a") as fh:
            fh.write(a_row(0, 2))
        await eventually(lambda: _has(steps(), [(0, 1), (0, 2), (1, 1)]), within=15)

        # the job completes: its key goes, the agent stops tailing
        d.given(JobCompleted(job_id=JOB, at=3.0))
        await sync_step_logs(scheduler.jetstream(), kv, "c1", desired_step_logs(d.state, listed, "c1"), written)
        await eventually(lambda: not agent.step_log_sources.tails(), within=15)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await scheduler.close()
    assert (9, 1) not in await steps()  # another node's rank in a shared file is not this agent's


async def _has(pending: object, want: list[tuple[int, int]]) -> bool:
    return await pending == want  # type: ignore[misc]


async def test_a_restarted_scheduler_deletes_the_keys_of_jobs_that_ended_while_it_was_away(
    nats_server: SecuredNatsServer, js: JetStreamContext
) -> None:
    """At start (nothing written yet) the scheduler reads its cluster's keys from the bucket: the key
    of a job that ended meanwhile goes; another cluster's keys are that cluster's scheduler's."""
    admin = await js.key_value(STEP_LOG_BUCKET)
    entry = msgspec.json.encode(StepLogEntry(job="j", path="/scratch/steps-{rank}.jsonl", gpu_indices=[0]))
    for key in ("c1.n1.running", "c1.n2.ended", "c2.n1.elsewhere"):
        await admin.put(key, entry)
    scheduler = await connect_as(nats_server, "scheduler")
    try:
        sjs = scheduler.jetstream()
        kv = await sjs.key_value(STEP_LOG_BUCKET)
        written = await sync_step_logs(sjs, kv, "c1", {"c1.n1.running": entry}, None)
    finally:
        await scheduler.close()
    assert written == {"c1.n1.running": entry}
    assert sorted(await live_keys(js, admin, STEP_LOG_BUCKET)) == ["c1.n1.running", "c2.n1.elsewhere"]
