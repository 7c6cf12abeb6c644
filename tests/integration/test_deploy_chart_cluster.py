"""The chart on clustered engines: `nats.replicas: 3` renders a real JetStream cluster (routes to each
peer through a headless service, one server per node, a PDB) whose config nats-server accepts, with
the telemetry partition mapping; every service is told the replicas and partitions; the NOTES say how
to check stream replicas; an external ClickHouse cluster is passed on, and inconsistent values refused."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest

from events.partitions import server_mapping
from services.cli import main as chamber
from services.runtime.nats_server import find_binary
from tests.integration.test_deploy_chart import (
    CHART,
    K8S_VERSION,
    Doc,
    helm,  # noqa: F401 (the session fixture)
    kinds,
    named,
    pod_specs,
    render,
    run_helm,
)

pytestmark = pytest.mark.integration
CLUSTER = ("nats.replicas=3", "nats.telemetryPartitions=4")


@pytest.fixture(scope="module")
def clustered(helm: Path) -> list[Doc]:  # noqa: F811
    return render(helm, [], *CLUSTER)


def env_of(docs: list[Doc], name: str) -> dict[str, str]:
    [spec] = [spec for where, spec in pod_specs(docs) if where.endswith(f"/chamber-{name}")]
    return {e["name"]: e.get("value", "") for c in spec["containers"] for e in c.get("env", [])}


def test_three_nats_replicas_render_a_jetstream_cluster_spread_over_nodes(clustered: list[Doc]) -> None:
    for doc in clustered:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    nats = named(clustered, "StatefulSet", "chamber-nats")
    assert nats["spec"]["replicas"] == 3 and nats["spec"]["serviceName"] == "chamber-nats-headless"
    [term] = nats["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    headless = named(clustered, "Service", "chamber-nats-headless")
    assert headless["spec"]["clusterIP"] == "None" and {p["port"] for p in headless["spec"]["ports"]} >= {6222}
    pdb = named(clustered, "PodDisruptionBudget", "chamber-nats")
    assert pdb["spec"]["maxUnavailable"] == 1  # a 3-server cluster keeps its quorum through a drain
    config = named(clustered, "ConfigMap", "chamber-nats")["data"]["nats.conf"]
    routes = re.findall(r"nats://(chamber-nats-\d)\.chamber-nats-headless\.chamber\.svc:6222", config)
    assert routes == ["chamber-nats-0", "chamber-nats-1", "chamber-nats-2"]
    for src, dest in server_mapping(4).items():  # node samples, and what agents publish into their gates
        assert f'"{src}": "{dest}"' in config, src


def test_the_rendered_cluster_config_is_accepted_by_nats_server(clustered: list[Doc], tmp_path: Path) -> None:
    config = named(clustered, "ConfigMap", "chamber-nats")["data"]["nats.conf"]
    [init] = named(clustered, "StatefulSet", "chamber-nats")["spec"]["template"]["spec"]["initContainers"]
    passwords = tmp_path / "passwords"
    passwords.mkdir()
    for key in named(clustered, "Secret", "chamber-nats-users")["data"]:
        (passwords / key).write_text(f"pw-{key}")
    args = [a.replace("/etc/chamber/nats-passwords", str(passwords)) for a in init["args"]]
    assert chamber([a.replace("/etc/nats/auth/auth.conf", str(tmp_path / "auth" / "auth.conf")) for a in args]) == 0
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "nats.conf").write_text(config)
    check = subprocess.run(
        [find_binary(), "-t", "-c", str(tmp_path / "config" / "nats.conf")],
        capture_output=True,
        text=True,
        env={"POD_NAME": "chamber-nats-1", "PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    auth = (tmp_path / "auth" / "auth.conf").read_text()  # the reader may read every partition stream
    assert "$JS.API.CONSUMER.CREATE.TELEMETRY_P3.>" in auth
    assert "$JS.API.STREAM.DELETE" not in auth  # no role may delete a stream (the set-up only creates them)


def test_every_service_and_agent_gets_the_replicas_and_the_partitions(clustered: list[Doc]) -> None:
    for name in ("discovery", "health", "scheduler", "recorder", "gateway", "agent"):
        env = env_of(clustered, name)
        assert env["CHAMBER_NATS_REPLICAS"] == "3" and env["CHAMBER_TELEMETRY_PARTITIONS"] == "4", name


def test_more_servers_than_jetstream_allows_replicas_ask_for_five(helm: Path) -> None:  # noqa: F811
    env = env_of(render(helm, [], "nats.replicas=7"), "recorder")
    assert env["CHAMBER_NATS_REPLICAS"] == "5"


def test_the_notes_say_how_to_check_stream_replicas(helm: Path) -> None:  # noqa: F811
    out = run_helm(helm, "install", "chamber", str(CHART), "-n", "gpu", "--dry-run=client", "--set", CLUSTER[0]).stdout
    assert "streams and KV buckets keep 3 replicas" in out
    assert "chamber streams --nats nats://admin:PASSWORD@127.0.0.1:4222" in out
    assert "jsz?streams=true" in out


def test_an_external_clickhouse_cluster_is_passed_on_and_inconsistent_values_refused(helm: Path) -> None:  # noqa: F811
    internal = run_helm(helm, "template", "c", str(CHART), "--set", "clickhouse.cluster=fleet", check=False)
    assert internal.returncode != 0 and "set clickhouse.deploy=false and clickhouse.url" in internal.stderr
    bad_name = run_helm(
        helm, "template", "c", str(CHART), "--set", "clickhouse.deploy=false", "--set", "clickhouse.url=http://ch:8123",
        "--set", "clickhouse.cluster=fleet-1", check=False,
    )  # fmt: skip
    assert bad_name.returncode != 0 and "cluster" in bad_name.stderr
    docs = render(
        helm, [], "clickhouse.deploy=false", "clickhouse.url=http://ch-0.analytics:8123", "clickhouse.cluster=fleet"
    )
    assert not [d for d in kinds(docs, "StatefulSet") if d["metadata"]["name"] == "chamber-clickhouse"]
    for name in ("recorder", "gateway"):
        env = env_of(docs, name)
        assert (
            env["CHAMBER_CLICKHOUSE_CLUSTER"] == "fleet"
            and env["CHAMBER_CLICKHOUSE_URL"] == "http://ch-0.analytics:8123"
        )
