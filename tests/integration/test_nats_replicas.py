"""On one real nats-server: more replicas than servers is refused at start with both numbers, by
the runtime and by `chamber service` (one line, no traceback, no hang); a list of URLs connects.
On three (routes, loopback): config repair raises replicas to the configured count, never lowers
one an operator raised."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from events.streams import FAULTS
from services.runtime import connect, ensure_streams
from services.runtime.nats_cluster import NatsCluster
from services.runtime.nats_server import free_port
from services.runtime.replicas import ReplicasUnavailable
from services.runtime.streams import ensure_bucket_replicas
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration
CHAMBER = str(Path(sys.executable).parent / "chamber")


async def test_three_replicas_on_one_server_are_refused_naming_both_numbers(
    js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAMBER_NATS_REPLICAS", "3")
    with pytest.raises(ReplicasUnavailable, match=r"3 stream replicas requested .* has 1 JetStream server"):
        await ensure_streams(js)
    # the placement answer of the server itself is translated too (when the count is not known first)
    await js.delete_stream(FAULTS.name)
    with pytest.raises(ReplicasUnavailable, match=r"FAULTS needs 3 replicas .* non-clustered"):
        await ensure_streams(js, [FAULTS], replicas=3)


def test_the_service_refuses_to_start_with_one_line(nats_server: SecuredNatsServer) -> None:
    result = subprocess.run(
        [CHAMBER, "service", "billing", "--nats", nats_server.url_for("billing"), "--replicas", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "3 stream replicas requested" in result.stderr and "has 1 JetStream server" in result.stderr
    assert "Traceback" not in result.stderr


async def test_a_comma_separated_list_survives_a_dead_first_server(nats_server: SecuredNatsServer) -> None:
    dead = f"nats://127.0.0.1:{free_port()}"
    nc = await connect(f"{dead},{nats_server.url}", name="test", attempts=3)
    try:
        assert nc.is_connected and nc.connected_url is not None
        assert nc.connected_url.port == nats_server.port
    finally:
        await nc.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path / "cluster") as running:
        yield running


async def test_on_three_servers_repair_raises_replicas_but_never_lowers_them(
    cluster: NatsCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    nc = await connect(cluster.url, name="test")
    js = nc.jetstream()
    try:
        monkeypatch.setenv("CHAMBER_NATS_REPLICAS", "1")
        await ensure_streams(js)
        assert (await js.stream_info("JOBS")).config.num_replicas == 1
        # the operator raises JOBS by hand; a service configured for 1 replica leaves it at 3
        config = (await js.stream_info("JOBS")).config
        config.num_replicas = 3
        await js.update_stream(config)
        assert await ensure_streams(js) == []
        assert (await js.stream_info("JOBS")).config.num_replicas == 3
        # unconfigured on a cluster of three: every stream is raised to 3
        monkeypatch.delenv("CHAMBER_NATS_REPLICAS")
        changed = await ensure_streams(js)
        assert "updated JOBS" not in changed and "updated TELEMETRY" in changed
        for name in ("TELEMETRY", "JOBS", "FLEET", "DEAD"):
            assert (await js.stream_info(name)).config.num_replicas == 3
        # a KV bucket made while the fleet had one server is raised too
        await js.create_key_value(bucket="chamber_lease_old", history=1)

        async def listed() -> bool:  # the cluster's stream list may trail a create by a moment
            return any(i.config.name == "KV_chamber_lease_old" for i in await js.streams_info())

        await eventually(listed)
        assert await ensure_bucket_replicas(js) == ["updated KV_chamber_lease_old"]
        assert (await js.stream_info("KV_chamber_lease_old")).config.num_replicas == 3
        assert await ensure_bucket_replicas(js) == []
        # five on three servers: refused with both numbers, at once
        monkeypatch.setenv("CHAMBER_NATS_REPLICAS", "5")
        with pytest.raises(ReplicasUnavailable, match=r"5 stream replicas requested .* has 3 JetStream server"):
            await ensure_streams(js)
    finally:
        await nc.close()
