"""`chamber service recorder`: every stream into the warehouse, and read-only SQL over request/reply.

One durable consumer per stream hands whole fetched batches (up to --batch-size messages, or what
arrived within --flush-interval) to the writer; the runtime acks them only after the writer returns.
It also answers `chamber.cmd.recorder.sql`, because with chDB only this process may open the
warehouse directory while it runs. Those queries go through the analytics door (warehouse/door.py):
sessions and threads of their own, a bounded queue, never the writer's thread or session.

This module is the service's light front (name, role, options): `chamber up` and `chamber nats-config`
import every service's module, and only the recorder process itself should load Arrow, pandas and
chDB. The work is in services/recorder/pipeline.py, imported when the service runs (its functions are
also reachable from here: `from services.recorder.service import setup_recorder`).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from events.streams import BILLING, DISPATCH, FAULTS, FLEET, JOBS, QUOTA, TELEMETRY
from services.recorder.partitions import MEMBERS_BUCKET
from services.runtime.manifest import Manifest

NAME = "recorder"
DESCRIPTION = "record telemetry and every domain event in the warehouse (ClickHouse or chDB); answer SQL"
DURABLE = "recorder"
STREAMS = (TELEMETRY, FAULTS, FLEET, JOBS, QUOTA, BILLING, DISPATCH)

ROLE = Manifest(
    reads=tuple(s.name for s in STREAMS),
    durables=tuple((s.name, DURABLE) for s in STREAMS),
    buckets=(MEMBERS_BUCKET,),
    leases=True,
    why="stores every stream in the warehouse through its durable consumers; answers SQL",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # the defaults live with the code that uses them (imported only where the recorder's options are built)
    from services.recorder.retention import RAW_TTL_DAYS, ROLLUP_TTL_DAYS
    from services.recorder.samples import FETCH_MAX_BYTES
    from services.warehouse.door import QUEUE_LIMIT
    from services.warehouse.options import add_warehouse_options

    add_warehouse_options(parser)
    parser.add_argument("--batch-size", type=int, default=2000, help="most messages stored per insert (2000)")
    parser.add_argument(
        "--flush-interval", type=float, default=1.0, help="longest wait in seconds for a batch to fill (1.0)"
    )
    parser.add_argument(
        "--fetch-max-mb",
        type=float,
        default=FETCH_MAX_BYTES / 2**20,
        help=f"most MiB of samples per fetch, whatever --batch-size says ({FETCH_MAX_BYTES / 2**20:g})",
    )
    parser.add_argument("--telemetry-consumers", type=int, default=3, help="parallel pull consumers on TELEMETRY (3)")
    parser.add_argument(
        "--ack-wait", type=float, default=60.0, help="seconds before an unacked batch is redelivered (60)"
    )
    parser.add_argument(
        "--raw-ttl-days", type=int, default=RAW_TTL_DAYS, help=f"days raw GPU samples are kept ({RAW_TTL_DAYS})"
    )
    parser.add_argument(
        "--rollup-ttl-days",
        type=int,
        default=ROLLUP_TTL_DAYS,
        help=f"days the per-GPU minute rollups are kept ({ROLLUP_TTL_DAYS})",
    )
    parser.add_argument(
        "--rollup-every",
        type=float,
        default=5.0,
        help="seconds between recomputations of the minute rollups from the de-duplicated samples (5)",
    )
    parser.add_argument(
        "--sql-slots", type=int, default=1, help="analytics queries run at once, each on its own session (1)"
    )
    parser.add_argument(
        "--sql-queue", type=int, default=QUEUE_LIMIT, help=f"analytics queries that may wait for a slot ({QUEUE_LIMIT})"
    )
    parser.add_argument(
        "--sql-threads",
        type=int,
        default=0,
        help="threads one analytics query may use (0: a quarter of the CPUs, at least 1)",
    )
    parser.add_argument(
        "--sql-memory-mib",
        type=int,
        default=0,
        help="memory one analytics query may use, in MiB (0: a quarter of the container's memory limit over "
        "the query slots, at most 2 GiB; 2 GiB where no limit is set)",
    )
    parser.add_argument(
        "--partition-lease-ttl",
        type=float,
        default=15.0,
        help="seconds a telemetry partition's lease lives without renewal; recorders rebalance within it (15)",
    )


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    from services.recorder import pipeline

    await pipeline.run(args, stop)


# The pipeline's names reachable from here. Only these: `getattr(module, "RUNS_IN_UP", True)` in
# `chamber up` must not load the pipeline to find out that a name is absent.
_PIPELINE = frozenset(
    {"setup_recorder", "answer_sql", "to_recorded", "rollup_rounds", "open_and_migrate", "SqlRequest"}
)


def __getattr__(name: str) -> Any:
    """The pipeline's functions, imported on first use."""
    if name not in _PIPELINE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from services.recorder import pipeline

    return getattr(pipeline, name)
