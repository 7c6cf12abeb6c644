"""The scheduler and quota services against a real nats-server: commands, decisions, restart."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import JobScheduled, decode
from services.quota import service as quota_service
from services.runtime import Publisher
from services.runtime.commands import CommandRefused, CommandUnavailable, request
from services.scheduler import service as scheduler_service
from tests.integration.test_runtime import eventually
from tests.scheduler_builders import a_node, a_quota
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration

ARGS: dict[ModuleType, dict[str, Any]] = {
    scheduler_service: {
        "interval": 0.1,
        "full_every": 30.0,
        "topology_key": "rack",
        "preemption_searches": 4,
        "kubernetes": False,
        "cluster": "c1",
        "leader_lease": "",
        "leader_lease_ttl": 15.0,
    },
    quota_service: {"half_life": 3600.0, "interval": 0.5},
}


class Running:
    def __init__(self, module: ModuleType, url: str) -> None:
        self.stop = asyncio.Event()
        args = argparse.Namespace(nats=url, **ARGS[module])
        self.task = asyncio.create_task(module.run(args, self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 15)


async def answers(nc: Client, service: str, verb: str, payload: dict[str, Any]) -> bool:
    try:
        await request(nc, service, verb, payload, timeout=0.5)
    except (CommandUnavailable, CommandRefused):
        return False
    return True


class JobEvents:
    def __init__(self) -> None:
        self.events: list[Any] = []

    async def handler(self, msg: Any) -> None:
        self.events.append(decode(msg.headers, msg.data).event)

    def of(self, kind: type, job: str) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind) and e.job_id == job]


@pytest.fixture
async def watched(nc: Client) -> AsyncIterator[JobEvents]:
    seen = JobEvents()
    sub = await nc.subscribe("chamber.jobs.>", cb=seen.handler)
    yield seen
    await sub.unsubscribe()


async def test_submit_schedule_explain_cancel_and_a_restart_rebuilds_the_same_state(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, watched: JobEvents
) -> None:
    publisher = Publisher(js, source="test/discovery")
    await publisher.publish(a_node("n1", gpus=4))
    await publisher.publish(a_quota("vision", 0))  # a team may submit once it has a quota (0 borrows only)
    sched = Running(scheduler_service, nats_server.url_for("scheduler"))
    await eventually(lambda: answers(nc, "scheduler", "queue", {}))

    with pytest.raises(CommandRefused) as refused:
        await request(nc, "scheduler", "submit", {"team": "vision", "gpus": 0})
    assert refused.value.field == "gpus"
    first = await request(nc, "scheduler", "submit", {"team": "vision", "gpus": 3, "name": "train", "id": "train-1"})
    assert first == {"id": "train-1", "job_id": "train-1"}
    await request(nc, "scheduler", "submit", {"team": "vision", "gpus_per_replica": 2, "id": "wait-1"})
    await eventually(lambda: bool(watched.of(JobScheduled, "train-1")))
    [scheduled] = watched.of(JobScheduled, "train-1")
    assert scheduled.placements[0].node == "n1" and scheduled.placements[0].gpu_indices == [0, 1, 2]

    async def waits_for_capacity() -> bool:  # once a cycle has looked at it (submits fold from the log)
        jobs = (await request(nc, "scheduler", "queue", {}))["jobs"]
        return "waiting for capacity" in jobs[0]["reason"]

    await eventually(waits_for_capacity)
    queue = (await request(nc, "scheduler", "queue", {}))["jobs"]
    assert [(j["id"], j["state"]) for j in queue] == [("wait-1", "pending"), ("train-1", "running")]
    assert set(queue[0]) == {
        "id",
        "name",
        "team",
        "priority",
        "gpus",
        "share",  # part of a GPU per replica (None: whole GPUs)
        "replicas",
        "state",
        "reason",
        "cannot_run",  # why it can never run as specified (kept with --allow-wait); empty when it can
        "placement",
        "submitted_at",
        "position",  # the next cycle's order, and the factors behind it
        "priority_score",
        "queued_since",
        "age_s",
        "protected_since",
        "protected",
    }
    assert queue[0]["position"] == 1 and queue[0]["protected"] is False and queue[0]["age_s"] >= 0
    assert isinstance(queue[0]["priority_score"], float) and queue[1]["position"] is None
    assert "waiting for capacity" in queue[0]["reason"]
    text = (await request(nc, "scheduler", "explain", {"job": "train-1"}))["text"]
    assert "is running on n1[0,1,2]" in text
    with pytest.raises(CommandRefused, match="no job"):
        await request(nc, "scheduler", "explain", {"job": "nope"})
    # by its exact name, or a unique prefix of its id; an ambiguous prefix lists the candidates
    assert (await request(nc, "scheduler", "explain", {"job": "train"}))["id"] == "train-1"
    assert (await request(nc, "scheduler", "explain", {"job": "wait"}))["id"] == "wait-1"
    with pytest.raises(CommandRefused, match="did you mean train-1"):
        await request(nc, "scheduler", "explain", {"job": "train-2"})

    # restart: the state comes back from the log, and nothing is scheduled twice
    await sched.close()
    sched = Running(scheduler_service, nats_server.url_for("scheduler"))
    await eventually(lambda: answers(nc, "scheduler", "queue", {}))
    await eventually(lambda: _queue_is(nc, [("wait-1", "pending"), ("train-1", "running")]))
    await eventually(waits_for_capacity)  # the new process's own cycle has looked at both jobs
    assert len(watched.of(JobScheduled, "train-1")) == 1 and not watched.of(JobScheduled, "wait-1")

    cancelled = await request(nc, "scheduler", "cancel", {"job_id": "train-1"})
    assert cancelled == {"id": "train-1", "state": "cancelled", "seq": cancelled["seq"]}  # seq: the job's, now
    await eventually(lambda: bool(watched.of(JobScheduled, "wait-1")))
    # the events arrive in log order: every cycle since the restart is behind this one
    assert len(watched.of(JobScheduled, "train-1")) == 1 and len(watched.of(JobScheduled, "wait-1")) == 1
    with pytest.raises(CommandRefused, match="already cancelled"):
        await request(nc, "scheduler", "cancel", {"job": "train-1"})

    # part of a GPU: the submit's share reaches the cycle, the placement and explain
    await request(nc, "scheduler", "submit", {"team": "vision", "gpu_milli": 250, "share_mode": "mps", "id": "frac-1"})
    await eventually(lambda: bool(watched.of(JobScheduled, "frac-1")))
    [part] = watched.of(JobScheduled, "frac-1")[0].placements
    assert part.share_milli == 250 and part.gpu_indices[0] in (2, 3)
    explained = await request(nc, "scheduler", "explain", {"job": "frac-1"})
    assert "250 milli-GPU" in explained["text"] and explained["shares"][0]["share_milli"] == 250
    await sched.close()


async def _queue_is(nc: Client, expected: list[tuple[str, str]]) -> bool:
    jobs = (await request(nc, "scheduler", "queue", {}))["jobs"]
    return [(j["id"], j["state"]) for j in jobs] == expected


async def test_quota_commands_are_validated_and_listed_with_usage_and_fair_share(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    publisher = Publisher(js, source="test/discovery")
    await publisher.publish(a_node("n1", gpus=8, model="H100"))
    await publisher.publish(a_node("n2", gpus=8, model="A100"))
    quota = Running(quota_service, nats_server.url_for("quota"))
    await eventually(lambda: answers(nc, "quota", "list", {}))

    await eventually(lambda: answers(nc, "quota", "set", {"team": "vision", "gpus": 10, "borrow_limit": 2}))
    # above the 16 installed GPUs: accepted, with a warning naming the numbers, and shown over-committed
    over = await request(nc, "quota", "set", {"team": "nlp", "gpus": 7})
    assert over["warnings"] and "17 GPUs" in over["warnings"][0] and "16 installed" in over["warnings"][0]
    listed = await request(nc, "quota", "list", {})
    assert [(p["pool"], p["installed"], p["guaranteed"], p["over_committed"]) for p in listed["pools"]] == [
        ("default", 16, 17, 1)
    ]
    await request(nc, "quota", "set", {"team": "nlp", "gpus": 6})
    with pytest.raises(CommandRefused, match="unknown pool 'hopper'"):
        await request(nc, "quota", "set", {"team": "nlp", "gpus": 1, "pool": "hopper"})
    assert (await request(nc, "quota", "pool_set", {"name": "hopper", "gpu_model": "H100"}))["pool"] == "hopper"
    payload = {"team": "nlp", "guaranteed_gpus": 8, "pool": "hopper", "weight": 2, "budget": 5e4}
    reply = await request(nc, "quota", "set", payload)
    assert {k: reply[k] for k in ("team", "pool", "guaranteed", "critical", "budget", "on_budget", "new")} == {
        "team": "nlp",
        "pool": "hopper",
        "guaranteed": 8,
        "critical": False,
        "budget": 5e4,
        "on_budget": "notify",
        "new": True,
    }
    assert reply["warnings"] == []  # 8 guaranteed of hopper's 8 installed
    # a patch changes only what it names: the weight and the budget stay
    patch = await request(nc, "quota", "patch", {"team": "nlp", "pool": "hopper", "borrow_limit": 4})
    kept = {c["setting"]: (c["before"], c["after"], c["changed"]) for c in patch["changes"]}
    assert kept["weight"] == (2.0, 2.0, False) and kept["borrow_limit"] == (None, 4, True)
    assert (patch["budget"], patch["budget_changed"]) == (5e4, False)
    hold = await request(nc, "quota", "patch", {"team": "nlp", "pool": "hopper", "on_budget": "hold"})
    assert (hold["budget"], hold["on_budget"], hold["budget_changed"]) == (5e4, "hold", True)
    with pytest.raises(CommandRefused, match="no quota in this pool yet") as refused:
        await request(nc, "quota", "patch", {"team": "speech", "weight": 2})
    assert refused.value.field == "gpus"
    rows = (await request(nc, "quota", "list", {}))["teams"]
    assert [(r["team"], r["pool"], r["guaranteed"], r["borrow_limit"], r["weight"]) for r in rows] == [
        ("nlp", "default", 6, None, 1.0),
        ("nlp", "hopper", 8, 4, 2.0),
        ("vision", "default", 10, 2, 1.0),
    ]
    assert set(rows[0]) == {
        "team", "pool", "guaranteed", "borrow_limit", "lend_limit", "np_lend_limit", "weight", "critical",
        "budget", "currency", "on_budget", "in_use", "borrowed", "fair_share",
    }  # fmt: skip
    assert (rows[0]["budget"], rows[0]["on_budget"]) == (5e4, "hold")  # a budget is the team's, in every pool
    await eventually(lambda: _kv_has(js, "hopper.nlp"))
    await quota.close()


async def _kv_has(js: JetStreamContext, key: str) -> bool:
    try:
        kv = await js.key_value("chamber_quota")
        await kv.get(key)
    except Exception:
        return False
    return True


async def test_only_teams_allowed_critical_work_may_submit_it(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    await Publisher(js, source="test/discovery").publish(a_node("n1", gpus=8))
    quota = Running(quota_service, nats_server.url_for("quota"))
    sched = Running(scheduler_service, nats_server.url_for("scheduler"))
    await eventually(lambda: answers(nc, "quota", "set", {"team": "vision", "gpus": 4}))
    await eventually(lambda: answers(nc, "quota", "set", {"team": "nlp", "gpus": 4, "critical": True}))
    urgent = {"team": "vision", "gpus": 1, "priority": "critical"}

    probes = iter(range(1000))

    async def refused() -> bool:  # accepted only until the scheduler has folded the quotas
        try:
            await request(nc, "scheduler", "submit", {**urgent, "id": f"probe-{next(probes)}"})
        except CommandRefused as exc:
            return "may not run critical work" in str(exc) and exc.field == "priority"
        return False

    await eventually(refused)
    await eventually(lambda: answers(nc, "scheduler", "submit", {**urgent, "team": "nlp", "id": "nlp-urgent"}))
    explained = await request(nc, "scheduler", "explain", {"job": "nlp-urgent"})
    assert explained["id"] == "nlp-urgent" and "starvation_guard" in explained
    await sched.close()
    await quota.close()


async def test_the_scheduler_plans_a_mig_layout_under_its_own_permissions_and_places_once_it_is_applied(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, watched: JobEvents
) -> None:
    from events.fleet import MigLayoutApplied, MigLayoutPlanned
    from services.scheduler.core.mig_live import MANAGED_LABEL

    fleet: list[Any] = []

    async def on_fleet(msg: Any) -> None:
        fleet.append(decode(msg.headers, msg.data).event)

    sub = await nc.subscribe("chamber.fleet.>", cb=on_fleet)
    publisher = Publisher(js, source="test/discovery")
    await publisher.publish(a_node("n1", gpus=1, model="H100-80GB", **{MANAGED_LABEL: "all-disabled"}))
    await publisher.publish(a_quota("vision", 4))
    sched = Running(scheduler_service, nats_server.url_for("scheduler"))
    try:
        await eventually(lambda: answers(nc, "scheduler", "queue", {}))
        await request(nc, "scheduler", "submit", {"team": "vision", "mig_profile": "1g.10gb", "id": "small-1"})
        await eventually(lambda: any(isinstance(e, MigLayoutPlanned) for e in fleet))
        [plan] = [e for e in fleet if isinstance(e, MigLayoutPlanned)]
        assert (plan.node, plan.enable_mig, {i.profile for i in plan.create}) == ("n1", True, {"1g.10gb"})
        assert not watched.of(JobScheduled, "small-1")  # no instance until the layout is applied
        applied = MigLayoutApplied(
            cluster="c1", node="n1", gpu_index=plan.gpu_index, at=plan.at + 1, layout=plan.after, planned_at=plan.at
        )
        await publisher.publish(applied)  # what the actuator reports once the GPU Operator has applied it
        await eventually(lambda: bool(watched.of(JobScheduled, "small-1")))
        [scheduled] = watched.of(JobScheduled, "small-1")
        assert scheduled.placements[0].mig_profile == "1g.10gb"
        assert scheduled.placements[0].mig_start in {i.start for i in plan.create}
    finally:
        await sub.unsubscribe()
        await sched.close()
