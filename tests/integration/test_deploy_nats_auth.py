"""NATS roles from `chamber nats-config`, enforced by a real nats-server started with the generated block."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from events import subjects
from events.streams import GATES
from events.subjects import ingest
from services.cli import main
from services.runtime import Publisher, ensure_streams
from services.runtime.consumer import ephemeral_name
from services.runtime.credentials import inbox_prefix
from services.runtime.manifest import lease_bucket
from services.runtime.nats_server import NatsServerProcess
from services.runtime.setup import set_up
from tests.builders import a_job_submitted, a_node_sample
from tests.integration.test_runtime import eventually

pytestmark = pytest.mark.integration
CLUSTER = "c1"


@pytest.fixture
def secured_server(tmp_path: Path) -> Iterator[tuple[NatsServerProcess, Path]]:
    passwords = tmp_path / "passwords"
    conf = tmp_path / "auth.conf"
    argv = ["nats-config", "--cluster", CLUSTER, "--passwords", str(passwords), "--create-missing"]
    argv += ["--agent-node", "n1", "--agent-node", "n2", "--shared-agent", "--simulator", "--out", str(conf)]
    assert main(argv) == 0
    server = NatsServerProcess(tmp_path / "js", log_file=tmp_path / "nats.log", extra_args=["-c", str(conf)])
    server.start()
    try:
        yield server, passwords
    finally:
        server.kill()


class Session:
    """A client logged in as one user, keeping the asynchronous errors the server sends it."""

    def __init__(self, nc: Client, errors: list[str]) -> None:
        self.nc, self.errors = nc, errors

    async def refused(self, fragment: str) -> bool:
        await self.nc.flush()
        # nats-py lower-cases the server's -ERR text
        return any("permissions violation" in e.lower() and fragment.lower() in e.lower() for e in self.errors)


@pytest.fixture
async def login(secured_server: tuple[NatsServerProcess, Path]) -> AsyncIterator:
    server, passwords = secured_server
    sessions: list[Client] = []

    async def as_user(user: str) -> Session:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        password = (passwords / user).read_text()
        nc = await nats.connect(
            f"nats://{user}:{password}@127.0.0.1:{server.port}",
            error_cb=on_error,
            allow_reconnect=False,
            inbox_prefix=inbox_prefix(user),  # the only inbox its role may subscribe to
        )
        sessions.append(nc)
        return Session(nc, errors)

    admin = await as_user("admin")
    await set_up(admin.nc.jetstream())  # streams and buckets, as `chamber setup` makes them
    yield as_user
    for nc in sessions:
        await nc.close()


async def stream_subjects(session: Session, stream: str) -> list[str]:
    js = session.nc.jetstream()
    info = await js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        out.append((await js.get_msg(stream, seq)).subject)
    return out


async def test_an_agent_publishes_its_own_node_and_is_refused_on_another_nodes_subjects(login) -> None:
    admin, agent = await login("admin"), await login("agent-n1")
    publisher = Publisher(agent.nc.jetstream(), source="agent/n1")

    ack = await publisher.publish(a_node_sample("n1", cluster=CLUSTER), subject=ingest(subjects.sample(CLUSTER, "n1")))
    assert ack.stream == "AGENT_TELEMETRY"  # its gate, which TELEMETRY copies

    with pytest.raises(nats.errors.TimeoutError):  # the server drops it: no stream ever acks it
        await agent.nc.jetstream().publish(ingest(subjects.sample(CLUSTER, "n2")), b"{}", timeout=0.5)
    await agent.nc.publish(ingest(subjects.faults(CLUSTER, "n2")), b"{}")
    await agent.nc.publish(subjects.faults(CLUSTER, "n1"), b"{}")  # its own node, but past the gate
    await eventually(lambda: agent.refused(ingest(subjects.sample(CLUSTER, "n2"))))
    await eventually(lambda: agent.refused(ingest(subjects.faults(CLUSTER, "n2"))))
    await eventually(lambda: agent.refused(subjects.faults(CLUSTER, "n1")))

    await agent.nc.publish(subjects.fleet(CLUSTER, "n1"), b"{}")  # not an agent's to say
    await agent.nc.publish("chamber.cmd.scheduler.submit", b"{}")
    await eventually(lambda: agent.refused(subjects.fleet(CLUSTER, "n1")))
    await eventually(lambda: agent.refused("chamber.cmd.scheduler.submit"))

    # it may check its gates (the agent runs ensure_streams on them) but not change them, nor read
    # another stream's info: that lists the stream's subjects (job ids, teams) on request
    js = agent.nc.jetstream(timeout=0.5)
    assert await ensure_streams(js, GATES, replicas=1, update=False) == []
    with pytest.raises(nats.errors.TimeoutError):
        await js.delete_stream("TELEMETRY")
    for stream in ("JOBS", "KV_chamber_fleet"):
        with pytest.raises(nats.errors.TimeoutError):
            await js.stream_info(stream, subjects_filter=">")
        await eventually(lambda s=stream: agent.refused(f"$JS.API.STREAM.INFO.{s}"))  # type: ignore[misc]

    async def copied() -> bool:  # TELEMETRY copies its gate asynchronously
        return await stream_subjects(admin, "TELEMETRY") == [subjects.sample(CLUSTER, "n1")]

    await eventually(copied)
    assert (await admin.nc.jetstream().stream_info("FAULTS")).state.messages == 0
    assert (await admin.nc.jetstream().stream_info("FLEET")).state.messages == 0


async def test_the_shared_agent_stays_inside_its_cluster(login) -> None:
    agent = await login("agent")
    await agent.nc.jetstream().publish(ingest(subjects.sample(CLUSTER, "any-node")), b"{}")
    await agent.nc.publish(ingest(subjects.sample("other-cluster", "n1")), b"{}")
    await eventually(lambda: agent.refused(ingest(subjects.sample("other-cluster", "n1"))))


async def test_the_simulated_fleet_speaks_for_its_cluster_nodes_and_jobs_but_not_for_the_fleet(login) -> None:
    sim = await login("simulator")
    js = sim.nc.jetstream()
    await js.publish(ingest(subjects.sample(CLUSTER, "sim-007")), b"{}")
    await js.publish(subjects.jobs("j1"), b"{}")  # it stands in for the executor (started, completed)
    # the executor's own (ephemeral, named) consumer on JOBS, as the agent makes it: the placements
    config = ConsumerConfig(name=ephemeral_name(), ack_policy=AckPolicy.EXPLICIT, inactive_threshold=60.0)
    info = await js.add_consumer("JOBS", config)
    pull = await js.pull_subscribe_bind(consumer=info.name, stream="JOBS")
    [msg] = await pull.fetch(1, timeout=5)
    assert msg.subject == subjects.jobs("j1")
    await msg.ack()
    await js.delete_consumer("JOBS", info.name)

    async def answer(msg) -> None:  # type: ignore[no-untyped-def]
        await msg.respond(b"injected")

    await sim.nc.subscribe("chamber.cmd.sim.>", cb=answer)
    await sim.nc.flush()
    admin = await login("admin")
    assert (await admin.nc.request("chamber.cmd.sim.inject", b"{}", timeout=2)).data == b"injected"
    await sim.nc.publish(subjects.fleet(CLUSTER, "sim-007"), b"{}")
    await eventually(lambda: sim.refused(subjects.fleet(CLUSTER, "sim-007")))


async def test_services_publish_only_what_they_own_and_cannot_erase_history(login) -> None:
    scheduler = await login("svc-scheduler")
    publisher = Publisher(scheduler.nc.jetstream(), source="chamber/scheduler")
    assert (await publisher.publish(a_job_submitted("j1"))).stream == "JOBS"

    await scheduler.nc.publish(subjects.fleet(CLUSTER, "n1"), b"{}")
    await eventually(lambda: scheduler.refused(subjects.fleet(CLUSTER, "n1")))
    with pytest.raises(nats.errors.TimeoutError):
        await scheduler.nc.jetstream(timeout=0.5).delete_stream("JOBS")
    await eventually(lambda: scheduler.refused("$JS.API.STREAM.DELETE.JOBS"))
    with pytest.raises(TimeoutError):  # delete_msg ignores the context's timeout: bound it here
        await asyncio.wait_for(scheduler.nc.jetstream().delete_msg("JOBS", 1), 0.5)
    await eventually(lambda: scheduler.refused("$JS.API.STREAM.MSG.DELETE.JOBS"))
    assert (await scheduler.nc.jetstream().stream_info("JOBS")).state.messages == 1

    # it keeps its state in the buckets the set-up made for it, and makes none itself
    kv = await scheduler.nc.jetstream().key_value(lease_bucket("scheduler"))
    await kv.put("k", b"v")
    assert (await kv.get("k")).value == b"v"
    with pytest.raises(nats.errors.TimeoutError):
        await scheduler.nc.jetstream(timeout=0.5).create_key_value(bucket="chamber_scheduler_test")
    await eventually(lambda: scheduler.refused("$JS.API.STREAM.CREATE.KV_chamber_scheduler_test"))


async def test_only_the_gateway_sends_commands_and_a_service_answers_its_own(login) -> None:
    quota, gateway, billing = await login("svc-quota"), await login("svc-gateway"), await login("svc-billing")

    async def answer(msg) -> None:  # type: ignore[no-untyped-def]
        await msg.respond(b"ok")

    await quota.nc.subscribe("chamber.cmd.quota.>", cb=answer)
    await quota.nc.flush()
    assert (await gateway.nc.request("chamber.cmd.quota.set", b"{}", timeout=2)).data == b"ok"

    await billing.nc.publish("chamber.cmd.quota.set", b"{}")
    await eventually(lambda: billing.refused("chamber.cmd.quota.set"))
    await billing.nc.subscribe("chamber.cmd.quota.>")  # nor listen to another service's commands
    await eventually(lambda: billing.refused("chamber.cmd.quota.>"))


async def test_the_reader_follows_every_event_stream_and_publishes_nothing(login) -> None:
    admin, reader = await login("admin"), await login("reader")
    await Publisher(admin.nc.jetstream(), source="test").publish(a_job_submitted("j7"))

    js = reader.nc.jetstream()  # its read cursor: an ephemeral consumer it creates by name
    info = await js.add_consumer("JOBS", ConsumerConfig(name=ephemeral_name(), inactive_threshold=60.0))
    [msg] = await (await js.pull_subscribe_bind(consumer=info.name, stream="JOBS")).fetch(1, timeout=5)
    assert msg.subject == subjects.jobs("j7")

    await reader.nc.publish(subjects.jobs("j8"), b"{}")
    await eventually(lambda: reader.refused(subjects.jobs("j8")))
    with pytest.raises(nats.errors.TimeoutError):
        await reader.nc.jetstream(timeout=0.5).add_stream(StreamConfig(name="MINE", subjects=["mine.>"]))
    with pytest.raises(nats.errors.TimeoutError):
        await reader.nc.jetstream(timeout=0.5).purge_stream("JOBS")
    assert (await admin.nc.jetstream().stream_info("JOBS")).state.messages == 1


def test_a_missing_password_is_a_clear_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nats-config", "--passwords", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "no password for NATS user 'svc-discovery'" in err and "--create-missing" in err


async def test_the_setup_user_makes_the_gates_and_the_streams_that_copy_them(
    secured_server: tuple[NatsServerProcess, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`chamber setup` under the `setup` role makes each gate before the stream that copies it, and
    what an agent publishes into its gate then reaches TELEMETRY, with no permission refused."""
    from tests.secured_bus import violations_in

    server, passwords = secured_server
    url = f"nats://setup:{(passwords / 'setup').read_text()}@127.0.0.1:{server.port}"
    assert await asyncio.to_thread(main, ["setup", "--nats", url]) == 0
    out = capsys.readouterr().out
    assert out.index("added AGENT_TELEMETRY") < out.index("added TELEMETRY"), out
    assert out.index("added AGENT_FAULTS") < out.index("added FAULTS"), out
    nc = await nats.connect(
        f"nats://agent-n1:{(passwords / 'agent-n1').read_text()}@127.0.0.1:{server.port}",
        inbox_prefix=inbox_prefix("agent-n1"),
    )
    admin = await nats.connect(f"nats://admin:{(passwords / 'admin').read_text()}@127.0.0.1:{server.port}")
    try:
        await nc.jetstream().publish(ingest(subjects.sample(CLUSTER, "n1")), b"{}")

        async def copied() -> bool:
            return (await admin.jetstream().stream_info("TELEMETRY")).state.messages == 1

        await eventually(copied)
    finally:
        await nc.close()
        await admin.close()
    assert server.log_file is not None and violations_in(server.log_file) == []
