"""Shared fixtures: a real nats-server with JetStream on a free port and a temp store, under the NATS
users and permissions `chamber nats-config` generates (tests/secured_bus.py).

`nats_server.url` logs in as `admin` (the operator); a service under test logs in as its own role,
`nats_server.url_for("scheduler")` or `await connect_as(nats_server, "scheduler")`. A test ends in
failure if the server refused any client a permission, unless it is marked
`@pytest.mark.refusals_expected` (a test of the refusals themselves). The users' cluster is `c1`,
or the one a test names with `@pytest.mark.bus_cluster("NAME")` (fleet and fault subjects carry it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from services.runtime import connect, ensure_streams
from tests.secured_bus import SecuredNatsServer, connect_as

__all__ = ["SecuredNatsServer", "connect_as"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "refusals_expected: the test makes the bus refuse a permission on purpose")
    config.addinivalue_line("markers", "bus_cluster(name): the cluster the bus's users are generated for")


@pytest.fixture
def nats_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SecuredNatsServer]:
    """A running nats-server; the test may stop(), kill() and start()/restart() it (same port, store)."""
    cluster = request.node.get_closest_marker("bus_cluster")
    server = SecuredNatsServer(tmp_path, *(cluster.args if cluster else ()))
    server.start()
    try:
        yield server
    finally:
        server.kill()
    refused = server.violations()
    if refused and request.node.get_closest_marker("refusals_expected") is None:
        pytest.fail("the bus refused permissions (missing in services/cli/nats_config.py?):\n" + "\n".join(refused))


@pytest.fixture
async def nc(nats_server: SecuredNatsServer) -> AsyncIterator[Client]:
    client = await connect(nats_server.url, name="test")
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def js(nc: Client) -> JetStreamContext:
    """JetStream with all of Chamber's streams created."""
    ctx = nc.jetstream()
    await ensure_streams(ctx)
    return ctx
