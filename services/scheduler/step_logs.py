"""Step logs named by Kubernetes workloads, handed to the agents of the nodes that run them.

A workload annotated `chamber.io/step-log: /scratch/steps-rank{rank}.jsonl` (a path on the node: a
hostPath or local volume the pods write with `chamber_hooks.StepLog`) gets, while its job runs, one
key per node of its placement in the KV bucket `chamber_step_logs`:
`<cluster>.<node>.<job>` -> `{"job", "path", "gpu_indices"}`. The scheduler's Kubernetes actuator
writes the bucket (it alone reads workloads); each agent reads only its own node's keys (its NATS
role allows a consumer on `$KV.chamber_step_logs.<cluster>.<node>.>` and nothing else) and tails the
file for the job (node_agent/step_log_watch.py). A key goes when the job stops running there.

`desired_step_logs` is pure; `sync_step_logs` is the shell that makes the bucket say it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from events.steps import StepLogEntry, step_log_key, step_log_keys_of
from services.kube.kinds import Observed
from services.runtime.logs import get_logger
from services.scheduler.core import JobState, SchedulerState
from services.scheduler.kubernetes import job_id

STEP_LOG_ANNOTATION = "chamber.io/step-log"
MAX_PATH = 1024
log = get_logger("chamber.scheduler")


def step_log_path(annotations: Mapping[str, Any]) -> str | None:
    """The annotation's path if it is one the agent may open: absolute, normalised, no `..`."""
    raw = annotations.get(STEP_LOG_ANNOTATION)
    if not isinstance(raw, str):
        return None
    path = raw.strip()
    if not path.startswith("/") or len(path) > MAX_PATH or "\x00" in path or ".." in path.split("/"):
        return None
    return posixpath.normpath(path)


def desired_step_logs(state: SchedulerState, observed: Iterable[Observed], cluster: str) -> dict[str, bytes]:
    """Key -> value for every running job of this cluster whose workload names a step log."""
    out: dict[str, bytes] = {}
    for item in observed:
        meta = item.obj.get("metadata") or {}
        path = step_log_path(meta.get("annotations") or {})
        if path is None:
            continue
        jid = job_id(cluster, meta.get("namespace") or "", meta.get("name") or "", item.kind)
        job = state.jobs.get(jid)
        if job is None or job.state != JobState.RUNNING:
            continue
        for p in job.placements:
            if p.cluster != cluster:
                continue
            entry = StepLogEntry(job=jid, path=path, gpu_indices=sorted(p.gpu_indices))
            out[step_log_key(cluster, p.node, jid)] = msgspec.json.encode(entry)
    return out


async def sync_step_logs(
    js: Any, kv: Any, cluster: str, desired: Mapping[str, bytes], written: dict[str, bytes] | None
) -> dict[str, bytes]:
    """Make the bucket hold `desired` for this cluster: put what changed, delete what went. `written`
    is what the last call left (None at start: read the bucket's keys of this cluster first, so the
    keys of jobs that ended while no scheduler ran go too)."""
    from events.channels import STEP_LOG_BUCKET
    from services.runtime.buckets import live_keys

    if written is None:
        written = {k: b"" for k in await live_keys(js, kv, STEP_LOG_BUCKET, step_log_keys_of(cluster, None))}
    for key, value in desired.items():
        if written.get(key) != value:
            await kv.put(key, value)
    for key in set(written) - set(desired):
        await kv.delete(key)
    if set(written) != set(desired):
        log.info("step logs handed to agents", keys=sorted(desired))
    return dict(desired)
