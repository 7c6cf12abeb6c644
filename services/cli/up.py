"""`chamber up`: the whole stack on one machine — embedded NATS, every service as a supervised
process, and a real NVML agent when a GPU is present or else a simulated fleet.

The data directory is private (0700). The embedded NATS refuses anonymous clients: each process
logs in as its role's user (`chamber nats-config` roles), its password read from a 0600 file under
`DATA_DIR/nats-users/`; the environment names the user and the file, never the secret.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import fcntl
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from services.cli.common import (
    UP_URL_FILE,
    add_partitions_option,
    add_replicas_option,
    apply_partitions_option,
    apply_replicas_option,
    finite_float,
)
from services.cli.errors import UsageError

if TYPE_CHECKING:
    from services.stack.supervisor import Component

GATEWAY_HOST = "127.0.0.1"
DEMO_SETUP_MARKER = "demo-setup-pending"  # the demo's quotas are still to be set (a new data dir)
SECRETS = ("CHAMBER_API_TOKEN",)  # kept from the children that have no use for them


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("up", help="start the whole stack on this machine (embedded NATS, services, fleet)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("CHAMBER_DATA_DIR", ".chamber")),
        help="where streams and the warehouse live (default: $CHAMBER_DATA_DIR or .chamber)",
    )
    p.add_argument(
        "--nats", metavar="URL", help="use this NATS (one URL or a comma-separated list) instead of an embedded one"
    )
    add_replicas_option(p)
    add_partitions_option(p)
    p.add_argument(
        "--nats-port",
        type=int,
        default=int(os.environ.get("CHAMBER_NATS_PORT", "4222")),
        help="port of the embedded NATS (default: $CHAMBER_NATS_PORT or 4222)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("CHAMBER_PORT", "8080")),
        help="dashboard and HTTP API port (default: $CHAMBER_PORT or 8080)",
    )
    p.add_argument(
        "--nats-monitor-port",
        type=int,
        metavar="PORT",
        help="also serve the embedded NATS's HTTP monitoring on 127.0.0.1:PORT (off by default: it has no "
        "login, and any local user could read the server's connections and subjects from it)",
    )
    p.add_argument("--nodes", type=int, default=16, help="simulated nodes when no GPU is present (default 16)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per simulated node (default 8)")
    p.add_argument(
        "--amd-nodes",
        type=int,
        default=0,
        metavar="N",
        help="of the simulated nodes, N are AMD Instinct MI300X nodes (default 0)",
    )
    p.add_argument("--no-workload", action="store_true", help="do not generate jobs for the demo teams")
    p.add_argument(
        "--telemetry-keep-min",
        type=finite_float,
        help="minutes TELEMETRY keeps samples (default 15; the warehouse is the history)",
    )
    p.add_argument("--telemetry-max-mb", type=finite_float, help="most MiB TELEMETRY keeps on disk (default 1024)")
    p.set_defaults(func=run)


def _lock(data_dir: Path) -> int:
    from services.stack.credentials import private_dir

    private_dir(data_dir)
    path = data_dir / "up.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
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
    for name in ("port", "nats_port", "nats_monitor_port"):
        if getattr(args, name, None) is not None and not 0 < getattr(args, name) < 65536:
            raise UsageError(f"--{name.replace('_', '-')} must be a TCP port (1-65535)")
    if args.nats is None and args.port == args.nats_port:
        raise UsageError(f"--port and --nats-port are both {args.port}; give them different ports")
    _telemetry_retention(args)


def _telemetry_retention(args: argparse.Namespace) -> None:
    """The flags become the environment every process of the stack reads (they must all agree)."""
    from events.streams import ENV_TELEMETRY_MAX_AGE, ENV_TELEMETRY_MAX_BYTES, telemetry_retention

    for flag, value, env, scale in (
        ("--telemetry-keep-min", getattr(args, "telemetry_keep_min", None), ENV_TELEMETRY_MAX_AGE, 60),
        ("--telemetry-max-mb", getattr(args, "telemetry_max_mb", None), ENV_TELEMETRY_MAX_BYTES, 2**20),
    ):
        if value is None:
            continue
        if not value > 0:
            raise UsageError(f"{flag} must be more than 0, not {value:g}")
        os.environ[env] = str(int(value * scale))
    try:
        telemetry_retention()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Would a server fail to listen on host:port? (SO_REUSEADDR as servers set it, so a port left in
    TIME_WAIT by the last run counts as free, and any listener, on this address or all, as taken.)"""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def check_ports(args: argparse.Namespace) -> None:
    """Refuse to start over another server (another `chamber up`, say): it would answer our checks."""
    wanted = [("--port", args.port, "the dashboard")]
    if args.nats is None:
        wanted.append(("--nats-port", args.nats_port, "the embedded NATS"))
    for option, port, what in wanted:
        if port_in_use(port):
            raise UsageError(
                f"port {port} ({what}) is already in use, perhaps by another `chamber up`; stop that, or "
                f"choose another with {option} (make up: `make up PORT=8081 NATS_PORT=4223`)"
            )


