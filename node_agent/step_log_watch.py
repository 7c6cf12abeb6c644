"""The step logs that jobs on this node name in their workload (`chamber.io/step-log`), as the
scheduler hands them out: its node's keys of the KV bucket `chamber_step_logs`
(services/scheduler/step_logs.py). The agent reads them every `every_s` through the one consumer its
NATS role allows (named for the node, filtered to its keys: it sees no other node's jobs), and
`StepLogSources` turns them into tails of the files (node_agent/step_log.py).

A path is read under `root` (`--step-log-root`, for an agent that sees the host's files at a mount
point); `{rank}` in it matches any rank's file. Only rows for this node are published: a row that
names another `node`, or a `gpu_index` outside the job's GPUs here, is skipped (a shared file system
shows every rank's file on every node).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from events.channels import STEP_LOG_BUCKET
from events.steps import StepLogEntry, step_log_consumer, step_log_keys_of
from node_agent.step_log import StepLogTail
from services.runtime.logs import get_logger

log = get_logger("chamber.agent")
POLL_S = 10.0  # a job's log is tailed within this long of its start
GLOB_EVERY_TICKS = 10  # `{rank}` files are looked for again this often (a rank may start late)
_DELETED = ("DEL", "PURGE")


async def read_assignments(js: Any, cluster: str, node: str) -> dict[str, StepLogEntry]:
    """Job -> its step log on this node, as the bucket says now (deleted keys left out)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import NotFoundError

    stream = f"KV_{STEP_LOG_BUCKET}"
    name = step_log_consumer(node)
    with contextlib.suppress(NotFoundError):  # a consumer left by a previous round (or process)
        await js.delete_consumer(stream, name)
    config = ConsumerConfig(
        name=name,
        filter_subject=f"$KV.{STEP_LOG_BUCKET}.{step_log_keys_of(cluster, node)}",
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=AckPolicy.NONE,
        inactive_threshold=60.0,
    )
    info = await js.add_consumer(stream, config=config)
    out: dict[str, StepLogEntry] = {}
    try:
        if info.num_pending:
            sub = await js.pull_subscribe_bind(consumer=name, stream=stream)
            try:
                for msg in await sub.fetch(info.num_pending, timeout=5.0):
                    if (msg.headers or {}).get("KV-Operation") in _DELETED:
                        continue
                    try:
                        entry = msgspec.json.decode(msg.data, type=StepLogEntry)
                    except msgspec.ValidationError:
                        log.warning("step-log entry not understood", subject=msg.subject)
                        continue
                    out[entry.job] = entry
            finally:
                await sub.unsubscribe()
    finally:
        with contextlib.suppress(Exception):
            await js.delete_consumer(stream, name)
    return out


async def follow_assignments(
    js: Callable[[], Any], cluster: str, node: str, sink: StepLogSources, stop: asyncio.Event, every_s: float = POLL_S
) -> None:
    """Poll the bucket while the agent runs; `js()` is None while NATS is away. A failure (no bucket
    yet: no scheduler on Kubernetes) is logged once and tried again next round."""
    failing = False
    while not stop.is_set():
        ctx = js()
        if ctx is not None:
            try:
                sink.assign(await read_assignments(ctx, cluster, node))
                failing = False
            except Exception as exc:
                if not failing:
                    log.info("no step logs handed out yet", bucket=STEP_LOG_BUCKET, error=repr(exc))
                failing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


@dataclass
class _Source:
    entry: StepLogEntry
    tails: dict[str, StepLogTail] = field(default_factory=dict)  # path -> its tail


class StepLogSources:
    """The tails of the step logs assigned to this node. `assign` (from the event loop) replaces the
    assignments whole; `tails` (from the sampling thread) follows them at its next call."""

    def __init__(self, node: str, root: Path = Path("/")) -> None:
        self.node = node
        self.root = root
        self._assigned: dict[str, StepLogEntry] = {}
        self._sources: dict[str, _Source] = {}
        self._ticks = 0

    def assign(self, entries: dict[str, StepLogEntry]) -> None:
        self._assigned = dict(entries)  # one reference swap: the sampling thread sees old or new

    def tails(self) -> list[StepLogTail]:
        assigned = self._assigned
        for job in set(self._sources) - set(assigned):
            del self._sources[job]
        rescan = self._ticks % GLOB_EVERY_TICKS == 0
        self._ticks += 1
        for job, entry in assigned.items():
            source = self._sources.get(job)
            if source is None or source.entry != entry:
                source = self._sources[job] = _Source(entry)
                rescan = True
            if rescan:
                self._discover(source)
        return [t for s in self._sources.values() for t in s.tails.values()]

    def _discover(self, source: _Source) -> None:
        entry = source.entry
        local = str(self.root / entry.path.lstrip("/"))
        pattern = glob.escape(local).replace(glob.escape("{rank}"), "*")
        accept = _accept_rows(self.node, frozenset(entry.gpu_indices))
        for path in sorted(glob.glob(pattern)) if "{rank}" in local else [local]:
            if path not in source.tails:
                source.tails[path] = StepLogTail(entry.job, Path(path), accept=accept)


def _accept_rows(node: str, gpus: frozenset[int]) -> Callable[[dict[str, Any]], bool]:
    def accept(row: dict[str, Any]) -> bool:
        if row.get("node") not in (None, node):
            return False
        gpu = row.get("gpu_index")
        return gpu is None or not gpus or gpu in gpus

    return accept


def tail_id(tail: StepLogTail) -> str:
    """A short, stable name of one file, for message ids (two files of one job never collide)."""
    return hashlib.sha256(str(tail.path).encode()).hexdigest()[:12]
