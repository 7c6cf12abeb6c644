"""`chamber up`: the whole stack on one machine — embedded NATS, every service as a supervised
process, and a real NVML agent when a GPU is present or else a simulated fleet."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import sys
import urllib.request
from pathlib import Path

from services.cli.errors import UsageError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("up", help="start the whole stack on this machine (embedded NATS, services, fleet)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("CHAMBER_DATA_DIR", ".chamber")),
        help="where streams and the warehouse live (default: $CHAMBER_DATA_DIR or .chamber)",
    )
    p.add_argument("--nats", metavar="URL", help="use this NATS instead of starting an embedded one")
    p.add_argument("--nats-port", type=int, default=4222, help="port of the embedded NATS (default 4222)")
    p.add_argument("--port", type=int, default=8080, help="dashboard and HTTP API port (default 8080)")
    p.add_argument("--nodes", type=int, default=16, help="simulated nodes when no GPU is present (default 16)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per simulated node (default 8)")
    p.add_argument("--no-workload", action="store_true", help="do not generate jobs for the demo teams")
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


def _validate(args: argparse.Namespace) -> None:
    for name in ("nodes", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("port", "nats_port"):
        if not 0 < getattr(args, name) < 65536:
            raise UsageError(f"--{name.replace('_', '-')} must be a TCP port (1-65535)")


def run(args: argparse.Namespace) -> int:
    from services.runtime.logs import configure_logging
    from services.runtime.nats_server import NatsServerError, NatsServerProcess

    _validate(args)
    configure_logging("error")  # the console shows component readiness; details are in the logs
    data_dir = args.data_dir.resolve()
    lock = _lock(data_dir)
    server: NatsServerProcess | None = None
    try:
        url = args.nats
        if url is None:
            server = NatsServerProcess(data_dir / "nats", port=args.nats_port, log_file=data_dir / "nats-server.log")
            try:
                server.start()
            except NatsServerError as exc:
                raise UsageError(f"{exc}; is port {args.nats_port} in use? pick another with --nats-port") from None
            url = server.url
        print(f"  {'nats':<11}ready   {url}  (JetStream store {data_dir / 'nats'})", flush=True)
        asyncio.run(_serve(args, url, data_dir))
    finally:
        if server is not None:
            server.stop()
            print(f"  {'nats':<11}stopped", flush=True)
        os.close(lock)
    return 0


def api_token(data_dir: Path) -> str:
    """The gateway's bearer token for commands: $CHAMBER_API_TOKEN, else one kept in the data dir."""
    if os.environ.get("CHAMBER_API_TOKEN"):
        return os.environ["CHAMBER_API_TOKEN"]
    path = data_dir / "api-token"
    if not path.exists():
        import secrets

        path.write_text(secrets.token_urlsafe(24))
        path.chmod(0o600)
    return path.read_text().strip()


def _components(args: argparse.Namespace, url: str, data_dir: Path) -> list[object]:
    from services.cli import command_modules
    from services.cli.service import discover
    from services.stack.supervisor import Component

    chamber = [sys.executable, "-m", "services.cli"]
    env = {
        "CHAMBER_DATA_DIR": str(data_dir),
        "CHAMBER_NATS_URL": url,
        "CHAMBER_API_TOKEN": api_token(data_dir),  # in the environment, not argv: `ps` would show it
        "CHAMBER_AGENT_SPOOL": str(data_dir / "agent-spool"),
        # one machine, a demo: cost lands on the dashboard each minute, not every five
        "CHAMBER_BILLING_PERIOD": os.environ.get("CHAMBER_BILLING_PERIOD", "60"),
    }
    components = []
    for name, module in discover().items():
        if not getattr(module, "RUNS_IN_UP", True):
            continue  # e.g. the admission webhook: only a Kubernetes API server calls it
        extra = ["--port", str(args.port)] if name == "gateway" else []
        components.append(Component(name, [*chamber, "service", name, "--nats", url, *extra], env))
    commands = {m.__name__.rsplit(".", 1)[-1] for m in command_modules()}
    if "agent" in commands:
        if Path("/dev/nvidiactl").exists():
            agent = ["agent", "--nats", url]
        else:
            agent = ["agent", "--simulate", "--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node)]
            agent += ["--nats", url]
        components.append(Component("agent", [*chamber, *agent], env))
    if "workload" in commands and not args.no_workload:
        gpus = str(args.nodes * args.gpus_per_node)
        components.append(Component("workload", [*chamber, "workload", "--nats", url, "--gpus", gpus], env))
    return components


async def _serve(args: argparse.Namespace, url: str, data_dir: Path) -> None:
    from services.runtime import connect, ensure_streams, run_until_stopped
    from services.stack.supervisor import Supervisor

    nc = await connect(url, name="chamber-up")
    try:
        changed = await ensure_streams(nc.jetstream())
    finally:
        await nc.close()
    print(f"  {'streams':<11}ready   ({', '.join(changed) or 'all present'})", flush=True)

    supervisor = Supervisor(data_dir / "logs")
    components = _components(args, url, data_dir)
    for component in components:
        supervisor.add(component)  # type: ignore[arg-type]

    async def until_stopped(stop: asyncio.Event) -> None:
        await supervisor.start()
        if any(c.name == "gateway" for c in supervisor.components):
            await _wait_for_gateway(args.port, stop, data_dir / "api-token")
        print("chamber is up; press Ctrl-C to stop", flush=True)  # signal handlers are in place now
        await stop.wait()
        print("stopping ...", flush=True)
        await supervisor.stop()

    await run_until_stopped(until_stopped)


async def _wait_for_gateway(port: int, stop: asyncio.Event, token_file: Path, timeout_s: float = 60.0) -> None:
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not stop.is_set() and loop.time() < deadline:
        if await asyncio.to_thread(ready):
            print(f"  {'dashboard':<11}ready   {url}/   (API token for commands in {token_file})", flush=True)
            return
        await asyncio.sleep(0.5)
    print(f"  {'dashboard':<11}not ready after {timeout_s:g}s; see the gateway log", flush=True)
