"""The agent's NCCL RAS loop (asyncio shell around node_agent/ras.py and the pure ras_watch.py): query
STATUS every `interval_s`, keep a MONITOR connection open for PEER_DEAD, and hand the latest
communicator progress and any dead peers to the fabric sample (`FabricAdapter(ras=..., ras_dead=...)`).

A job that is not running NCCL (nothing listens on the port) is the normal case: the poller retries
quietly and the fabric samples carry no communicators.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from events.fabric import CommProgress, DeadPeer
from node_agent import ras_watch
from node_agent.ras import RasClient, RasError
from services.runtime.logs import get_logger

log = get_logger("chamber.agent.ras")
MONITOR_RETRY_S = 5.0


@dataclass
class RasPoller:
    client: RasClient = field(default_factory=RasClient)
    interval_s: float = 5.0
    clock: Callable[[], float] = time.time
    watch: ras_watch.RasWatch = field(default_factory=ras_watch.RasWatch)
    reachable: bool | None = None
    queries: int = 0

    def comms(self) -> list[CommProgress] | None:
        """The latest query's communicators (None while RAS has not answered)."""
        return list(self.watch.comms) if self.reachable else None

    def take_dead(self) -> list[DeadPeer]:
        return ras_watch.take_dead(self.watch)

    async def poll_once(self) -> None:
        try:
            status = await self.client.status_any()
        except RasError as err:
            if self.reachable is not False:
                log.info("NCCL RAS not answering; collective progress skipped", reason=str(err))
            self.reachable = False
            self.watch.comms = []
            return
        self.reachable = True
        self.queries += 1
        ras_watch.observe(self.watch, status, self.clock())

    async def run(self, stop: asyncio.Event) -> None:
        monitor = asyncio.create_task(self._monitor(stop))
        try:
            while not stop.is_set():
                await self.poll_once()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)
        finally:
            monitor.cancel()
            with contextlib.suppress(BaseException):
                await monitor

    async def _monitor(self, stop: asyncio.Event) -> None:
        """PEER_DEAD as soon as RAS declares it (STATUS would show it only at the next query)."""
        fmt = "json"
        while not stop.is_set():
            try:
                async for peer in self.client.monitor(fmt):
                    ras_watch.peer_dead(self.watch, peer, self.clock())
            except RasError as err:
                if fmt == "json" and "SET FORMAT" in str(err):
                    fmt = "text"  # an NCCL without JSON output (< 2.28.7): MONITOR's text lines
                    continue
                # no NCCL job, or one older than 2.29 (no MONITOR): STATUS still reports DEAD
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), MONITOR_RETRY_S)
