"""The scheduler's leader lease (JetStream KV), with two candidates against a real nats-server."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from services.runtime import connect
from services.runtime.lease import LeaderLease, from_env
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer, lease_bucket_with_ttl

pytestmark = pytest.mark.integration
TTL = 2.0  # short, so expiry is seen quickly; long enough for renewals on a busy 2-core machine


@pytest.fixture(autouse=True)
async def short_lease_bucket(nats_server: SecuredNatsServer) -> None:
    await lease_bucket_with_ttl(nats_server, "scheduler", TTL)


async def candidate(url: str, holder: str) -> tuple[Client, LeaderLease, asyncio.Event, asyncio.Task[None], list[bool]]:
    nc = await connect(url, name=holder)
    lease = LeaderLease(nc.jetstream(), "scheduler", holder, ttl_s=TTL)
    stop, flips = asyncio.Event(), []

    async def on_change(leading: bool) -> None:
        flips.append(leading)

    return nc, lease, stop, asyncio.create_task(lease.run(stop, on_change)), flips


async def test_one_leader_at_a_time_and_a_clean_handover_on_stop(nats_server: SecuredNatsServer) -> None:
    nc_a, a, stop_a, task_a, flips_a = await candidate(nats_server.url_for("scheduler"), "scheduler-a")
    await eventually(lambda: a.is_leader)
    nc_b, b, stop_b, task_b, flips_b = await candidate(nats_server.url_for("scheduler"), "scheduler-b")

    # B keeps trying for a few renewal periods but never leads while A renews
    deadline = time.monotonic() + 2 * TTL
    while time.monotonic() < deadline:
        assert not (a.is_leader and b.is_leader)
        assert not b.is_leader
        await asyncio.sleep(0.05)

    stop_a.set()  # A stops and deletes the key: B takes over within a renewal period
    await task_a
    await eventually(lambda: b.is_leader, within=TTL)
    assert flips_a == [True, False] and flips_b == [True]

    stop_b.set()
    await task_b
    for nc in (nc_a, nc_b):
        await nc.close()


async def test_a_crashed_leader_is_replaced_after_the_lease_expires(nats_server: SecuredNatsServer) -> None:
    nc_a, a, _stop_a, task_a, _ = await candidate(nats_server.url_for("scheduler"), "scheduler-a")
    await eventually(lambda: a.is_leader)
    nc_b, b, stop_b, task_b, _ = await candidate(nats_server.url_for("scheduler"), "scheduler-b")

    await nc_a.close()  # like kill -9: the connection goes first, so A cannot release the key
    task_a.cancel()
    await asyncio.gather(task_a, return_exceptions=True)

    await eventually(lambda: b.is_leader, within=3 * TTL)
    # not before the server expired A's last renewal, which A itself stopped trusting at 2/3 of the TTL
    assert time.monotonic() - a.renewed_at >= TTL
    stop_b.set()
    await task_b
    await nc_b.close()


async def test_a_leader_cut_off_from_nats_steps_down_on_its_own_clock(nats_server: SecuredNatsServer) -> None:
    nc_a, a, stop_a, task_a, flips = await candidate(nats_server.url_for("scheduler"), "scheduler-a")
    await eventually(lambda: a.is_leader)
    nats_server.stop()
    await eventually(lambda: not a.is_leader, within=TTL)  # before the server could hand the lease on
    await eventually(lambda: flips == [True, False], within=2 * TTL)
    nats_server.start()
    await eventually(lambda: a.is_leader, within=10)  # after a restart it wins the lease again
    stop_a.set()
    await task_a
    await nc_a.close()


async def test_the_lease_comes_from_the_deployments_environment(
    js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CHAMBER_LEADER_LEASE", raising=False)
    assert from_env(js) is None  # no lease asked for: always lead
    monkeypatch.setenv("CHAMBER_LEADER_LEASE", "scheduler")
    monkeypatch.setenv("CHAMBER_LEADER_LEASE_TTL_S", "9")
    monkeypatch.setenv("POD_NAME", "chamber-scheduler-7f9c-abcde")
    lease = from_env(js)
    assert lease is not None and (lease.name, lease.holder, lease.ttl_s) == (
        "scheduler",
        "chamber-scheduler-7f9c-abcde",
        9.0,
    )
    assert await lease.try_acquire_or_renew() and lease.is_leader
    await lease.release()
    assert not lease.is_leader
