"""Every role against a real nats-server under the permissions `chamber nats-config` generates: each
JetStream API subject, event subject, bucket and command a role must not use is tried and must be
refused by the server, and must leave no effect (the recorder's consumers intact, DEAD's limits as
designed, no bucket entry written). Positive controls show the same probes succeed for the role
that owns the thing, so a refusal here is the permission, not a broken probe.

`python -m pytest tests/integration/test_roles_adversarial.py -s` prints the roles x actions table.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from events import subjects
from events.channels import STEP_LOG_BUCKET
from services.cli.nats_config import DEFAULT_SERVICES, MULTI_CLUSTER_SERVICES, PasswordSource, User, render, users
from services.runtime.credentials import inbox_prefix
from services.runtime.manifest import lease_bucket, snapshot_bucket
from services.runtime.nats_server import NatsServerProcess
from services.runtime.setup import set_up
from services.stack.credentials import workload_user
from tests.integration.test_runtime import eventually

pytestmark = pytest.mark.integration
CLUSTER = "c1"
RECORDED = ("TELEMETRY", "JOBS", "FLEET", "FAULTS", "QUOTA", "BILLING")  # streams the recorder has a durable on
EVERY = "*"


@dataclass(frozen=True)
class Action:
    """One thing a role might try. `kind`: "pub" (publish to `subject`) or "sub" (subscribe).
    `allowed`: the users that may do it (the others must be refused)."""

    name: str
    kind: str
    subject: str
    allowed: frozenset[str]
    body: bytes = b"{}"


def _a(name: str, kind: str, subject: str, *allowed: str, body: bytes = b"{}") -> Action:
    return Action(name, kind, subject, frozenset(allowed), body)


ALL_SERVICES = (*DEFAULT_SERVICES, *MULTI_CLUSTER_SERVICES)
SVC = {s: f"svc-{s}" for s in ALL_SERVICES}
STEP_LOGS_CREATE = f"$JS.API.CONSUMER.CREATE.KV_{STEP_LOG_BUCKET}"
ACTIONS = [
    # the recorder's durable consumers: ingest would stop, or messages would never reach the warehouse
    _a("delete the recorder's JOBS consumer", "pub", "$JS.API.CONSUMER.DELETE.JOBS.recorder"),
    _a("pull from the recorder's JOBS consumer", "pub", "$JS.API.CONSUMER.MSG.NEXT.JOBS.recorder", SVC["recorder"]),
    _a(
        "pull from the recorder's TELEMETRY consumer",
        "pub",
        "$JS.API.CONSUMER.MSG.NEXT.TELEMETRY.recorder",
        SVC["recorder"],
    ),
    _a(
        "change the recorder's consumer",
        "pub",
        "$JS.API.CONSUMER.CREATE.JOBS.recorder",
        SVC["recorder"],
        body=json.dumps(
            {"stream_name": "JOBS", "config": {"durable_name": "recorder", "filter_subject": "x"}}
        ).encode(),
    ),
    _a("recreate the recorder's consumer", "pub", "$JS.API.CONSUMER.DURABLE.CREATE.JOBS.recorder", SVC["recorder"]),
    _a("ack for the recorder", "pub", "$JS.ACK.JOBS.recorder.1.1.1.1700000000000000000.0", SVC["recorder"]),
    # streams: set-up only
    _a(
        "update a stream (DEAD max_msgs=5)",
        "pub",
        "$JS.API.STREAM.UPDATE.DEAD",
        "setup",
        body=json.dumps({"name": "DEAD", "subjects": ["chamber.dead.>"], "max_msgs": 5}).encode(),
    ),
    _a(
        "create a stream capturing commands",
        "pub",
        "$JS.API.STREAM.CREATE.SPY",
        "setup",
        body=json.dumps({"name": "SPY", "subjects": ["chamber.cmd.>"]}).encode(),
    ),
    _a("delete a stream", "pub", "$JS.API.STREAM.DELETE.JOBS"),
    _a("purge a stream", "pub", "$JS.API.STREAM.PURGE.JOBS"),
    _a("delete a message", "pub", "$JS.API.STREAM.MSG.DELETE.JOBS", body=b'{"seq": 1}'),
    _a("delete a KV bucket", "pub", "$JS.API.STREAM.DELETE.KV_chamber_fleet"),
    # replies meant for others
    _a("subscribe to every inbox", "sub", "_INBOX.>"),
    _a("subscribe to the gateway's inbox", "sub", f"{inbox_prefix('svc-gateway')}.>", SVC["gateway"]),
    # buckets: each written by its owner only
    _a("write a fake node into the fleet view", "pub", "$KV.chamber_fleet.c1.fake", SVC["discovery"]),
    _a("write a quota row", "pub", "$KV.chamber_quota.p.fake", SVC["quota"]),
    _a("take the scheduler's leader lease", "pub", f"$KV.{lease_bucket('scheduler')}.scheduler", SVC["scheduler"]),
    _a("take a recorder partition lease", "pub", f"$KV.{lease_bucket('recorder')}.recorder-p0", SVC["recorder"]),
    _a(
        "overwrite the scheduler's snapshot",
        "pub",
        f"$O.{snapshot_bucket('scheduler')}.M.c2NoZWR1bGVy",
        SVC["scheduler"],
    ),
    # events: each published by the services that own them
    _a("announce a fake node or isolation (FLEET)", "pub", "chamber.fleet.c1.fake", SVC["discovery"], SVC["health"]),
    _a("publish a job event", "pub", "chamber.jobs.fake", SVC["scheduler"], "simulator"),
    _a("publish a quota event", "pub", "chamber.quota.vision", SVC["quota"]),
    _a("publish a billing event", "pub", "chamber.billing.vision", SVC["billing"]),
    _a("publish another node's sample", "pub", "chamber.ingest.telemetry.sample.c1.n2", "agent", "simulator"),
    _a("publish another node's fault", "pub", "chamber.ingest.faults.c1.n2", "agent", "simulator"),
    _a("publish another cluster's sample", "pub", "chamber.ingest.telemetry.sample.c8.n1"),
    # a member cluster (c9: an --actuator-cluster) reports to this control plane: its agents speak for
    # its nodes only, and the services own its nodes' events as they own this cluster's
    _a("publish a member cluster's sample", "pub", "chamber.ingest.telemetry.sample.c9.n1", "agents-c9"),
    _a("publish a member cluster's fault", "pub", "chamber.ingest.faults.c9.n1", "agents-c9"),
    _a("publish a member cluster's fault past the gate", "pub", "chamber.faults.c9.n1", SVC["perf"]),
    _a("announce a member cluster's node (FLEET)", "pub", "chamber.fleet.c9.fake", SVC["discovery"], SVC["health"]),
    _a("announce a node of a cluster not in the fleet", "pub", "chamber.fleet.c8.fake"),
    # agents publish through their gates (a rate per node): never straight into TELEMETRY or FAULTS
    _a("publish a sample past the gate", "pub", "chamber.telemetry.sample.c1.n1"),
    _a("publish a fault past the gate", "pub", "chamber.faults.c1.n1", SVC["perf"]),
    # step logs the scheduler hands to agents (services/scheduler/step_logs.py): an agent reads its node's keys
    _a(
        "read another node's step logs",
        "pub",
        f"{STEP_LOGS_CREATE}.steplogs-n2.$KV.{STEP_LOG_BUCKET}.c1.n2.>",
        "agent",
        SVC["scheduler"],
    ),
    _a(
        "read every node's step logs",
        "pub",
        f"{STEP_LOGS_CREATE}.steplogs-n1.$KV.{STEP_LOG_BUCKET}.c1.>",
        SVC["scheduler"],
    ),
    _a("hand out a step log", "pub", f"$KV.{STEP_LOG_BUCKET}.c1.n1.j1", SVC["scheduler"]),
    _a(
        "forge a dead letter of JOBS",  # only the readers of JOBS dead-letter its messages
        "pub",
        "chamber.dead.jobs",
        "simulator",
        *(SVC[s] for s in ("quota", "scheduler", "billing", "recorder", "gateway", "perf")),
    ),
    # multi-cluster dispatch: the dispatcher decides; each cluster's actuator speaks for its cluster only
    _a("publish a dispatch decision", "pub", "chamber.dispatch.decision.w1", SVC["dispatch"]),
    _a("offer another cluster's workload", "pub", "chamber.dispatch.offer.c9.w1", "actuator-c9"),
    _a("report another cluster's copy", "pub", "chamber.dispatch.copy.c9.w1", "actuator-c9"),
    _a("beat for another cluster", "pub", "chamber.dispatch.heartbeat.c9", "actuator-c9"),
    # commands: the gateway is the one door (and the demo workload sends its own few)
    _a("submit a job (command)", "pub", "chamber.cmd.scheduler.submit", SVC["gateway"], "workload"),
    _a("set a quota (command)", "pub", "chamber.cmd.quota.set", SVC["gateway"], "workload"),
    _a("run SQL on the recorder (command)", "pub", "chamber.cmd.recorder.sql", SVC["gateway"]),
    _a("forget a node (command)", "pub", "chamber.cmd.discovery.forget", SVC["gateway"]),
    _a("listen to the scheduler's commands", "sub", "chamber.cmd.scheduler.>", SVC["scheduler"]),
    _a("listen to discovery's commands", "sub", "chamber.cmd.discovery.>", SVC["discovery"]),
    _a("listen to every command", "sub", "chamber.cmd.>"),
    # the server itself
    _a("purge the JetStream account", "pub", "$JS.API.ACCOUNT.PURGE.$G"),
    _a("remove a server from the meta group", "pub", "$JS.API.SERVER.REMOVE"),
]
AGENT_NODE = "agent-n1"


def role_users() -> list[User]:
    return [
        *users(
            CLUSTER,
            services=ALL_SERVICES,
            agent_nodes=["n1"],
            shared_agent=True,
            simulator=True,
            actuator_clusters=["c1", "c9"],
        ),
        workload_user(),
    ]


ROLES = [u.name for u in role_users() if u.permissions is not None]
# A stream's info lists its subjects on request (job ids, teams, every bucket key): the processes
# outside the control plane (node agents, member clusters' actuators) may not read it
OUTSIDE = ("agent", "actuator-")
ACTIONS.append(
    _a(
        "list JOBS's subjects (stream info)",
        "pub",
        "$JS.API.STREAM.INFO.JOBS",
        *(r for r in ROLES if not r.startswith(OUTSIDE)),
        body=b'{"subjects_filter": ">"}',
    )
)


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServerProcess, PasswordSource]]:
    """One server for the module, set up as `chamber setup` does, with the recorder's durables in
    place and one message in JOBS and TELEMETRY."""
    tmp = tmp_path_factory.mktemp("roles")
    passwords = PasswordSource(tmp / "passwords", create_missing=True)
    conf = tmp / "auth.conf"
    conf.write_text(render(role_users(), passwords))
    server = NatsServerProcess(tmp / "js", log_file=tmp / "nats.log", extra_args=["-c", str(conf)])
    server.start()
    try:
        asyncio.run(_prepare(server, passwords))
        yield server, passwords
    finally:
        server.kill()


async def _prepare(server: NatsServerProcess, passwords: PasswordSource) -> None:
    session = await login(server, passwords, "admin")
    js = session.nc.jetstream()
    await set_up(js)
    for stream in RECORDED:
        await js.add_consumer(stream, ConsumerConfig(durable_name="recorder", ack_policy=AckPolicy.EXPLICIT))
    await js.publish("chamber.jobs.j1", b"{}")
    await js.publish("chamber.telemetry.sample.c1.n1", b"{}")
    await session.nc.close()


class Session:
    """A user's connection, keeping the permission errors the server sends it."""

    def __init__(self, nc: Client, errors: list[str]) -> None:
        self.nc, self.errors = nc, errors

    def refused(self, action: Action) -> bool:
        word = "publish" if action.kind == "pub" else "subscription"
        needle = f'{word} to "{action.subject}"'.lower()
        return any("permissions violation" in e.lower() and needle in e.lower() for e in self.errors)


