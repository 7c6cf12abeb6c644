"""Run a service until SIGTERM/SIGINT, then let it finish the batch in hand and drain."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from services.runtime.logs import get_logger

log = get_logger("chamber.runtime.lifecycle")


async def run_until_stopped(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Call `main(stop)`; a signal sets `stop`, which every consumer loop watches."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _request_stop, stop, sig)
    try:
        await main(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _request_stop(stop: asyncio.Event, sig: signal.Signals) -> None:
    log.info("stopping", signal=sig.name)
    stop.set()