def run(args: argparse.Namespace) -> int:
    from services.runtime.logs import configure_logging

    _validate(args)
    apply_replicas_option(args)  # children inherit $CHAMBER_NATS_REPLICAS
    partitions = apply_partitions_option(args)  # and $CHAMBER_TELEMETRY_PARTITIONS
    configure_logging("error")  # the console shows component readiness; details are in the logs
    data_dir = args.data_dir.resolve()
    lock = _lock(data_dir)  # first: "already running on this data dir" says more than "port in use"
    try:
        _clean_up_after_crash(data_dir)  # we hold the lock: anything still recorded is a crashed run's
        check_ports(args)
        _print_disk_budget(args)
        asyncio.run(_serve(args, data_dir, partitions))
    finally:
        os.close(lock)
    return 0


CHILDREN = "children.jsonl"  # the supervisor's record of what it started (for the next start)


def _clean_up_after_crash(data_dir: Path) -> None:
    from services.stack.containment import clean_up_after_crash

    stopped = clean_up_after_crash(data_dir / CHILDREN)
    if stopped:
        names = ", ".join(f"{c.name} (pid {c.pid})" for c in stopped)
        print(f"  {'cleanup':<11}stopped what a previous chamber up left running: {names}", flush=True)


def _print_disk_budget(args: argparse.Namespace) -> None:
    from services.cli.disk_budget import describe

    gpu_host = Path("/dev/nvidiactl").exists()  # a real agent: this one node
    lines = describe(1 if gpu_host else args.nodes, 8 if gpu_host else args.gpus_per_node)
    for i, line in enumerate(lines):
        print(f"  {'disk' if i == 0 else '':<11}{line}", flush=True)


def api_token(data_dir: Path) -> str:
    """The gateway's bearer token for commands: $CHAMBER_API_TOKEN, else one kept in the data dir
    (created 0600, whole, at the first start)."""
    if os.environ.get("CHAMBER_API_TOKEN"):
        return os.environ["CHAMBER_API_TOKEN"]
    import secrets

    from services.stack.credentials import create_secret

    return create_secret(data_dir / "api-token", secrets.token_urlsafe(24))


def _cluster() -> str:
    from services.cli.common import DEFAULT_CLUSTER

    return os.environ.get("CHAMBER_CLUSTER", DEFAULT_CLUSTER)


def _login(data_dir: Path, user: str) -> dict[str, str]:
    """The environment that makes a child log in as `user` (the password stays in its file)."""
    from services.stack.credentials import password_file

    return {"CHAMBER_NATS_USER": user, "CHAMBER_NATS_PASSWORD_FILE": str(password_file(data_dir, user))}


