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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client

from events import subjects
from events.codec import encode
from node_agent.outbox import Outbox
from node_agent.runner import NodeFacts, NodeRunner, SeqStore
from node_agent.sim import executor as ex
from node_agent.sim.fleet import SimError, SimFleet
from node_agent.sim.models import gpu_model
from node_agent.spool import Kind, Record, Spool
from services.runtime.backoff import Backoff
from services.runtime.commands import CommandRefused, CommandServer
from services.runtime.connection import connect
from services.runtime.consumer import Consumer, ConsumerOptions, Delivery
from services.runtime.health import HealthServer, HealthState
from services.runtime.logs import get_logger
from services.runtime.streams import ensure_streams
from services.runtime.tracing import configure_tracing, publish_traceparent

log = get_logger("chamber.agent")
CONNECT_BACKOFF = Backoff(first_s=0.2, max_s=5.0)  # NATS away: samples go to the spool meanwhile

SIM_SERVICE = "sim"
REPLAY_PATIENCE_S = 10.0


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


class Agent:
    def __init__(self, opts: AgentOptions, *, clock: Callable[[], float] = time.time, nvml: Any = None) -> None:
        """`nvml` is the pynvml module (None: import the real one); tests pass a fake of it."""
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
        self._consumer: Consumer | None = None
        self._replay_until: int | None = None
        self._replay_started = 0.0
        self.ticks = 0
        self.job_events = 0  # JobStarted / JobCompleted this process decided
        # Live while the loop answers; ready once NATS is connected (and the simulated executor's
        # JOBS consumer is bound). Sampling goes on into the spool either way.
        self.health_state = HealthState(service="agent", checks=[lambda: self.outbox.problem])
        self.health: HealthServer | None = None
        if opts.simulate:
            self.fleet = SimFleet(
                seed=opts.seed,
                nodes=opts.nodes,
                gpus_per_node=opts.gpus_per_node,
                model=gpu_model(opts.gpu_model),
                prefix=opts.node,
            )
            facts = NodeFacts(driver_version="sim", cuda_version="sim", simulated=True)
            self.runners = [
                NodeRunner(
                    opts.cluster,
                    name,
                    node,
                    NodeFacts(**{**facts.__dict__, "labels": self.fleet.fabric.labels[name]}),
                    seq=self.seqs.get(name),
                    source="chamber/agent/sim",
                    fabric=node.fabric_reader() if opts.sysfs_root is not None else None,
                )
                for name, node in self.fleet.nodes.items()
            ]
            self.executor = ex.ExecutorState(cluster=opts.cluster, nodes=frozenset(self.fleet.nodes))
        else:
            from node_agent.nvml_adapter import NvmlSampler

            sampler = NvmlSampler.open(nvml, node=opts.node)
            host = None
            if opts.sysfs_root is not None:
                from node_agent.dmi_adapter import read_host

                host = read_host(opts.sysfs_root)
            facts = NodeFacts(
                driver_version=sampler.driver_version,
                cuda_version=sampler.cuda_version,
                labels=dict(opts.labels),
                host=host,
            )
            fabric = None
            if opts.sysfs_root is not None:
                from node_agent.fabric_adapter import FabricAdapter, read_nccl_ras

                fabric = FabricAdapter(
                    root=opts.sysfs_root, labels=dict(opts.labels), ras=read_nccl_ras if opts.nccl_ras else None
                )
            self.runners = [
                NodeRunner(opts.cluster, opts.node, sampler, facts, seq=self.seqs.get(opts.node), fabric=fabric)
            ]
            self._nvml = sampler

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
        stopped = asyncio.create_task(stop.wait())
        try:
            # A loop that dies is a bug: stop the agent loudly (its supervisor restarts it; the spool
            # and the sequence file carry over) rather than run on without sampling or publishing.
            await asyncio.wait([stopped, tasks[0], tasks[2]], return_when=asyncio.FIRST_COMPLETED)
            stop.set()
            await asyncio.gather(tasks[2], tasks[0])
        finally:
            stopped.cancel()
            tasks[1].cancel()
            with contextlib.suppress(BaseException):
                await tasks[1]
            await self._close()

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
            records.extend(self._execute(now))
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
        self.seqs.save(self.runners)  # before publishing: a sequence is never used twice
        self.ticks += 1
        return records

    def _execute(self, now: float) -> list[Record]:
        """The simulated executor: start and complete jobs, and let the GPUs' load follow them."""
        state = self.executor
        assert state is not None and self.fleet is not None
        out = []
        decisions = ex.decide(state, now) if self._replayed() else []
        for event, msg_id in decisions:
            ex.evolve(state, event)  # the outbox will publish it: do not decide it again
            self.job_events += 1
            traceparent, _ = publish_traceparent()
            headers, body = encode(
                event, source="chamber/agent/sim-executor", id=msg_id, time=now, traceparent=traceparent
            )
            out.append(Record(int(Kind.JOB), subjects.subject_for(event), headers, body))
        if state.version != self._alloc_version:
            self._alloc_version = state.version
            self.fleet.assign(ex.allocations(state))
        return out

    def _replayed(self) -> bool:
        """Decide only once the JOBS log has been read up to where it stood at start: before that,
        a job may look unstarted only because its JobStarted has not been read yet."""
        if self._replay_until is None or self._consumer is None:
            return False
        if self._consumer.stats.last_acked_seq >= self._replay_until:
            return True
        if time.monotonic() - self._replay_started > REPLAY_PATIENCE_S:  # e.g. the last event was skipped
            log.warning("JOBS replay not confirmed, deciding anyway", until=self._replay_until)
            self._replay_until = 0
            return True
        return False

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
        assert self.nc is not None
        await ensure_streams(self.nc.jetstream(), update=False)

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
        # The executor rebuilds its state from the whole JOBS log at every start: an ephemeral consumer
        # (the server removes it when we are gone), so its role owns no durable name on JOBS.
        js = self.nc.jetstream()
        info = await js.stream_info("JOBS")
        self._replay_started = time.monotonic()
        self._consumer = Consumer(js, ConsumerOptions(stream="JOBS", durable=None), handler=self._on_job_event)
        self.health_state.consumers = [self._consumer]
        self._replay_until = info.state.last_seq
        await self._consumer.run(stop)

    async def _on_job_event(self, delivery: Delivery) -> None:
        assert self.executor is not None
        ex.evolve(self.executor, delivery.envelope.event)

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
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.unsubscribe()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        self.spool.close()
        if not self.opts.simulate:
            with contextlib.suppress(Exception):
                self._nvml.close()


def _safe(name: str) -> str:
    return subjects.token(name)
