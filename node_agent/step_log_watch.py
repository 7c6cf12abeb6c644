"""The step logs that jobs on this node name in their workload (`chamber.io/step-log`), as the
scheduler hands them out: its node's keys of the KV bucket `chamber_step_logs`
(services/scheduler/step_logs.py). The agent follows them through the one consumer its
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
import os
import time
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
POLL_S = 10.0  # the longest a pull for changes waits (and the pause after a failure)
REOPEN_S = 300.0  # the consumer is made afresh this often (a server restart loses it)
GLOB_EVERY_TICKS = 10  # a job's files are looked for again this often (a rank may start late)
MISSING_SCANS = 6  # a job's log not found this many times in a row (a minute at 1 Hz) is worth a line
_DELETED = ("DEL", "PURGE")


class StepLogFeed:
    """This node's keys, followed through one consumer: created at start (and again every
    `REOPEN_S`, or after an error), it delivers each key's last value, then every change as the
    scheduler writes it; the agent long-polls it. One consumer create per node every few minutes
    and one pending pull each: cheap for the server at a thousand nodes."""

    def __init__(self, js: Any, cluster: str, node: str, opened_at: float) -> None:
        self.js, self.cluster, self.node, self.opened_at = js, cluster, node, opened_at
        self.stream = f"KV_{STEP_LOG_BUCKET}"
        self.name = step_log_consumer(node)
        self.keys: dict[str, StepLogEntry] = {}  # KV key -> its entry
        self._sub: Any = None

    async def open(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError

        with contextlib.suppress(NotFoundError):  # left by a previous round (or process): start afresh
            await self.js.delete_consumer(self.stream, self.name)
        config = ConsumerConfig(
            name=self.name,
            filter_subject=f"$KV.{STEP_LOG_BUCKET}.{step_log_keys_of(self.cluster, self.node)}",
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=REOPEN_S * 2,
        )
        await self.js.add_consumer(self.stream, config=config)
        self._sub = await self.js.pull_subscribe_bind(consumer=self.name, stream=self.stream)

    async def poll(self, wait_s: float) -> dict[str, StepLogEntry]:
        """Wait up to `wait_s` for changes; job -> its entry, as the bucket now says."""
        from nats.errors import TimeoutError as NatsTimeout

        with contextlib.suppress(NatsTimeout, TimeoutError):
            for msg in await self._sub.fetch(256, timeout=wait_s):
                key = msg.subject.removeprefix(f"$KV.{STEP_LOG_BUCKET}.")
                if (msg.headers or {}).get("KV-Operation") in _DELETED:
                    self.keys.pop(key, None)
                    continue
                try:
                    self.keys[key] = msgspec.json.decode(msg.data, type=StepLogEntry)
                except msgspec.ValidationError:
                    log.warning("step-log entry not understood", key=key)
        return {e.job: e for e in self.keys.values()}

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._sub is not None:
                await self._sub.unsubscribe()
            await self.js.delete_consumer(self.stream, self.name)


async def follow_assignments(
    js: Callable[[], Any],
    cluster: str,
    node: str,
    sink: StepLogSources,
    stop: asyncio.Event,
    every_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Follow the bucket while the agent runs; `js()` is None while NATS is away. A failure (no bucket
    yet: no scheduler on Kubernetes) is logged once and tried again `every_s` later."""
    feed: StepLogFeed | None = None
    failing = False
    try:
        while not stop.is_set():
            ctx = js()
            if ctx is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), min(every_s, 1.0))
                continue
            try:
                if feed is None or clock() - feed.opened_at > REOPEN_S:
                    if feed is not None:
                        await feed.close()
                    feed = StepLogFeed(ctx, cluster, node, clock())
                    await feed.open()
                sink.assign(await feed.poll(every_s))
                failing = False
            except Exception as exc:
                if not failing:
                    log.info("no step logs handed out yet", bucket=STEP_LOG_BUCKET, error=repr(exc))
                failing, feed = True, None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), every_s)
    finally:
        if feed is not None:
            await feed.close()


@dataclass
class _Source:
    entry: StepLogEntry
    tails: dict[str, StepLogTail] = field(default_factory=dict)  # path -> its tail
    missing_scans: int = 0  # looked for in vain this many times in a row


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
        found = sorted(glob.glob(pattern)) if "{rank}" in local else [p for p in [local] if os.path.exists(p)]
        source.missing_scans = 0 if found else source.missing_scans + 1
        if source.missing_scans == MISSING_SCANS:  # said once a job: the agent may not see the host's files
            log.info("step log not found (is its directory mounted? --step-log-root)", job=entry.job, path=local)
        for path in found:
            if path not in source.tails:
                source.tails[path] = StepLogTail(entry.job, Path(path), accept=accept, any_job=True)


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
