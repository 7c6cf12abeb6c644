"""Replicas follow the cluster; a request the cluster cannot hold is refused naming both numbers;
several servers may be given as a comma-separated list."""

from __future__ import annotations

import pytest

from services.cli.errors import UsageError
from services.runtime.connection import server_urls
from services.runtime.replicas import ReplicasUnavailable, cluster_size, parse_replicas, resolve_replicas

SINGLE = {"server_name": "n0"}
THREE = {"cluster": "c", "connect_urls": ["10.0.0.1:4222", "10.0.0.2:4222", "10.0.0.3:4222"]}
HIDDEN = {"cluster": "c"}  # no_advertise: the cluster does not tell clients its members


def test_a_single_server_gets_one_replica_and_a_cluster_of_three_gets_three() -> None:
    assert resolve_replicas(SINGLE, None) == 1
    assert resolve_replicas(THREE, None) == 3
    assert resolve_replicas({"cluster": "c", "connect_urls": ["a:1", "b:1"]}, None) == 1
    assert cluster_size(HIDDEN) is None and resolve_replicas(HIDDEN, None) == 1


def test_configured_replicas_win_when_the_cluster_can_hold_them() -> None:
    assert resolve_replicas(THREE, 1) == 1
    assert resolve_replicas(THREE, 3) == 3
    assert resolve_replicas(HIDDEN, 3) == 3  # the server's placement answer decides


def test_more_replicas_than_servers_is_refused_naming_both_numbers() -> None:
    with pytest.raises(ReplicasUnavailable, match=r"3 stream replicas requested .* has 1 JetStream server"):
        resolve_replicas(SINGLE, 3)
    with pytest.raises(ReplicasUnavailable, match=r"5 stream replicas requested .* has 3 JetStream server"):
        resolve_replicas(THREE, 5)


@pytest.mark.parametrize("raw", ["0", "6", "three", "-1"])
def test_a_bad_replica_count_is_a_usage_error(raw: str) -> None:
    with pytest.raises(UsageError, match="--replicas"):
        parse_replicas(raw)


def test_a_comma_separated_list_names_every_server() -> None:
    assert server_urls("nats://a:4222") == ["nats://a:4222"]
    assert server_urls("nats://a:4222, nats://b:4222,,nats://c:4222") == [
        "nats://a:4222",
        "nats://b:4222",
        "nats://c:4222",
    ]
    assert server_urls(["nats://a:1,nats://b:2"]) == ["nats://a:1", "nats://b:2"]
    with pytest.raises(ValueError, match="no NATS server"):
        server_urls(" , ")


def test_a_changed_partition_count_is_explained() -> None:
    from services.runtime.partitions import explain_change

    assert explain_change(1, []) is None and explain_change(4, [0, 1, 2, 3]) is None
    assert "from 2 to 4: adding partition streams" in (explain_change(4, [0, 1]) or "")
    fewer = explain_change(2, [0, 1, 2, 3]) or ""
    assert "TELEMETRY_P2, TELEMETRY_P3 receive no new samples" in fewer and "nothing is lost" in fewer
    assert "TELEMETRY_P0, TELEMETRY_P1 receive no new samples" in (explain_change(1, [0, 1]) or "")


def test_a_server_down_in_a_rolling_restart_does_not_make_three_replicas_refused() -> None:
    two_advertised = {"cluster": "c", "connect_urls": ["10.0.0.1:4222", "10.0.0.2:4222"]}
    with pytest.raises(ReplicasUnavailable):
        resolve_replicas(two_advertised, 3)  # a fresh cluster missing a server: refused, with numbers
    assert resolve_replicas(two_advertised, 3, known_peers=3) == 3  # R3 streams exist: it has three
    assert resolve_replicas(two_advertised, None, known_peers=3) == 3
    assert resolve_replicas(SINGLE, None, known_peers=3) == 1  # not clustered: known peers do not count
