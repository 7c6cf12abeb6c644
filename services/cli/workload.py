"""`chamber workload`: keep a simulated fleet busy with three teams' jobs (what `chamber up` runs)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from services.cli.common import add_nats_option, finite_float


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("workload", help="submit a demo workload for three teams (simulated fleets)")
    add_nats_option(p)
    p.add_argument("--gpus", type=int, default=128, help="GPUs in the fleet, to size quotas and load (128)")
    p.add_argument("--gpu-model", default="H100-80GB", help="GPU model to price (default H100-80GB)")
    p.add_argument("--price", type=finite_float, default=3.50, help="price per GPU-hour set at start (3.50)")
    p.add_argument("--load", type=finite_float, default=1.1, help="offered load as a multiple of the fleet (1.1)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--setup-marker",
        type=Path,
        metavar="FILE",
        help="set the price and quotas only while FILE exists, and remove it once done (`chamber up` makes it "
        "on a new data directory, so a restart keeps the quotas the user set); default: always set them",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.runtime import run_until_stopped
    from services.runtime.lifecycle import exit_stopped
    from services.runtime.logs import configure_logging

    configure_logging("info")
    asyncio.run(run_until_stopped(lambda stop: _main(args, stop)))
    exit_stopped(0)  # past this point nothing is left to do (see exit_stopped)


async def _until_done(nc: Any, stop: asyncio.Event, service: str, verb: str, payload: dict[str, Any]) -> None:
    """Retry a setup command until its service answers yes (it may still be starting)."""
    from services.runtime.commands import CommandRefused, CommandUnavailable, request
    from services.runtime.logs import get_logger

    log = get_logger("chamber.workload")
    while not stop.is_set():
        try:
            await request(nc, service, verb, payload, timeout=5)
            log.info("setup done", service=service, verb=verb, payload=payload)
            return
        except (CommandRefused, CommandUnavailable) as exc:
            log.info("setup not accepted yet, retrying", service=service, verb=verb, error=str(exc))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=3)


async def _main(args: argparse.Namespace, stop: asyncio.Event) -> None:
    from services.runtime import connect
    from services.runtime.commands import CommandRefused, CommandTimedOut, CommandUnavailable, request
    from services.runtime.logs import get_logger
    from services.stack.workload import WARM_FILL, arrivals, quota_requests

    log = get_logger("chamber.workload")
    nc = await connect(args.nats, name="chamber-workload")
    try:
        marker = args.setup_marker
        first_run = marker is None or marker.exists()
        if first_run:
            price = {"gpu_model": args.gpu_model, "price_per_gpu_hour": args.price}
            await _until_done(nc, stop, "billing", "price", price)
            for quota in quota_requests(args.gpus):
                await _until_done(nc, stop, "quota", "set", quota)
            if marker is not None and not stop.is_set():
                marker.unlink(missing_ok=True)
        else:
            log.info("setup skipped: the data directory was set up before", marker=str(marker))
        # a restarted stack still has its queue: a second warm-up burst on top would double its load
        warm_fill = WARM_FILL if first_run else 0.0
        for arrival in arrivals(args.seed, time.time(), args.gpus, args.load, warm_fill=warm_fill):
            delay = arrival.at - time.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
            if stop.is_set():
                return
            while not stop.is_set():
                try:
                    result = await request(nc, "scheduler", "submit", arrival.request, timeout=5)
                    log.info("submitted", job=result, team=arrival.request["team"])
                    break
                except CommandTimedOut as exc:  # it may have been submitted: not sent twice
                    log.warning("submit not answered", error=str(exc), request=arrival.request)
                    break
                except CommandUnavailable as exc:  # no scheduler yet (starting or restarting): the job waits
                    log.info("scheduler not answering yet, retrying", error=str(exc))
                except CommandRefused as exc:
                    log.warning("submit failed", error=str(exc), request=arrival.request)
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=2)
    finally:
        await nc.close()