def _components(args: argparse.Namespace, url: str, data_dir: Path, *, secured: bool) -> list[Component]:
    from services.cli import command_names
    from services.cli.service import discover
    from services.stack.supervisor import Component

    chamber = [sys.executable, "-m", "services.cli"]
    env = {
        "CHAMBER_DATA_DIR": str(data_dir),
        "CHAMBER_NATS_URL": url,
        "CHAMBER_AGENT_SPOOL": str(data_dir / "agent-spool"),
        # one machine, a demo: cost lands on the dashboard each minute, not every five
        "CHAMBER_BILLING_PERIOD": os.environ.get("CHAMBER_BILLING_PERIOD", "60"),
    }

    def login(user: str) -> dict[str, str]:
        return _login(data_dir, user) if secured else {}

    components: list[Component] = []
    for name, module in discover().items():
        if not getattr(module, "RUNS_IN_UP", True):
            continue  # e.g. the admission webhook: only a Kubernetes API server calls it
        extra: dict[str, str] = {}
        argv = [*chamber, "service", name, "--nats", url]
        if name == "gateway":
            argv += ["--port", str(args.port), "--host", GATEWAY_HOST]
            extra["CHAMBER_API_TOKEN_FILE"] = str(data_dir / "api-token")  # only the gateway reads it
        components.append(Component(name, argv, {**env, **login(f"svc-{name}"), **extra}))
    commands = set(command_names())  # by name: importing every command's module would cost this process memory
    if "agent" in commands:
        if Path("/dev/nvidiactl").exists() or Path("/dev/kfd").exists():  # NVIDIA, or AMD (ROCm's KFD)
            agent, user = ["agent", "--nats", url], "agent"
        else:
            agent = ["agent", "--simulate", "--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node)]
            if getattr(args, "amd_nodes", 0):
                agent += ["--amd-nodes", str(args.amd_nodes)]
            agent, user = [*agent, "--nats", url], "simulator"
        components.append(Component("agent", [*chamber, *agent], {**env, **login(user)}))
    if "workload" in commands and not args.no_workload:
        gpus = str(args.nodes * args.gpus_per_node)
        argv = [*chamber, "workload", "--nats", url, "--gpus", gpus]
        argv += ["--setup-marker", str(data_dir / DEMO_SETUP_MARKER)]
        components.append(Component("workload", argv, {**env, **login("workload")}))
    for component in components:
        if component.name != "gateway":  # a token exported in this shell is the gateway's alone
            component.unset = SECRETS
    return components


def mark_demo_setup(data_dir: Path, quota_events: int) -> bool:
    """On a new data directory (nothing in QUOTA yet, on the embedded NATS or on `--nats`) the demo
    sets its price and quotas, once: a later start must not overwrite what the user set since. The
    marker survives an interrupted first start, so the setup is finished the next time. True when
    the demo will set up."""
    marker = data_dir / DEMO_SETUP_MARKER
    if quota_events == 0:
        marker.touch(mode=0o600)
    return marker.exists()


async def _serve(args: argparse.Namespace, data_dir: Path, partitions: int = 1) -> None:
    from events.streams import QUOTA
    from services.cli.service import discover
    from services.runtime import connect, run_until_stopped
    from services.runtime.nats_server import NatsServerProcess
    from services.runtime.setup import set_up
    from services.stack.credentials import nats_auth, password_file
    from services.stack.supervisor import Component, Supervisor

    supervisor = Supervisor(data_dir / "logs", record=data_dir / CHILDREN)
    url = args.nats
    store = data_dir / "nats"
    server: NatsServerProcess | None = None
    if url is None:
        from events.partitions import server_mapping_conf

        mapping = server_mapping_conf(partitions)  # the telemetry partition mapping, when there is one
        conf = nats_auth(data_dir, _cluster(), list(discover()), extra=mapping)
        monitor = args.nats_monitor_port is not None  # off unless asked: it answers any local user
        server = NatsServerProcess(
            store,
            port=args.nats_port,
            monitor=monitor,
            monitor_port=args.nats_monitor_port or None,
            extra_args=["-c", str(conf)],
        )
        # supervised like every component: a killed nats-server is restarted on the same store and port
        supervisor.add(Component("nats", server.argv(), stop_last=True, unset=SECRETS, heartbeat=False))
        url = server.url
        # the operator's CLI in this directory finds this stack's port (the URL holds no password)
        (data_dir / UP_URL_FILE).write_text(url + "\n")
    api_token(data_dir)  # created now, before the gateway reads it

    async def until_stopped(stop: asyncio.Event) -> None:
        try:
            if server is not None:
                store.mkdir(parents=True, exist_ok=True)
                await supervisor.start()
                if not await _wait_for_nats(server, supervisor, stop):
                    return
                print(
                    f"  {'nats':<11}ready   {url}  (JetStream store {store}; no anonymous clients: "
                    f"users and passwords in {data_dir / 'nats-users'}; "
                    + (f"monitoring on 127.0.0.1:{server.monitor_port})" if server.monitor else "no monitoring port)"),
                    flush=True,
                )
            operator = None
            if server is not None:
                operator = {"user": "admin", "password": password_file(data_dir).read_text().strip()}
            nc = await connect(url, name="chamber-up", credentials=operator)
            try:
                changed = await set_up(nc.jetstream())  # streams and buckets: services may not make them
                if not args.no_workload:
                    mark_demo_setup(data_dir, (await nc.jetstream().stream_info(QUOTA.name)).state.messages)
            finally:
                await nc.close()
            print(f"  {'streams':<11}ready   ({', '.join(changed) or 'all present'})", flush=True)
            for component in _components(args, url, data_dir, secured=server is not None):
                supervisor.add(component)
            await supervisor.start()
            if supervisor.running("gateway"):
                await _wait_for_gateway(args.port, stop, supervisor, data_dir / "api-token")
            print("chamber is up; press Ctrl-C to stop", flush=True)  # signal handlers are in place now
            await stop.wait()
        finally:
            print("stopping ...", flush=True)
            await supervisor.stop()
            if server is not None:
                print(f"  {'nats':<11}stopped", flush=True)

    await run_until_stopped(until_stopped, grace_s=None)  # it stops its children first, in order


async def _wait_for_nats(server: object, supervisor: object, stop: asyncio.Event, timeout_s: float = 30.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not stop.is_set() and loop.time() < deadline:
        if await asyncio.to_thread(server.ready):  # type: ignore[attr-defined]
            return True
        await asyncio.sleep(0.1)
    if stop.is_set():
        return False
    log = Path(supervisor.log_dir) / "nats.log"  # type: ignore[attr-defined]
    raise UsageError(f"the embedded nats-server was not ready after {timeout_s:g}s; see {log}")


def _healthz(url: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:  # 503 while the gateway's bus is not connected yet
        try:
            return dict(json.loads(exc.read()))
        except ValueError:
            return None
    except (OSError, ValueError):
        return None


async def _wait_for_gateway(
    port: int, stop: asyncio.Event, supervisor: object, token_file: Path, timeout_s: float = 60.0
) -> None:
    """Ready when *our* gateway answers: the pid in its /healthz is the one we started."""
    url = f"http://{GATEWAY_HOST}:{port}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    gateway = next(c for c in supervisor.components if c.name == "gateway")  # type: ignore[attr-defined]
    while not stop.is_set() and loop.time() < deadline:
        answer = await asyncio.to_thread(_healthz, url)
        if answer is not None and answer.get("pid") == gateway.pid and answer.get("ok"):
            print(f"  {'dashboard':<11}ready   {url}/", flush=True)
            if os.environ.get("CHAMBER_API_TOKEN"):
                print(f"  {'api token':<11}$CHAMBER_API_TOKEN (from this shell)", flush=True)
            else:
                print(
                    f"  {'api token':<11}in {token_file}; for commands over HTTP: "
                    f'export CHAMBER_API_TOKEN="$(cat {token_file})"',
                    flush=True,
                )
            return
        if answer is not None and answer.get("pid") not in (None, gateway.pid):
            print(f"  {'dashboard':<11}NOT ready: another process answers on port {port}", flush=True)
            return
        await asyncio.sleep(0.5)
    print(f"  {'dashboard':<11}not ready after {timeout_s:g}s; see the gateway log", flush=True)
