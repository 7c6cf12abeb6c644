"""`chamber up`: the whole stack on one machine. Grows as services land (issue: local stack)."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
from pathlib import Path

from services.cli.errors import UsageError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("up", help="start the whole stack on this machine (embedded NATS, services)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("CHAMBER_DATA_DIR", ".chamber")),
        help="where streams and the warehouse live (default: $CHAMBER_DATA_DIR or .chamber)",
    )
    p.add_argument("--nats", metavar="URL", help="use this NATS instead of starting an embedded one")
    p.add_argument("--nats-port", type=int, default=4222, help="port of the embedded NATS (default 4222)")
    p.set_defaults(func=run)


def _lock(data_dir: Path) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "up.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode().strip() or "?"
        os.close(fd)
        raise UsageError(
            f"chamber up is already running on {data_dir} (pid {other}); stop it with Ctrl-C or use another --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def run(args: argparse.Namespace) -> int:
    from services.runtime.logs import configure_logging
    from services.runtime.nats_server import NatsServerError, NatsServerProcess

    configure_logging("warning")
    lock = _lock(args.data_dir)
    server: NatsServerProcess | None = None
    try:
        url = args.nats
        if url is None:
            server = NatsServerProcess(
                args.data_dir / "nats", port=args.nats_port, log_file=args.data_dir / "nats-server.log"
            )
            try:
                server.start()
            except NatsServerError as exc:
                raise UsageError(f"{exc}; is port {args.nats_port} in use? pick another with --nats-port") from None
            url = server.url
        print(f"  nats       ready  {url}  (JetStream store {args.data_dir / 'nats'})", flush=True)
        asyncio.run(_serve(url))
    finally:
        if server is not None:
            server.stop()
            print("  nats       stopped", flush=True)
        os.close(lock)
    return 0


async def _serve(url: str) -> None:
    from services.runtime import connect, ensure_streams, run_until_stopped

    nc = await connect(url, name="chamber-up")
    try:
        changed = await ensure_streams(nc.jetstream())
        print(f"  streams    ready  ({', '.join(changed) or 'all present'})", flush=True)

        async def until_stopped(stop: asyncio.Event) -> None:
            print("chamber is up; press Ctrl-C to stop", flush=True)  # signal handlers are in place now
            await stop.wait()

        await run_until_stopped(until_stopped)
    finally:
        await nc.drain()