async def login(server: NatsServerProcess, passwords: PasswordSource, user: str) -> Session:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(
        f"nats://{user}:{passwords.password(user)}@127.0.0.1:{server.port}",
        error_cb=on_error,
        allow_reconnect=False,
        inbox_prefix=inbox_prefix(user),
    )
    return Session(nc, errors)


@pytest.fixture
async def admin(bus: tuple[NatsServerProcess, PasswordSource]) -> AsyncIterator[Session]:
    session = await login(*bus, "admin")
    yield session
    await session.nc.close()


async def attempt(session: Session, action: Action) -> None:
    if action.kind == "sub":
        await session.nc.subscribe(action.subject)
    else:
        await session.nc.publish(action.subject, action.body, reply=session.nc.new_inbox())


@pytest.mark.parametrize("user", ROLES)
async def test_every_forbidden_action_is_refused(
    bus: tuple[NatsServerProcess, PasswordSource], admin: Session, user: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server, passwords = bus
    session = await login(server, passwords, user)
    forbidden = [a for a in ACTIONS if user not in a.allowed]
    try:
        for action in forbidden:
            await attempt(session, action)
        await session.nc.flush()
        try:
            await eventually(lambda: all(session.refused(a) for a in forbidden), within=10)
        except AssertionError:
            missed = [a.name for a in forbidden if not session.refused(a)]
            raise AssertionError(f"{user} was not refused: {missed}") from None
    finally:
        await session.nc.close()
    _record(tmp_path_factory, user, forbidden)
    await nothing_changed(admin)


async def nothing_changed(admin: Session) -> None:
    js = admin.nc.jetstream()
    for stream in RECORDED:
        info = await js.consumer_info(stream, "recorder")
        assert not info.config.filter_subject, f"the recorder's {stream} consumer was changed"
    assert (await js.consumer_info("JOBS", "recorder")).num_pending == 1  # nobody pulled it
    dead = await js.stream_info("DEAD")
    assert (dead.config.max_msgs or -1) == -1
    assert "SPY" not in [i.config.name for i in await js.streams_info()]
    assert (await js.stream_info("JOBS")).state.messages == 1
    fleet = await js.key_value("chamber_fleet")
    with pytest.raises(Exception, match=r"not found|no keys"):
        await fleet.get("c1.fake")


async def test_the_owners_can_do_what_the_others_cannot(
    bus: tuple[NatsServerProcess, PasswordSource], admin: Session
) -> None:
    """Positive controls: the probes work when the role may (so a refusal above is the permission)."""
    server, passwords = bus
    discovery = await login(server, passwords, "svc-discovery")
    recorder = await login(server, passwords, "svc-recorder")
    try:
        kv = await discovery.nc.jetstream().key_value("chamber_fleet")
        await kv.put("c1.control", b"{}")
        assert (await kv.get("c1.control")).value == b"{}"
        await kv.delete("c1.control")
        await admin.nc.jetstream().publish("chamber.faults.c1.n9", b"{}")
        pull = await recorder.nc.jetstream().pull_subscribe_bind(consumer="recorder", stream="FAULTS")
        [msg] = await pull.fetch(1, timeout=5)
        await msg.ack()
        await recorder.nc.flush()
        assert not any("permissions violation" in e.lower() for e in discovery.errors + recorder.errors)
    finally:
        await discovery.nc.close()
        await recorder.nc.close()


async def test_a_reader_cannot_turn_an_ephemeral_create_into_the_recorders_consumer(
    bus: tuple[NatsServerProcess, PasswordSource], admin: Session
) -> None:
    """The reader creates its consumers by name (`$JS.API.CONSUMER.CREATE.<stream>.<name>`). The
    unnamed form takes a durable's name from the request body, so it would reach the recorder's
    consumer: it is refused; and a named create whose body names the recorder's durable is refused
    by the server (name and body must agree)."""
    server, passwords = bus
    reader = await login(server, passwords, "reader")
    evil = {"durable_name": "recorder", "ack_policy": "explicit", "filter_subject": "chamber.jobs.none"}
    body = json.dumps({"stream_name": "JOBS", "config": evil}).encode()
    try:
        await reader.nc.publish("$JS.API.CONSUMER.CREATE.JOBS", body, reply=reader.nc.new_inbox())
        unnamed = Action("unnamed create", "pub", "$JS.API.CONSUMER.CREATE.JOBS", frozenset())
        await eventually(lambda: reader.refused(unnamed))
        answer = await reader.nc.request("$JS.API.CONSUMER.CREATE.JOBS.mine", body, timeout=5)
        assert "error" in json.loads(answer.data), answer.data
    finally:
        await reader.nc.close()
    await nothing_changed(admin)


def _record(factory: pytest.TempPathFactory, user: str, refused: list[Action]) -> None:
    """Note what was refused, for the table `test_print_the_table` prints."""
    path = factory.getbasetemp() / "roles-table.jsonl"
    with path.open("a") as f:
        f.write(json.dumps({"user": user, "refused": [a.name for a in refused]}) + "\n")


def test_print_the_table(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Roles x forbidden actions, as refused above ("refused", "-" where the role may)."""
    path = Path(tmp_path_factory.getbasetemp()) / "roles-table.jsonl"
    if not path.exists():
        pytest.skip("run with the refusal tests")
    rows = {r["user"]: set(r["refused"]) for r in map(json.loads, path.read_text().splitlines())}
    lines = ["| action | " + " | ".join(rows) + " |", "|---" * (len(rows) + 1) + "|"]
    for a in ACTIONS:
        cells = ["refused" if a.name in rows[u] else "-" for u in rows]
        lines.append(f"| {a.name} | " + " | ".join(cells) + " |")
    print("\n" + "\n".join(lines))
    assert all(a.name in rows[u] for a in ACTIONS for u in rows if u not in a.allowed)


async def test_refusals_do_not_need_the_connection_to_die(bus: tuple[NatsServerProcess, PasswordSource]) -> None:
    """A refused attempt leaves the user's connection usable for what it may do (no DoS by mistake)."""
    server, passwords = bus
    agent = await login(server, passwords, AGENT_NODE)
    try:
        await agent.nc.publish("chamber.faults.c1.n1", b"{}")  # past its gate: refused
        await agent.nc.flush()
        ack = await agent.nc.jetstream().publish("chamber.ingest.faults.c1.n1", b"{}")
        assert ack.stream == "AGENT_FAULTS"
        await asyncio.sleep(0)
    finally:
        await agent.nc.close()


async def publish_counting(session: Session, subject: str, bodies: list[bytes]) -> tuple[int, list[str]]:
    """Publish as fast as the connection goes, each with a reply subject; wait for every answer and
    return (how many were stored, the server's reasons for the others)."""
    answers: list[bytes] = []
    done = asyncio.Event()
    inbox = session.nc.new_inbox()

    async def on(msg: Msg) -> None:
        answers.append(msg.data)
        if len(answers) == len(bodies):
            done.set()

    sub = await session.nc.subscribe(f"{inbox}.*", cb=on)
    for i, body in enumerate(bodies):
        await session.nc.publish(subject, body, reply=f"{inbox}.{i}")
    await asyncio.wait_for(done.wait(), 10)
    await sub.unsubscribe()
    errors = [json.loads(a)["error"]["description"] for a in answers if b'"error"' in a]
    return len(answers) - len(errors), errors


async def stored(admin: Session, stream: str, subject: str) -> int:
    info = await admin.nc.jetstream().stream_info(stream, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def test_an_agent_over_its_rate_is_refused_by_the_server_and_other_nodes_still_get_through(
    bus: tuple[NatsServerProcess, PasswordSource], admin: Session
) -> None:
    """An agent that floods its node's samples and faults has at most GATE_PER_WINDOW of each
    accepted in the gate's window; the server refuses the rest (whatever the agent's code does), and
    they never reach TELEMETRY, FAULTS or any consumer. Another node's samples and faults, published
    during the flood, all arrive."""
    from events.streams import GATE_PER_WINDOW

    server, passwords = bus
    ours = {"TELEMETRY": "chamber.telemetry.sample.c1.n1", "FAULTS": "chamber.faults.c1.n1"}
    before = {name: await stored(admin, name, subject) for name, subject in ours.items()}
    in_window = {  # what earlier tests left in the gates' window for n1
        name: await stored(admin, f"AGENT_{name}", subjects.ingest(subject)) for name, subject in ours.items()
    }
    hostile = await login(server, passwords, AGENT_NODE)
    other = await login(server, passwords, "agent")  # the shared agent user, speaking for node n2
    flood = 3 * GATE_PER_WINDOW
    try:
        began = asyncio.get_running_loop().time()
        [(samples_in, sample_errors), (faults_in, fault_errors), (others_in, other_errors)] = await asyncio.gather(
            publish_counting(hostile, subjects.ingest(ours["TELEMETRY"]), [b"x" * 1024] * flood),
            publish_counting(hostile, subjects.ingest(ours["FAULTS"]), [b"{}"] * flood),
            publish_counting(other, "chamber.ingest.telemetry.sample.c1.n2", [b"{}"] * 5),
        )
        seconds = asyncio.get_running_loop().time() - began
        other_fault, _ = await publish_counting(other, "chamber.ingest.faults.c1.n2", [b"{}"])
    finally:
        await hostile.nc.close()
        await other.nc.close()
    print(f"\nflood of {flood} samples and {flood} faults in {seconds:.2f} s: {samples_in} and {faults_in} accepted")
    for accepted, name in ((samples_in, "TELEMETRY"), (faults_in, "FAULTS")):
        assert GATE_PER_WINDOW - in_window[name] <= accepted <= GATE_PER_WINDOW, name
    assert set(sample_errors) == set(fault_errors) == {"maximum messages per subject exceeded"}
    assert (len(sample_errors), len(fault_errors)) == (flood - samples_in, flood - faults_in)
    assert (others_in, other_errors, other_fault) == (5, [], 1)
    await eventually_stored(admin, "TELEMETRY", "chamber.telemetry.sample.c1.n2", 5)
    await eventually_stored(admin, "FAULTS", "chamber.faults.c1.n2", 1)
    # what the gates accepted is copied, and nothing they refused
    await eventually_stored(admin, "TELEMETRY", ours["TELEMETRY"], before["TELEMETRY"] + samples_in)
    await eventually_stored(admin, "FAULTS", ours["FAULTS"], before["FAULTS"] + faults_in)


async def eventually_stored(admin: Session, stream: str, subject: str, n: int) -> None:
    """`stream` holds `n` messages on `subject` within 5 s (a stream copies its gate asynchronously)."""

    async def holds() -> bool:
        return await stored(admin, stream, subject) == n

    await eventually(holds, within=5)


async def test_an_oversized_agent_message_is_refused_and_reaches_no_service(
    bus: tuple[NatsServerProcess, PasswordSource], admin: Session
) -> None:
    """A fault over 16 KiB and a sample over 256 KiB are refused by the agent's gates (though TELEMETRY
    itself takes 1 MiB), so no consumer is ever delivered them; a message over the server's max_payload
    closes the connection before anyone sees it. Services read agents' subjects only through
    consumers of TELEMETRY and FAULTS (no service may subscribe to them), so nothing refused reaches one."""
    from events.streams import AGENT_FAULTS, AGENT_TELEMETRY

    server, passwords = bus
    ajs = admin.nc.jetstream()
    new = ConsumerConfig(deliver_policy=DeliverPolicy.NEW)
    watch = {  # a service's view: a consumer on each stream, from now on
        name: await ajs.pull_subscribe(subject, durable=None, stream=name, config=new)
        for name, subject in (("TELEMETRY", "chamber.telemetry.sample.c1.n3"), ("FAULTS", "chamber.faults.c1.n3"))
    }
    agent = await login(server, passwords, "agent")
    try:
        fault_in, fault_errors = await publish_counting(
            agent, "chamber.ingest.faults.c1.n3", [b"x" * (AGENT_FAULTS.max_msg_size + 1), b"ok"]
        )
        sample_in, sample_errors = await publish_counting(
            agent, "chamber.ingest.telemetry.sample.c1.n3", [b"x" * (AGENT_TELEMETRY.max_msg_size + 1), b"ok"]
        )
        assert (fault_in, sample_in) == (1, 1)
        assert fault_errors == sample_errors == ["message size exceeds maximum allowed"]
        for name, sub in watch.items():
            [msg] = await sub.fetch(1, timeout=5)
            assert msg.data == b"ok", name
            with pytest.raises(TimeoutError):
                await sub.fetch(1, timeout=0.3)
    finally:
        await agent.nc.close()
    # over the server's max_payload (the client library would refuse it first: speak the protocol)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        await reader.readline()  # INFO
        login_ = {"user": "agent", "pass": passwords.password("agent"), "verbose": False, "pedantic": False}
        writer.write(f"CONNECT {json.dumps(login_)}\r\n".encode())
        writer.write(b"PING\r\n")
        assert await asyncio.wait_for(reader.readline(), 5) == b"PONG\r\n"  # logged in
        # the server judges the size from the PUB line, before a byte of the body
        writer.write(f"PUB chamber.ingest.faults.c1.n3 {1024 * 1024 + 1}\r\n".encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)  # to EOF: the server hangs up
        assert b"Maximum Payload Violation" in answer
    finally:
        writer.close()
    for sub in watch.values():
        with pytest.raises(TimeoutError):
            await sub.fetch(1, timeout=0.3)
        await sub.unsubscribe()


async def test_the_simulated_executor_dead_letters_a_poison_job_event_and_goes_on(
    bus: tuple[NatsServerProcess, PasswordSource], admin: Session
) -> None:
    """Under its own role the executor's consumer may dead-letter JOBS: one poison event (here, one
    the executor's core cannot fold) ends in DEAD once, and the placements after it still arrive."""
    from node_agent.sim import executor as ex
    from services.runtime import Publisher
    from services.runtime.consumer import Consumer, ConsumerOptions, Delivery
    from tests.warehouse_builders import T0, scheduled, submitted

    ajs = admin.nc.jetstream()
    dead_before = (await ajs.stream_info("DEAD")).state.last_seq
    await ajs.publish("chamber.jobs.poison", b"not an event", headers={"ce-type": "chamber.jobs.JobSubmitted.v1"})
    pub = Publisher(ajs, source="test")
    await pub.publish(submitted("sim-j1", "vision", 1, T0), id="sim-j1")
    await pub.publish(scheduled("sim-j1", "vision", "sim-000", [0], T0 + 1), id="sim-j1-s")
    server, passwords = bus
    sim = await login(server, passwords, "simulator")
    state = ex.ExecutorState(cluster=CLUSTER, nodes=frozenset({"sim-000"}))

    async def fold(d: Delivery) -> None:
        ex.evolve(state, d.envelope.event)

    consumer = Consumer(sim.nc.jetstream(), ConsumerOptions(stream="JOBS", durable=None), handler=fold)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await eventually(lambda: "sim-j1" in state.jobs and state.jobs["sim-j1"].running_since is not None)
        assert consumer.stats.dead >= 1
    finally:
        stop.set()
        await task
        await sim.nc.close()
    last = (await ajs.stream_info("DEAD")).state.last_seq
    copied = [(await ajs.get_msg("DEAD", seq)).headers or {} for seq in range(dead_before + 1, last + 1)]
    assert [h.get("chamber-dead-subject") for h in copied].count("chamber.jobs.poison") == 1
    assert not any("permissions violation" in e.lower() for e in sim.errors)
