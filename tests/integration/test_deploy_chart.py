"""The Helm chart, checked with real tools: `helm lint` and `helm template` (helm 4 from PyPI), schema
validation of every rendered object (kubernetes-validate, Kubernetes 1.33, strict), nats-server's own
config check, and assertions on what matters: RBAC verbs, security contexts, probes, GPU scheduling."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from services.cli import main as chamber
from services.runtime.nats_server import find_binary
from tests.deploy_tools import helm_binary

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "chamber"
K8S_VERSION = "1.33.0"
VALUES = {
    "default": [],
    "monitor": [CHART / "ci" / "monitor-values.yaml"],
    "gpu-cluster": [CHART / "ci" / "gpu-cluster-values.yaml"],
    "dev": [CHART / "values-dev.yaml"],
    "dispatch": [CHART / "ci" / "dispatch-values.yaml"],  # multi-cluster dispatch's control plane
}
ALL_SERVICES = {"discovery", "health", "quota", "scheduler", "billing", "recorder", "gateway", "perf"}
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet"}

Doc = dict[str, Any]


@pytest.fixture(scope="session")
def helm() -> Path:
    return helm_binary()


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done


def values_args(files: list[Path], sets: tuple[str, ...] = ()) -> list[str]:
    return [arg for f in files for arg in ("-f", str(f))] + [arg for s in sets for arg in ("--set", s)]


def render(helm: Path, files: list[Path], *sets: str, namespace: str = "chamber") -> list[Doc]:
    out = run_helm(helm, "template", "chamber", str(CHART), "-n", namespace, *values_args(files, sets)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="session")
def rendered(helm: Path) -> dict[str, list[Doc]]:
    return {name: render(helm, files) for name, files in VALUES.items()}


def kinds(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_specs(docs: list[Doc]) -> Iterator[tuple[str, Doc]]:
    for d in docs:
        if d["kind"] in WORKLOADS:
            yield f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"]


def components(docs: list[Doc], kind: str) -> set[str]:
    return {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in kinds(docs, kind)}


# --- the tools agree -----------------------------------------------------------------------------


@pytest.mark.parametrize("values", list(VALUES))
def test_helm_lint_passes_with_every_values_set(helm: Path, values: str) -> None:
    done = run_helm(helm, "lint", str(CHART), "--strict", *values_args(VALUES[values]))
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("values", list(VALUES))
def test_every_rendered_object_is_valid_against_the_kubernetes_schema(
    rendered: dict[str, list[Doc]], values: str
) -> None:
    docs = rendered[values]
    assert len(docs) > 25
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_schema_validator_does_reject_a_wrong_object(rendered: dict[str, list[Doc]]) -> None:
    deployment = dict(kinds(rendered["default"], "Deployment")[0])
    deployment["spec"] = {**deployment["spec"], "replicaz": 2}
    with pytest.raises(kubernetes_validate.ValidationError, match="replicaz"):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_values_outside_the_schema_are_refused_with_the_key(helm: Path) -> None:
    wrong_mode = run_helm(helm, "template", "c", str(CHART), "--set", "mode=watch", check=False)
    assert wrong_mode.returncode != 0 and "/mode" in wrong_mode.stderr and "monitor" in wrong_mode.stderr
    typo = run_helm(helm, "template", "c", str(CHART), "--set", "agent.nodeSelektor.a=b", check=False)
    assert typo.returncode != 0 and "nodeSelektor" in typo.stderr


def test_an_external_warehouse_or_nats_without_an_address_is_refused(helm: Path) -> None:
    no_ch = run_helm(helm, "template", "c", str(CHART), "--set", "clickhouse.deploy=false", check=False)
    assert no_ch.returncode != 0 and "clickhouse.url is required" in no_ch.stderr
    no_nats = run_helm(helm, "template", "c", str(CHART), "--set", "nats.deploy=false", check=False)
    assert no_nats.returncode != 0 and "nats.url is required" in no_nats.stderr


# --- what gets installed ---------------------------------------------------------------------------


def test_manage_installs_every_service_and_monitor_only_what_observes(rendered: dict[str, list[Doc]]) -> None:
    manage = components(rendered["default"], "Deployment")
    assert manage == ALL_SERVICES | {"webhook"}
    monitor = rendered["monitor"]
    assert components(monitor, "Deployment") == {"discovery", "health", "recorder", "gateway", "perf"}
    assert components(monitor, "DaemonSet") == {"agent"}
    assert {"nats", "clickhouse"} <= components(monitor, "StatefulSet")
    for _, spec in pod_specs(monitor):
        for c in spec["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if "CHAMBER_MODE" in env:
                assert env["CHAMBER_MODE"] == "monitor"


def test_the_scheduler_runs_a_leader_and_a_standby_that_never_overlap_on_rollout(
    rendered: dict[str, list[Doc]],
) -> None:
    scheduler = named(rendered["default"], "Deployment", "chamber-scheduler")
    assert scheduler["spec"]["replicas"] == 2
    assert scheduler["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    env = {e["name"]: e.get("value") for e in scheduler["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CHAMBER_LEADER_LEASE"] == "scheduler"


def test_each_service_runs_its_chamber_sub_command(rendered: dict[str, list[Doc]]) -> None:
    for d in kinds(rendered["default"], "Deployment"):
        name = d["metadata"]["labels"]["app.kubernetes.io/component"]
        [c] = d["spec"]["template"]["spec"]["containers"]
        assert c["image"] == "chamber:0.1.0" and c["args"][:2] == ["service", name]


def test_the_gateway_listens_for_its_service_and_the_warehouse_clients_get_the_clickhouse_address(
    rendered: dict[str, list[Doc]],
) -> None:
    docs = rendered["default"]
    gateway = named(docs, "Deployment", "chamber-gateway")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in gateway["env"]}
    assert env["CHAMBER_GATEWAY_HOST"]["value"] == "0.0.0.0"
    assert env["CHAMBER_GATEWAY_PORT"]["value"] == str(
        {p["name"]: p["containerPort"] for p in gateway["ports"]}["http"]
    )
    token = env["CHAMBER_API_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token["key"] in named(docs, "Secret", token["name"])["data"]
    for name in ("chamber-recorder", "chamber-gateway"):
        container = named(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        url = env["CHAMBER_CLICKHOUSE_URL"]["value"]
        assert url == "http://chamber:$(CHAMBER_CLICKHOUSE_PASSWORD)@chamber-clickhouse.chamber.svc:8123"
        names = [e["name"] for e in container["env"]]
        assert names.index("CHAMBER_CLICKHOUSE_PASSWORD") < names.index("CHAMBER_CLICKHOUSE_URL")  # $(VAR) order
    for d in kinds(docs, "Deployment"):
        if d["spec"]["template"]["metadata"]["labels"].get("chamber.io/nats-client") != "true":
            continue  # the admission webhook uses no NATS
        names = [e["name"] for e in d["spec"]["template"]["spec"]["containers"][0]["env"]]
        assert names.index("CHAMBER_NATS_PASSWORD") < names.index("CHAMBER_NATS_URL"), d["metadata"]["name"]


# --- least privilege -----------------------------------------------------------------------------------


def rules(docs: list[Doc]) -> list[tuple[str, Doc]]:
    return [(r["metadata"]["name"], rule) for r in docs if r["kind"] in ("Role", "ClusterRole") for rule in r["rules"]]


@pytest.mark.parametrize("values", list(VALUES))
def test_no_role_touches_secrets_or_uses_wildcards(rendered: dict[str, list[Doc]], values: str) -> None:
    for role, rule in rules(rendered[values]):
        assert "secrets" not in rule["resources"], role
        assert "*" not in rule["resources"] + rule["verbs"] + rule["apiGroups"], role


def test_manage_rbac_is_exactly_nodes_for_health_and_batch_jobs_for_the_scheduler(
    rendered: dict[str, list[Doc]],
) -> None:
    got = {
        (name, tuple(rule["apiGroups"]), tuple(rule["resources"])): rule["verbs"]
        for name, rule in rules(rendered["default"])
    }
    assert got == {
        ("chamber-discovery", ("",), ("nodes",)): ["get", "list", "watch"],
        ("chamber-health", ("",), ("nodes",)): ["get", "list", "watch", "patch"],
        ("chamber-health", ("",), ("nodes/status",)): ["get", "patch"],
        ("chamber-scheduler", ("batch",), ("jobs",)): ["get", "list", "watch", "patch", "update"],
        ("chamber-scheduler", ("jobset.x-k8s.io",), ("jobsets",)): ["get", "list", "watch", "patch"],
        ("chamber-scheduler", ("trainer.kubeflow.org",), ("trainjobs",)): ["get", "list", "watch", "patch"],
        ("chamber-scheduler", ("kubeflow.org",), ("pytorchjobs", "mpijobs")): ["get", "list", "watch", "patch"],
        ("chamber-scheduler", ("ray.io",), ("rayjobs",)): ["get", "list", "watch", "patch"],
        ("chamber-scheduler", ("",), ("pods",)): ["get", "list", "watch", "patch", "delete"],
        ("chamber-scheduler", ("apps",), ("deployments", "statefulsets")): ["get", "list", "watch"],
        ("chamber-scheduler", ("leaderworkerset.x-k8s.io",), ("leaderworkersets",)): ["get", "list", "watch"],
        ("chamber-scheduler", ("resource.k8s.io",), ("resourceclaimtemplates",)): ["list"],
        ("chamber-scheduler", ("",), ("events",)): ["create"],
    }
    for binding in kinds(rendered["default"], "ClusterRoleBinding"):
        [subject] = binding["subjects"]
        assert subject == {"kind": "ServiceAccount", "name": binding["roleRef"]["name"], "namespace": "chamber"}


def test_monitor_rbac_can_only_read_nodes(rendered: dict[str, list[Doc]]) -> None:
    for role, rule in rules(rendered["monitor"]):
        assert rule["resources"] == ["nodes"] and rule["verbs"] == ["get", "list", "watch"], role


def test_job_permissions_can_be_limited_to_named_namespaces(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["gpu-cluster"]
    job_roles = [r for r in docs if r["kind"] in ("Role", "ClusterRole") and r["rules"][0]["apiGroups"] == ["batch"]]
    assert {(r["kind"], r["metadata"]["namespace"]) for r in job_roles} == {("Role", "research"), ("Role", "inference")}


@pytest.mark.parametrize("values", list(VALUES))
def test_every_container_runs_non_root_read_only_without_privileges_or_host_access(
    rendered: dict[str, list[Doc]], values: str
) -> None:
    for name, spec in pod_specs(rendered[values]):
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), name
        assert not any("hostPath" in v for v in spec.get("volumes", [])), name
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc.get("privileged", False) is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], (name, c["name"])
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], (name, c["name"])


def test_only_services_that_call_the_kubernetes_api_carry_a_token(rendered: dict[str, list[Doc]]) -> None:
    tokens = {n.split("/")[1]: spec["automountServiceAccountToken"] for n, spec in pod_specs(rendered["default"])}
    assert {n for n, t in tokens.items() if t} == {"chamber-discovery", "chamber-health", "chamber-scheduler"}


# --- probes served by the runtime ---------------------------------------------------------------------


def assert_runtime_probes(name: str, container: Doc) -> None:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CHAMBER_HEALTH_PORT"] == str(ports["health"]), name
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "health"}, name
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}, name


@pytest.mark.parametrize("values", list(VALUES))
def test_every_service_is_probed_on_the_runtime_health_port(rendered: dict[str, list[Doc]], values: str) -> None:
    services = [d for d in kinds(rendered[values], "Deployment") if d["metadata"]["name"] != "chamber-agent"]
    assert len(services) >= 4
    for d in services:
        [c] = d["spec"]["template"]["spec"]["containers"]
        assert_runtime_probes(d["metadata"]["name"], c)
    for name, spec in pod_specs(rendered[values]):
        if "nats" in name or "clickhouse" in name:
            [c] = spec["containers"]
            assert c["livenessProbe"]["httpGet"] and c["readinessProbe"]["httpGet"], name


def test_the_agent_is_probed_on_its_health_port_unless_switched_off(helm: Path) -> None:
    [agent] = kinds(render(helm, []), "DaemonSet")
    [c] = agent["spec"]["template"]["spec"]["containers"]
    assert_runtime_probes("agent", c)  # the agent serves /livez and /readyz on $CHAMBER_HEALTH_PORT
    assert {"name": "CHAMBER_HEALTH_PORT", "value": str(c["ports"][0]["containerPort"])} in c["env"]
    [agent] = kinds(render(helm, [], "agent.probes=false"), "DaemonSet")
    [c] = agent["spec"]["template"]["spec"]["containers"]
    assert "livenessProbe" not in c and "readinessProbe" not in c


# --- the node agent ----------------------------------------------------------------------------------


def test_the_agent_runs_on_gpu_nodes_only_with_the_nvidia_runtime_and_takes_no_gpu(
    rendered: dict[str, list[Doc]],
) -> None:
    [agent] = kinds(rendered["default"], "DaemonSet")
    spec = agent["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"] for t in terms] == [
        [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}],
        [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}],
    ]
    tolerated = {(t["key"], t["effect"]) for t in spec["tolerations"]}
    assert {("nvidia.com/gpu", "NoSchedule"), ("chamber.io/gpu-unhealthy", "NoSchedule")} <= tolerated
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["automountServiceAccountToken"] is False
    [c] = spec["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"  # NVML only, no compute
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "nvidia.com/gpu" not in str(c["resources"])
    assert c["args"][:5] == ["agent", "--log-level", "info", "--node", "$(NODE_NAME)"]
    assert env["CHAMBER_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "agent"


def test_a_gpu_cluster_agent_logs_in_as_its_own_node_and_sees_only_agent_passwords(
    rendered: dict[str, list[Doc]],
) -> None:
    docs = rendered["gpu-cluster"]
    [agent] = kinds(docs, "DaemonSet")
    spec = agent["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert ("dedicated", "NoSchedule") in {(t["key"], t["effect"]) for t in spec["tolerations"]}
    [c] = spec["containers"]
    script = c["args"][0]
    assert "agent-${NODE_NAME}" in script and "exec chamber agent --log-level info --node" in script
    assert "CHAMBER_NATS_PASSWORD" not in {e["name"] for e in c["env"]}
    [secret_volume] = [v for v in spec["volumes"] if "secret" in v]
    agents_secret = named(docs, "Secret", secret_volume["secret"]["secretName"])
    assert set(agents_secret["data"]) == {"agent-dgx-a-001", "agent-dgx-a-002", "agent-dgx-a-003"}


@pytest.mark.parametrize("values", ["default", "gpu-cluster"])
def test_step_log_directories_are_mounted_read_only_and_named_to_the_agent(helm: Path, values: str) -> None:
    """A workload's `chamber.io/step-log` path P is read at mountRoot + P; only the directories the
    operator lists are mounted, read-only, and nothing is mounted by default."""
    sets = ("agent.stepLogs.hostPaths[0]=/var/lib/training/steps",)
    [agent] = kinds(render(helm, VALUES[values], *sets), "DaemonSet")
    spec = agent["spec"]["template"]["spec"]
    [c] = spec["containers"]
    [mount] = [m for m in c["volumeMounts"] if m["name"].startswith("step-logs")]
    assert mount == {"name": "step-logs-0", "mountPath": "/host/var/lib/training/steps", "readOnly": True}
    [volume] = [v for v in spec["volumes"] if v["name"] == "step-logs-0"]
    assert volume["hostPath"] == {"path": "/var/lib/training/steps", "type": "Directory"}
    args = " ".join(c["args"])
    assert "--step-log-root /host" in args
    [plain] = kinds(render(helm, VALUES[values]), "DaemonSet")
    assert "--step-log-root" not in " ".join(plain["spec"]["template"]["spec"]["containers"][0]["args"])


def test_the_dev_fleet_is_one_simulated_agent_without_gpu_scheduling(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["dev"]
    assert kinds(docs, "DaemonSet") == []
    agent = named(docs, "Deployment", "chamber-agent")
    [c] = agent["spec"]["template"]["spec"]["containers"]
    assert c["args"][:4] == ["agent", "--log-level", "debug", "--simulate"]
    assert "runtimeClassName" not in agent["spec"]["template"]["spec"]
    env = {e["name"]: e for e in c["env"]}
    assert env["CHAMBER_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "simulator"


# --- NATS: the chart's users, Secret and server config agree -----------------------------------------


@pytest.mark.parametrize("values", list(VALUES))
def test_the_rendered_nats_config_with_generated_authorization_is_accepted_by_nats_server(
    rendered: dict[str, list[Doc]], values: str, tmp_path: Path
) -> None:
    docs = rendered[values]
    config = named(docs, "ConfigMap", "chamber-nats")["data"]["nats.conf"]
    nats = named(docs, "StatefulSet", "chamber-nats")["spec"]["template"]["spec"]
    [init] = nats["initContainers"]
    assert init["args"][0] == "nats-config"

    # run the init container's command here, with the Secret's keys as password files
    users_secret = named(docs, "Secret", "chamber-nats-users")
    passwords = tmp_path / "passwords"
    passwords.mkdir()
    secrets = [users_secret] + [d for d in kinds(docs, "Secret") if d["metadata"]["name"] == "chamber-nats-agents"]
    for secret in secrets:
        for key in secret["data"]:
            (passwords / key).write_text(f"pw-{key}")
    args = [a.replace("/etc/chamber/nats-passwords", str(passwords)) for a in init["args"]]
    args = [a.replace("/etc/nats/auth/auth.conf", str(tmp_path / "auth" / "auth.conf")) for a in args]
    assert chamber(args) == 0  # every user it generates has a password in the chart's Secrets

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "nats.conf").write_text(config)
    check = subprocess.run(
        [find_binary(), "-t", "-c", str(tmp_path / "config" / "nats.conf")],
        capture_output=True,
        text=True,
        env={"POD_NAME": "chamber-nats-0", "PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    assert check.returncode == 0, check.stdout + check.stderr

    # every NATS user a pod logs in as exists in the generated authorization block
    generated = set(re.findall(r'"user": "([^"]+)"', (tmp_path / "auth" / "auth.conf").read_text()))
    used = {
        e["valueFrom"]["secretKeyRef"]["key"]
        for _, spec in pod_specs(docs)
        for c in spec["containers"]
        for e in c.get("env", [])
        if e["name"] == "CHAMBER_NATS_PASSWORD"
    }
    assert used and used <= generated


def test_network_policies_name_only_ports_their_pods_have(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["gpu-cluster"]
    pods = [
        (d["spec"]["template"]["metadata"]["labels"], spec)
        for d in docs
        if d["kind"] in WORKLOADS
        for spec in [d["spec"]["template"]["spec"]]
    ]
    policies = kinds(docs, "NetworkPolicy")
    assert len(policies) >= 5
    for policy in policies:
        selector = policy["spec"]["podSelector"]["matchLabels"]
        selected = [spec for labels, spec in pods if selector.items() <= labels.items()]
        assert selected, policy["metadata"]["name"]
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                if isinstance(port["port"], str):
                    for spec in selected:
                        names = {p["name"] for c in spec["containers"] for p in c.get("ports", [])}
                        assert port["port"] in names, (policy["metadata"]["name"], port["port"])


def test_notes_tell_how_to_open_the_dashboard(helm: Path) -> None:
    out = run_helm(helm, "install", "chamber", str(CHART), "-n", "gpu", "--dry-run=client").stdout
    assert "kubectl -n gpu port-forward svc/chamber-gateway 8080:80" in out
    ingress = run_helm(
        helm, "install", "chamber", str(CHART), "-n", "gpu", "--dry-run=client",
        *values_args(VALUES["gpu-cluster"]),
    ).stdout  # fmt: skip
    assert "https://chamber.dgx-a.example.com/" in ingress


# --- skaffold.yaml --------------------------------------------------------------------------------------
# No skaffold binary can be had here (not on PyPI, Debian or npm), so `skaffold diagnose` cannot run.
# This checks the structure skaffold's v4beta13 schema requires for the fields we use, that every path
# it names exists, that each profile's JSON patches apply, and renders the chart the way each profile
# would install it, with the real helm.

SKAFFOLD_API = "skaffold/v4beta13"  # the schema of skaffold 2.15 to 2.17, the current releases


def json_patch(doc: Any, patches: list[Doc]) -> Any:
    """The subset of RFC 6902 skaffold profiles use here: add and replace on an existing parent."""
    import copy

    doc = copy.deepcopy(doc)
    for patch in patches:
        *parents, last = patch["path"].strip("/").split("/")
        node = doc
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        key: Any = int(last) if isinstance(node, list) else last
        if patch["op"] == "replace":
            assert key in node if isinstance(node, dict) else key < len(node), f"nothing to replace at {patch['path']}"
        else:
            assert patch["op"] == "add", patch
        node[key] = patch["value"]
    return doc


def skaffold_profiles() -> dict[str, Doc]:
    config = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
    variants = {"dev": config}
    for profile in config.get("profiles", []):
        assert set(profile) <= {"name", "activation", "patches", "build", "deploy", "portForward"}, profile["name"]
        variants[profile["name"]] = json_patch({k: v for k, v in config.items() if k != "profiles"}, profile["patches"])
    return variants


def test_skaffold_builds_the_image_and_forwards_the_dashboard_of_the_release_it_deploys(helm: Path) -> None:
    config = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
    assert config["apiVersion"] == SKAFFOLD_API and config["kind"] == "Config"
    [artifact] = config["build"]["artifacts"]
    assert (ROOT / artifact.get("context", ".") / artifact["docker"]["dockerfile"]).is_file()
    [release] = config["deploy"]["helm"]["releases"]
    assert (ROOT / release["chartPath"] / "Chart.yaml").is_file()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key, template in release["setValueTemplates"].items():
        section, field = key.split(".")
        assert field in values[section], key
        assert artifact["image"].replace("-", "_") in template  # {{.IMAGE_REPO_chamber}} names the artifact
    [forward] = config["portForward"]
    docs = render(helm, [ROOT / f for f in release["valuesFiles"]], namespace=release["namespace"])
    service = named(docs, "Service", forward["resourceName"])
    assert forward["resourceType"] == "service" and forward["namespace"] == release["namespace"]
    assert forward["port"] in [p["port"] for p in service["spec"]["ports"]]


@pytest.mark.parametrize("profile", ["dev", "gpu", "gpu-monitor"])
def test_each_skaffold_profile_installs_a_valid_chart(helm: Path, profile: str) -> None:
    config = skaffold_profiles()[profile]
    [release] = config["deploy"]["helm"]["releases"]
    sets = tuple(f"{k}={v}" for k, v in release.get("setValues", {}).items())
    files = [ROOT / f for f in release["valuesFiles"]]
    run_helm(helm, "lint", str(CHART), "--strict", *values_args(files, sets))
    docs = render(helm, files, *sets, namespace=release["namespace"])
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    agents = {d["kind"] for d in docs if d["metadata"]["name"] == "chamber-agent" and d["kind"] in WORKLOADS}
    assert agents == ({"Deployment"} if profile == "dev" else {"DaemonSet"})  # simulated fleet only in dev
    if profile == "gpu-monitor":
        assert components(docs, "Deployment") == {"discovery", "health", "recorder", "gateway", "perf"}
    if profile != "dev":
        assert config["build"]["local"]["push"] is True


def test_the_per_node_agent_wrapper_logs_in_as_its_node_or_stops_with_the_value_to_fix(
    rendered: dict[str, list[Doc]], tmp_path: Path
) -> None:
    [agent] = kinds(rendered["gpu-cluster"], "DaemonSet")
    [c] = agent["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["/bin/sh", "-c"]
    # what the kubelet hands the shell: $$ becomes $; then run it with a `chamber` that shows its inputs
    script = c["args"][0].replace("$$", "$").replace("/etc/chamber/nats-agent", str(tmp_path / "secret"))
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "agent-dgx-a-001").write_text("s3cret")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "chamber").write_text('#!/bin/sh\necho "$CHAMBER_NATS_URL" "$@"\n')
    (bin_dir / "chamber").chmod(0o755)

    def run_on(node: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "NODE_NAME": node}
        return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, timeout=10)

    ok = run_on("dgx-a-001")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == [
        "nats://agent-dgx-a-001:s3cret@chamber-nats.chamber.svc:4222",
        "agent", "--log-level", "info", "--node", "dgx-a-001", "--interval", "5", "--spool", "/var/lib/chamber/spool",
    ]  # fmt: skip
    unknown = run_on("dgx-a-999")
    assert unknown.returncode == 1 and "add it to nats.auth.agentNodes" in unknown.stderr


@pytest.mark.parametrize("values", ["default", "dispatch"])
async def test_the_charts_nats_admits_each_pod_with_the_url_the_chart_gives_it(
    helm: Path, rendered: dict[str, list[Doc]], values: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rendered nats.conf plus the init container's generated block, served by a real nats-server;
    each workload connects with the CHAMBER_NATS_URL the chart builds for it (with dispatch: the
    dispatcher as svc-dispatch and this cluster's actuator as actuator-<cluster>, and a member
    cluster's install, its actuator and node agents, with the keys of the control plane's Secret)."""
    import nats as nats_py

    from events.streams import GATES, STREAMS
    from services.runtime import ensure_streams
    from services.runtime.credentials import inbox_prefix
    from services.runtime.nats_server import NatsServerProcess
    from services.runtime.setup import set_up

    docs = rendered[values]
    pods = list(pod_specs(docs))
    if values == "dispatch":
        member = render(
            helm,
            [],
            *("dispatch.actuator.enabled=true", "dispatch.actuator.nodeAgents=true", "cluster.name=west"),
            *("nats.deploy=false", "nats.url=nats://chamber-nats.chamber.svc:4222"),
            "nats.auth.existingSecret=chamber-nats-users",
        )
        pods += [(f"west {name}", spec) for name, spec in pod_specs(member)]
        assert {"west Deployment/chamber-dispatch-actuator", "west DaemonSet/chamber-agent"} <= {n for n, _ in pods}
    config = named(docs, "ConfigMap", "chamber-nats")["data"]["nats.conf"]
    # the store and ports come from the test server's flags; the pid file goes to a writable place
    config = re.sub(r"\n\s*store_dir: .*", "", config).replace("/var/run/nats", str(tmp_path))
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "nats.conf").write_text(config)
    passwords = tmp_path / "passwords"
    passwords.mkdir()
    for key in named(docs, "Secret", "chamber-nats-users")["data"]:
        (passwords / key).write_text(f"pw-{key}")
    [init] = named(docs, "StatefulSet", "chamber-nats")["spec"]["template"]["spec"]["initContainers"]
    args = [a.replace("/etc/chamber/nats-passwords", str(passwords)) for a in init["args"]]
    assert chamber([a.replace("/etc/nats/auth", str(tmp_path / "auth")) for a in args]) == 0

    monkeypatch.setenv("POD_NAME", "chamber-nats-0")
    server = NatsServerProcess(tmp_path / "js", log_file=tmp_path / "nats.log")
    server.extra_args = ["-c", str(tmp_path / "config" / "nats.conf")]
    server.start()
    try:
        # the set-up Job first: it creates the streams and buckets; services and the agent only find them
        jobs = [(f"Job/{d['metadata']['name']}", d["spec"]["template"]["spec"]) for d in kinds(docs, "Job")]
        for name, spec in [*jobs, *pods]:
            for c in spec["containers"]:
                env = {e["name"]: e for e in c.get("env", [])}
                if "CHAMBER_NATS_URL" not in env:
                    continue
                user = env["CHAMBER_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"]
                url = env["CHAMBER_NATS_URL"]["value"].replace("$(CHAMBER_NATS_PASSWORD)", f"pw-{user}")
                url = url.replace("chamber-nats.chamber.svc:4222", f"127.0.0.1:{server.port}")
                nc = await nats_py.connect(url, allow_reconnect=False, inbox_prefix=inbox_prefix(user))
                if name.startswith("Job/"):
                    assert spec["containers"][0]["args"] == ["setup"]
                    await set_up(nc.jetstream())
                elif "DaemonSet/chamber-agent" in name:  # the agent checks its gates, and may read no other stream
                    assert await ensure_streams(nc.jetstream(), GATES, replicas=1, update=False) == []
                elif "chamber-dispatch-actuator" in name:  # a member cluster's actuator: DISPATCH only
                    dispatch = [s for s in STREAMS if s.name == "DISPATCH"]
                    assert await ensure_streams(nc.jetstream(), dispatch, replicas=1, update=False) == []
                else:
                    assert await ensure_streams(nc.jetstream(), update=False) == []  # all there
                await nc.close()
        with pytest.raises(nats_py.errors.Error, match=r"(?i)authorization"):
            await nats_py.connect(f"nats://svc-gateway:wrong@127.0.0.1:{server.port}", allow_reconnect=False)
    finally:
        server.kill()


def test_every_pod_gets_the_same_telemetry_retention(rendered: dict[str, list[Doc]]) -> None:
    """Each service sets TELEMETRY's limits at start: they must all be told the same ones."""
    seen = set()
    for docs in rendered.values():
        for doc in docs:
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                env = {e["name"]: e.get("value") for e in container.get("env", [])}
                if "CHAMBER_CLUSTER" in env:
                    seen.add((env.get("CHAMBER_TELEMETRY_MAX_AGE_S"), env.get("CHAMBER_TELEMETRY_MAX_BYTES")))
    assert seen == {("900", "1073741824")}
