"""Shared fixtures: a real nats-server with JetStream on a free port and a temp store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from services.runtime import connect, ensure_streams
from services.runtime.nats_server import NatsServerProcess


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A running nats-server; the test may stop(), kill() and start()/restart() it (same port, store)."""
    server = NatsServerProcess(tmp_path / "jetstream", log_file=tmp_path / "nats-server.log")
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
async def nc(nats_server: NatsServerProcess) -> AsyncIterator[Client]:
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
