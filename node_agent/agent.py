"""The agent process (`chamber agent`): the imperative shell around the runners, the simulator and the
executor. It samples on time whether or not NATS is up; the outbox makes publishing lossless.

Real mode: one node read through NVML. Simulated mode (`--simulate`): many nodes in one process, which
also act as the executor of the jobs placed on them, and take injected faults on `chamber.cmd.sim.inject`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client

from events import Event, subjects
from events.streams import GATES
from node_agent.host_capacity import read_capacity, simulated_capacity
from node_agent.outbox import Outbox
from node_agent.runner import NodeFacts, NodeRunner, SeqStore
from node_agent.sim import executor as ex
from node_agent.sim.fleet import SimError, SimFleet
from node_agent.sim.models import gpu_model
from node_agent.spool import Kind, Record, Spool
from services.runtime.backoff import Backoff
from services.runtime.commands import CommandRefused, CommandServer
from services.runtime.connection import connect
from services.runtime.decider import Decider, DeciderHost, Input
from services.runtime.health import HealthServer, HealthState
from services.runtime.host import ServiceContext
from services.runtime.logs import get_logger
from services.runtime.publisher import Publisher
from services.runtime.streams import check_own_streams, ensure_streams
from services.runtime.tracing import configure_tracing

log = get_logger("chamber.agent")
CONNECT_BACKOFF = Backoff(first_s=0.2, max_s=5.0)  # NATS away: samples go to the spool meanwhile

SIM_SERVICE = "sim"


class InjectFault(msgspec.Struct, kw_only=True):
    """`chamber.cmd.sim.inject`: inject one fault into a simulated node (or `clear` its faults)."""

    node: str
    kind: str
    gpu: int | None = None
    xid: int | None = None
    nic: int | None = None


@dataclass
class AgentOptions:
    nats: str
    cluster: str = "local"
    node: str = field(default_factory=socket.gethostname)
    interval_s: float = 1.0
    spool_dir: Path = Path(".chamber/agent-spool")
    spool_max_bytes: int = 256 * 1024 * 1024
    simulate: bool = False
    nodes: int = 4
    gpus_per_node: int = 8
    gpu_model: str = "H100-80GB"
    seed: int = 1
    ack_timeout_s: float = 5.0
    health_port: int | None = None  # /livez and /readyz for Kubernetes probes (0: any free port)
    sysfs_root: Path | None = Path("/")  # where the NICs are read (None: no fabric samples, simulated too)
    nccl_ras: bool = False  # also ask NCCL's RAS service on localhost:28028 for collective progress
    labels: dict[str, str] = field(default_factory=dict)  # topology (rack, leaf, spine) for this node
    vendor: str = "auto"  # auto (AMD when sysfs shows an AMD GPU, else NVIDIA) | nvidia | amd
    amd_nodes: int = 0  # simulated: this many of the nodes are AMD (MI300X) nodes
    amd_gpu_model: str = "MI300X-192GB"
    step_logs: dict[str, Path] = field(default_factory=dict)  # job -> its JSONL step log (node_agent/step_log.py)
    # Also tail the step logs jobs on this node name in their workload (node_agent/step_log_watch.py),
    # read under this root (the host's files, where the agent's container mounts them).
    step_log_root: Path | None = Path("/")
    step_log_poll_s: float = 10.0  # the longest one pull for step-log changes waits (node_agent/step_log_watch.py)
    inspector_dir: Path | None = None  # NCCL Inspector's Prometheus textfiles (node_agent/inspector.py)
    inspector_otlp_port: int | None = None  # ...or its OTLP/HTTP JSON export, received on 127.0.0.1:PORT


class Agent:
    def __init__(
        self, opts: AgentOptions, *, clock: Callable[[], float] = time.time, nvml: Any = None, amdsmi: Any = None
    ) -> None:
        """`nvml` is the pynvml module and `amdsmi` AMD's (None: import the real ones); tests pass fakes."""
        self.ras_poller: Any = None  # node_agent.ras_poller.RasPoller with --nccl-ras
        from node_agent.step_log import StepLogTail

        self.step_logs = [StepLogTail(job, path) for job, path in sorted(opts.step_logs.items())]
        self.step_log_sources: Any = None  # node_agent.step_log_watch.StepLogSources (real mode)
        self.inspector_store: Any = None  # node_agent.inspector.OtlpStore with --nccl-inspector-*
        configure_tracing("agent")
        self.opts = opts
        self.clock = clock
        spool_dir = opts.spool_dir / _safe(opts.cluster) / _safe(opts.node)
        self.spool = Spool(spool_dir / "spool", max_bytes=opts.spool_max_bytes)
        self.seqs = SeqStore(spool_dir / "seq.json")
        self.outbox = Outbox(self.spool, ack_timeout_s=opts.ack_timeout_s, on_reconnect=self._setup_streams)
        self.nc: Client | None = None
        self.fleet: SimFleet | None = None
        self.executor: ex.ExecutorState | None = None
        self._alloc_version = -1
        self._commands: CommandServer | None = None
        self.executor_host: DeciderHost[ex.ExecutorState] | None = None
        self.ticks = 0
        self.job_events = 0  # JobStarted / JobCompleted this process decided
        # Live while the loop answers; ready once NATS is connected (and the simulated executor has
        # folded JOBS). Sampling goes on into the spool either way.
        self.health_state = HealthState(service="agent", checks=[lambda: self.outbox.problem])
        self.health: HealthServer | None = None
        if opts.simulate:
            self.fleet = SimFleet(
                seed=opts.seed,
                nodes=opts.nodes,
                gpus_per_node=opts.gpus_per_node,
                model=gpu_model(opts.gpu_model),
                prefix=opts.node,
                amd_nodes=opts.amd_nodes,
                amd_model=gpu_model(opts.amd_gpu_model),
            )
            facts = NodeFacts(driver_version="sim", cuda_version="sim", simulated=True)
            self.runners = [
                NodeRunner(
                    opts.cluster,
                    name,
                    node,
                    _sim_facts(facts, self.fleet.fabric.labels[name], len(node.gpus)),
                    seq=self.seqs.get(name),
                    source="chamber/agent/sim",
                    fabric=node.fabric_reader() if opts.sysfs_root is not None else None,
                )
                for name, node in self.fleet.nodes.items()
            ]
            self.executor = ex.ExecutorState(cluster=opts.cluster, nodes=frozenset(self.fleet.nodes))
        else:
            sampler = self._open_sampler(nvml, amdsmi)
            host = None
            if opts.sysfs_root is not None:
                from node_agent.dmi_adapter import read_host

                host = read_host(opts.sysfs_root)
            cpu_milli, memory_mib = read_capacity()
            facts = NodeFacts(
                driver_version=sampler.driver_version,
                cuda_version=sampler.cuda_version,
                labels=dict(opts.labels),
                host=host,
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
            )
            fabric = None
            if opts.sysfs_root is not None:
                from node_agent.fabric_adapter import FabricAdapter, node_addresses

                if opts.nccl_ras:
                    from node_agent.ras_poller import RasPoller

                    # STATUS every 5 s (a hang is flagged within three queries) and MONITOR for PEER_DEAD
                    self.ras_poller = RasPoller(clock=clock)
                inspector = None
                if opts.inspector_dir is not None or opts.inspector_otlp_port is not None:
                    from node_agent.inspector import InspectorDir, OtlpStore

                    self.inspector_store = OtlpStore()
                    files = InspectorDir(opts.inspector_dir) if opts.inspector_dir is not None else None
                    store = self.inspector_store

                    def inspector() -> list[Any]:
                        return (files.read() if files is not None else []) + store.read()

                fabric = FabricAdapter(
                    inspector=inspector,
                    root=opts.sysfs_root,
                    labels=dict(opts.labels),
                    ras=self.ras_poller.comms if self.ras_poller else None,
                    ras_dead=self.ras_poller.take_dead if self.ras_poller else None,
                    addresses=node_addresses() if self.ras_poller else [],
                )
            self.runners = [
                NodeRunner(opts.cluster, opts.node, sampler, facts, seq=self.seqs.get(opts.node), fabric=fabric)
            ]
            if opts.step_log_root is not None:
                from node_agent.step_log_watch import StepLogSources

                self.step_log_sources = StepLogSources(opts.node, opts.step_log_root)
            self._nvml = sampler

    def _open_sampler(self, nvml: Any, amdsmi: Any) -> Any:
        """NVML, or AMD's adapter: `--vendor` forces one; auto reads AMD when sysfs shows an AMD GPU."""
        opts = self.opts
        vendor = opts.vendor
        root = opts.sysfs_root if opts.sysfs_root is not None else Path("/")
        if vendor == "auto":
            from node_agent.amd_sysfs import find_cards

            vendor = "amd" if opts.sysfs_root is not None and find_cards(root) else "nvidia"
        if vendor == "amd":
            from node_agent.amd_adapter import AmdSampler

            return AmdSampler.open(root, amdsmi=amdsmi, node=opts.node)
        from node_agent.nvml_adapter import NvmlSampler

        return NvmlSampler.open(nvml, node=opts.node)

    # --- the loops ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        if self.opts.health_port is not None:
            self.health = HealthServer(self.health_state, port=self.opts.health_port)
            await self.health.start()  # before NATS: the agent is live while it spools
        tasks = [
            asyncio.create_task(self.outbox.run(stop)),
            asyncio.create_task(self._connect(stop)),
            asyncio.create_task(self._sample_loop(stop)),
        ]
        if self.ras_poller is not None:
            tasks.append(asyncio.create_task(self.ras_poller.run(stop)))
        if self.step_log_sources is not None:
            from node_agent.step_log_watch import follow_assignments

            js = lambda: self.nc.jetstream() if self.nc is not None and self.nc.is_connected else None  # noqa: E731
            follow = follow_assignments(
                js, self.opts.cluster, self.opts.node, self.step_log_sources, stop, self.opts.step_log_poll_s
            )
            tasks.append(asyncio.create_task(follow))
        if self.opts.inspector_otlp_port is not None and self.inspector_store is not None:
            tasks.append(asyncio.create_task(self._otlp_receiver(stop)))
        stopped = asyncio.create_task(stop.wait())
        try:
            # A loop that dies is a bug: stop the agent loudly (its supervisor restarts it; the spool
            # and the sequence file carry over) rather than run on without sampling or publishing.
            await asyncio.wait([stopped, tasks[0], tasks[2]], return_when=asyncio.FIRST_COMPLETED)
            stop.set()
            await asyncio.gather(tasks[2], tasks[0])
        finally:
            stopped.cancel()
            for task in tasks[1:2] + tasks[3:]:  # the NATS connection, the RAS poller, the step-log watch
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            await self._close()

    async def _otlp_receiver(self, stop: asyncio.Event) -> None:
        """NCCL Inspector's OTLP/HTTP export, on loopback only (Inspector runs on this node)."""
        from aiohttp import web

        from node_agent.inspector import otlp_app

        runner = web.AppRunner(otlp_app(self.inspector_store))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.opts.inspector_otlp_port).start()
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    async def _sample_loop(self, stop: asyncio.Event) -> None:
        interval = self.opts.interval_s
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                if self.fleet is None:
                    # NVML calls block (hundreds per node with NVLink): keep them off the event loop.
                    now = self.clock()
                    self.outbox.submit(await asyncio.to_thread(self.collect, now))
                else:
                    self.tick(self.clock())
            except Exception:  # one bad interval (a driver hiccup) must not end sampling
                log.exception("sampling failed; trying again next interval")
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a long pause): skip the missed intervals, keep the cadence
                next_at = time.monotonic()
                delay = 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    def tick(self, now: float) -> None:
        """One interval for every node: sample, detect, hand the records to the outbox."""
        self.outbox.submit(self.collect(now))

    def collect(self, now: float) -> list[Record]:
        """One interval's records for every node (no asyncio here: it may run in a thread)."""
        interval = self.opts.interval_s
        records: list[Record] = []
        fleet = self.fleet
        if fleet is not None and self.executor is not None:
            self._follow_jobs()
            fleet.step(now)
        for runner in self.runners:
            if fleet is not None and fleet.nodes[runner.node].silent:
                continue
            records.extend(runner.tick(now, interval))
            if runner.refusals:  # a sample over the message limit: never dropped in silence
                for detail in runner.refusals:
                    log.error(
                        "sample over the message limit",
                        node=runner.node,
                        detail=detail,
                        samples_reduced=runner.samples_reduced,
                        samples_refused=runner.samples_refused,
                    )
                runner.refusals.clear()
        records.extend(self._step_records(now))
        self.seqs.save(self.runners)  # before publishing: a sequence is never used twice
        self.ticks += 1
        return records

    def _step_records(self, now: float) -> list[Record]:
        """New rows of the jobs' step logs, one RankStepTimings per job and file (the first runner's
        node): those given on the command line and those the node's jobs name."""
        tails = self.step_logs + (self.step_log_sources.tails() if self.step_log_sources is not None else [])
        if not tails or not self.runners:
            return []
        from node_agent.runner import envelope
        from node_agent.step_log_watch import tail_id

        node = self.runners[0].node
        out = []
        for tail in tails:
            event = tail.event(self.opts.cluster, node, now)
            if event is not None:
                msg_id = f"{self.opts.cluster}/{node}/steps/{tail.job}/{tail_id(tail)}/{tail.offset}"
                subject = subjects.subject_for(event)
                out.append(Record(int(Kind.SAMPLE), subject, *envelope(event, "chamber/agent", msg_id, now)))
        return out

    def _follow_jobs(self) -> None:
        """Let the simulated GPUs' load follow the jobs the executor runs. Its decisions (JobStarted,
        JobCompleted) are the decider host's (`_run_executor`): published, and folded when they
        come back on JOBS."""
        state = self.executor
        assert state is not None and self.fleet is not None
        if state.version != self._alloc_version:
            self._alloc_version = state.version
            self.fleet.assign(ex.allocations(state))

    def _decide_jobs(self, state: ex.ExecutorState, now: float) -> list[tuple[Event, str]]:
        out = ex.decide(state, now)
        self.job_events += len(out)
        return out

    # --- NATS -----------------------------------------------------------------------------------

    async def _connect(self, stop: asyncio.Event) -> None:
        """Connect in the background (sampling already runs, into the spool), retrying forever."""
        delay = 0.0
        while not stop.is_set():
            try:
                self.nc = await connect(self.opts.nats, name=f"chamber-agent-{self.opts.node}", attempts=1)
                break
            except Exception as exc:
                log.warning("nats unreachable, spooling", url=self.opts.nats, error=repr(exc))
                delay = CONNECT_BACKOFF.next(delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
        if self.nc is None:
            return
        self.outbox.attach(self.nc)
        self.health_state.nc = self.nc
        if self.fleet is None:
            return
        await self._start_simulation_io(stop)

    async def _setup_streams(self) -> None:
        """The streams the agent publishes to (its gates), and no other (`check_own_streams`)."""
        assert self.nc is not None
        await check_own_streams(self.nc.jetstream(), GATES)

    async def _start_simulation_io(self, stop: asyncio.Event) -> None:
        """Commands and the JOBS consumer of the simulated fleet (both need NATS)."""
        assert self.nc is not None
        self._commands = CommandServer(self.opts.nats, SIM_SERVICE)
        self._commands.register("inject", InjectFault, self._inject)
        while not stop.is_set():
            try:
                await ensure_streams(self.nc.jetstream(), update=False)
                await self._commands.start()
                break
            except Exception as exc:
                log.warning("simulator commands not ready, retrying", error=repr(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        await self._run_executor(stop)

    async def _run_executor(self, stop: asyncio.Event) -> None:
        """The simulated executor on the decider host: it folds the whole JOBS log at every start and
        decides only once caught up (the host's one definition), then on every interval."""
        assert self.nc is not None and self.executor is not None
        js = self.nc.jetstream()
        state = self.executor
        name = f"sim-executor-{subjects.token(self.opts.cluster)}-{subjects.token(self.opts.node)}"
        ctx = ServiceContext(
            name=name,
            url=self.opts.nats,
            nc=self.nc,
            js=js,
            publisher=Publisher(js, source="chamber/agent/sim-executor"),
            stop=stop,
            health_state=self.health_state,  # ready (and chamber_replaying 0) once JOBS is folded
        )
        decider = Decider(
            name=name,
            inputs=(Input("JOBS"),),
            initial=lambda: state,
            evolve=ex.evolve,
            decide=self._decide_jobs,
            tick_s=self.opts.interval_s,
        )
        self.executor_host = DeciderHost(decider, ctx)
        self.executor_host.install()
        await asyncio.gather(*(task() for task in ctx._tasks))

    async def _inject(self, cmd: InjectFault) -> dict[str, object]:
        assert self.fleet is not None
        try:
            result = self.fleet.inject(cmd.node, cmd.kind, cmd.gpu, cmd.xid, self.clock(), nic=cmd.nic)
        except SimError as exc:
            raise CommandRefused(str(exc), field=exc.field) from None
        log.info("fault injected", **{k: v for k, v in result.items() if v is not None})
        return result

    async def _close(self) -> None:
        if self.health is not None:
            await self.health.stop()
        if self._commands is not None:
            with contextlib.suppress(Exception):
                await self._commands.stop()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        self.spool.close()
        if not self.opts.simulate:
            with contextlib.suppress(Exception):
                self._nvml.close()


def _safe(name: str) -> str:
    return subjects.token(name)


def _sim_facts(facts: NodeFacts, labels: dict[str, str], gpus: int) -> NodeFacts:
    """A simulated node's facts: its fabric labels and a plausible CPU and memory capacity."""
    cpu_milli, memory_mib = simulated_capacity(gpus)
    return replace(facts, labels=labels, cpu_milli=cpu_milli, memory_mib=memory_mib)
