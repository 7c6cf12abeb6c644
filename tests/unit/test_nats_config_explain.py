"""`chamber nats-config --explain USER`: what a role may do and why, derived from the manifests."""

from __future__ import annotations

import dataclasses

import pytest

from events import subjects
from events.streams import _matches
from services.cli import main
from services.cli.errors import UsageError
from services.cli.nats_config import DEFAULT_SERVICES, User, _refuse_collisions, service_manifests, users
from services.runtime.manifest import lease_bucket


def explained(capsys: pytest.CaptureFixture[str], user: str) -> str:
    assert main(["nats-config", "--cluster", "c1", "--explain", user]) == 0
    return capsys.readouterr().out


def test_the_reader_reads_streams_through_its_own_consumers_and_never_the_recorders(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = explained(capsys, "reader")
    assert "$JS.API.CONSUMER.MSG.NEXT.JOBS.*" in out and "reads JOBS: pull from its consumers" in out
    assert "$JS.API.CONSUMER.*.*.JOBS.recorder" in out and "belongs to another role" in out
    assert "_INBOX.reader.>" in out and "_INBOX.>" not in out.replace("_INBOX.reader.>", "")
    assert "STREAM.CREATE" not in out and "STREAM.UPDATE" not in out and "$KV." not in out


def test_a_service_writes_only_its_own_buckets_and_owns_its_leases(capsys: pytest.CaptureFixture[str]) -> None:
    out = explained(capsys, "svc-scheduler")
    assert f"$KV.{lease_bucket('scheduler')}.>" in out and "its leader leases" in out
    assert "$KV.chamber_fleet" not in out
    # of FLEET, only the MIG layouts it plans and its actuator reports applied
    assert "chamber.fleet.*.*.mig" in out and "chamber.fleet" not in out.replace("chamber.fleet.*.*.mig", "")
    assert "chamber.jobs.>" in out and "events scheduler owns" in out


def test_an_agent_is_limited_to_its_node(capsys: pytest.CaptureFixture[str]) -> None:
    out = explained(capsys, "agent-n7")
    assert "chamber.ingest.faults.c1.n7" in out and "chamber.ingest.faults.c1.*" not in out


def test_an_agent_publishes_only_into_its_gates_and_is_told_their_limits(capsys: pytest.CaptureFixture[str]) -> None:
    """Every subject an agent may publish outside the JetStream API lands in a gate stream (never in
    TELEMETRY or FAULTS directly), and `--explain` states each gate's rate, size and byte limits."""
    from events.streams import GATES, STREAMS, stream_for

    agent = next(u for u in users("c1", agent_nodes=["n7"]) if u.name == "agent-n7")
    assert agent.permissions is not None
    events = [s for s in agent.permissions.publish if not s.startswith("$")]
    assert events and all(any(g.covers(s) for g in GATES) for s in events)
    assert not any(spec.covers(s) for s in events for spec in STREAMS) and stream_for(events[0]) is None
    out = explained(capsys, "agent-n7")
    for gate in GATES:
        assert f"(stream {gate.name}): at most {gate.max_msgs_per_subject} messages a subject in any" in out
    assert "each at most 256 KiB" in out and "each at most 16 KiB" in out and "no per-user publish rate" in out


def test_a_cluster_actuator_speaks_for_its_cluster_only_and_the_dispatcher_decides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = explained(capsys, "actuator-west")
    assert "chamber.dispatch.copy.west.*" in out and "chamber.dispatch.heartbeat.west" in out
    assert "chamber.dispatch.decision" not in out and "chamber.jobs" not in out and "$KV." not in out
    out = explained(capsys, "svc-dispatch")
    assert "chamber.dispatch.decision.>" in out and "chamber.dispatch.copy" not in out
    names = {u.name for u in users("c1", actuator_clusters=["west", "east"])}
    assert {"actuator-west", "actuator-east"} <= names and "svc-dispatch" not in names  # the CLI adds it


def test_an_unknown_user_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nats-config", "--explain", "nobody"]) == 2
    assert "no such user" in capsys.readouterr().err


def test_every_service_has_a_manifest_and_each_owned_bucket_has_one_owner() -> None:
    manifests = service_manifests()
    assert {"discovery", "health", "quota", "scheduler", "billing", "recorder", "gateway", "perf"} <= set(manifests)
    owners = [b for m in manifests.values() for b in m.buckets]
    assert len(owners) == len(set(owners))
    kv_writes = {
        u.name: {s for s in u.permissions.publish if s.startswith("$KV.")}
        for u in users("c1")
        if u.permissions is not None
    }
    assert kv_writes["svc-discovery"] == {"$KV.chamber_fleet.>"}
    assert kv_writes["reader"] == set() and kv_writes["setup"] == set()


def test_no_role_but_admin_may_subscribe_to_what_agents_publish() -> None:
    """What an agent publishes reaches others only through TELEMETRY and FAULTS, after its gate took
    it: no role may subscribe to the ingest subjects, so a message a gate refuses (too large, over
    the rate) is delivered to no one."""
    from events.streams import GATES, StreamSpec

    roles = users("c1", agent_nodes=["n1"], shared_agent=True, simulator=True)
    for user in roles:
        if user.permissions is None:
            continue
        for pattern in user.permissions.subscribe:
            probe = StreamSpec("probe", (pattern,), "", None, 0)
            for gate in GATES:
                sample = gate.subjects[0].replace(">", "sample.c1.n1")
                assert not probe.covers(sample), f"{user.name} may subscribe to {pattern}"


# --- a member cluster's node agents, on the control plane's NATS -----------------------------------


def control_plane() -> list[User]:
    """A control plane `central` with members west and east (the chart passes its own name too)."""
    return users("central", shared_agent=True, actuator_clusters=["central", "west", "east"])


def allows(user: User, subject: str) -> bool:
    assert user.permissions is not None
    return any(_matches(p, subject) for p in user.permissions.publish) and not any(
        _matches(p, subject) for p in user.permissions.deny_publish
    )


def test_a_member_clusters_agents_publish_only_their_clusters_ingest_subjects(
    capsys: pytest.CaptureFixture[str],
) -> None:
    roles = {u.name: u for u in control_plane()}
    assert {n for n in roles if n.startswith("agent")} == {"agent", "agents-west", "agents-east"}
    west = roles["agents-west"]
    for make in (subjects.sample, subjects.inventory, subjects.fabric, subjects.steps, subjects.faults):
        assert allows(west, subjects.ingest(make("west", "gpu-7"))), make.__name__
        assert not allows(west, make("west", "gpu-7")), make.__name__  # never past its gate
        for other in ("central", "east"):
            assert not allows(west, subjects.ingest(make(other, "gpu-7"))), (make.__name__, other)
    assert not allows(west, subjects.fleet("west", "gpu-7")) and not allows(west, "chamber.dispatch.copy.west.j")
    out = explained(capsys, "agents-west")
    assert "chamber.ingest.faults.west.*" in out and "member cluster west" in out and ".c1." not in out


def test_the_services_publish_per_cluster_events_for_every_member_cluster_from_their_manifests(
    capsys: pytest.CaptureFixture[str],
) -> None:
    manifests = service_manifests()
    per_cluster = {s for s, m in manifests.items() if any("{cluster}" in p for p in m.publishes)}
    assert {"discovery", "health", "perf"} <= per_cluster
    roles = {u.name: u for u in control_plane()}
    for service in DEFAULT_SERVICES:
        user = roles[f"svc-{service}"]
        for pattern in manifests[service].publishes:
            for cluster in ("central", "west", "east"):
                subject = pattern.replace("{cluster}", cluster).replace("*", "gpu-7")
                assert allows(user, subject), (service, subject)
            if "{cluster}" in pattern:  # a cluster not named: none of its events
                assert not allows(user, pattern.replace("{cluster}", "north").replace("*", "gpu-7")), service
    assert allows(roles["svc-discovery"], subjects.fleet("west", "gpu-7"))
    assert not allows(roles["svc-scheduler"], subjects.fleet("west", "gpu-7"))
    # one cluster: nothing of another
    alone = {u.name: u for u in users("central", shared_agent=True)}
    assert not allows(alone["svc-discovery"], subjects.fleet("west", "gpu-7"))
    assert main(["nats-config", "--cluster", "central", "--actuator-cluster", "west", "--explain", "svc-health"]) == 0
    assert "chamber.fleet.west.*" in capsys.readouterr().out


def test_two_roles_under_one_name_are_refused() -> None:
    roles = control_plane()
    twin = next(u for u in roles if u.name == "agents-west")
    with pytest.raises(UsageError, match="'agents-west' would be both agent"):
        _refuse_collisions([*roles, dataclasses.replace(twin, role="actuator")])
