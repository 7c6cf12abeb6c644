"""The chart's admission webhook: never kube-system or Chamber's own namespace, failurePolicy and
namespace selector from values, cert-manager when asked (or present), else a chart-made CA whose
serving certificate verifies for the webhook Service's DNS name (checked with openssl); the scheduler
acts on Kubernetes and both read the namespace bindings from one ConfigMap."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy_tools import helm_binary
from tests.integration.test_deploy_chart import CHART, K8S_VERSION, Doc, kinds, named, render, run_helm

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()


CONFIGS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def webhooks(docs: list[Doc]) -> list[Doc]:
    return [w for kind in CONFIGS for d in kinds(docs, kind) for w in d["webhooks"]]


def test_the_webhook_never_sees_kube_system_or_its_own_namespace_and_takes_policy_from_values(helm: Path) -> None:
    docs = render(
        helm,
        [],
        "webhook.failurePolicy=Ignore",
        "webhook.podFailurePolicy=Fail",
        "webhook.excludeNamespaces[0]=monitoring",
        "webhook.namespaceSelector.matchLabels.gpu=yes",
        namespace="gpu-system",
    )
    hooks = webhooks(docs)
    assert sorted(h["name"] for h in hooks) == sorted(
        f"{verb}-{what}-{label}.chamber.io"
        for verb in ("hold", "check")
        for what in ("workloads", "pods")
        for label in ("team", "queue")
    )
    for hook in hooks:
        pods = "-pods-" in hook["name"]
        assert hook["failurePolicy"] == ("Fail" if pods else "Ignore") and hook["sideEffects"] == "None"
        resources = {r for rule in hook["rules"] for r in rule["resources"]}
        assert resources == (
            {"pods"} if pods else {"jobs", "jobsets", "trainjobs", "pytorchjobs", "mpijobs", "rayjobs"}
        )
        selector = hook["namespaceSelector"]
        assert selector["matchLabels"] == {"gpu": "yes"}
        assert selector["matchExpressions"][0] == {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "gpu-system", "monitoring"],
        }
        [label] = hook["objectSelector"]["matchExpressions"]
        assert label["operator"] == "Exists" and label["key"] in ("chamber.io/team", "kueue.x-k8s.io/queue-name")
        assert hook["clientConfig"]["service"]["namespace"] == "gpu-system"
        ops = {tuple(r["operations"]) for r in hook["rules"]}
        assert ops == ({("CREATE",)} if hook["name"].startswith("hold") else {("CREATE", "UPDATE")})
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_by_default_workloads_fail_closed_and_pods_fail_open(helm: Path) -> None:
    # a Job's own pods carry its team label: Fail on pods would stop them while the webhook is down
    policies = {("-pods-" in h["name"], h["failurePolicy"]) for h in webhooks(render(helm, []))}
    assert policies == {(False, "Fail"), (True, "Ignore")}


def test_without_cert_manager_the_chart_makes_a_ca_that_signs_the_serving_certificate(
    helm: Path, tmp_path: Path
) -> None:
    docs = render(helm, [])
    secret = named(docs, "Secret", "chamber-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
    bundles = {base64.b64decode(h["clientConfig"]["caBundle"]) for h in webhooks(docs)}
    [bundle] = bundles
    (tmp_path / "bundle.pem").write_bytes(bundle)
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "bundle.pem"), "-verify_hostname",
         "chamber-webhook.chamber.svc", str(tmp_path / "tls.crt")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # a new pair at every render: an upgrade rotates them (the pod template follows the certificate)
    again = render(helm, [])
    assert named(again, "Secret", "chamber-webhook-tls")["data"]["tls.crt"] != secret["data"]["tls.crt"]
    pods = [named(d, "Deployment", "chamber-webhook")["spec"]["template"]["metadata"] for d in (docs, again)]
    assert pods[0]["annotations"]["checksum/tls"] != pods[1]["annotations"]["checksum/tls"]


def test_with_cert_manager_it_issues_the_certificate_and_injects_the_ca(helm: Path) -> None:
    docs = render(helm, [], "webhook.certManager.enabled=true")
    assert not [d for d in kinds(docs, "Secret") if d["metadata"]["name"] == "chamber-webhook-tls"]
    cert = named(docs, "Certificate", "chamber-webhook-tls")
    assert cert["spec"]["dnsNames"] == ["chamber-webhook.chamber.svc", "chamber-webhook.chamber.svc.cluster.local"]
    assert cert["spec"]["issuerRef"] == {"name": "chamber-webhook-ca", "kind": "Issuer"}
    assert named(docs, "Certificate", "chamber-webhook-ca")["spec"]["isCA"] is True
    for kind in CONFIGS:
        config = named(docs, kind, "chamber-webhook")
        assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": "chamber/chamber-webhook-tls"}
        assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])


def test_the_scheduler_and_the_webhook_read_the_bindings_from_values(helm: Path) -> None:
    docs = render(
        helm,
        [],
        "kube.bindings.namespaces.ml.teams[0]=vision",
        "kube.bindings.namespaces.ml.queues.main=vision",
        "kube.bindings.priorities.prod-high=high",
    )
    bindings = yaml.safe_load(named(docs, "ConfigMap", "chamber-kube-bindings")["data"]["bindings.yaml"])
    assert bindings == {
        "namespaces": {"ml": {"teams": ["vision"], "queues": {"main": "vision"}}},
        "priorities": {"prod-high": "high"},
    }
    for name in ("chamber-scheduler", "chamber-webhook"):
        spec = named(docs, "Deployment", name)["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["CHAMBER_KUBE_BINDINGS"] == "/etc/chamber/kube/bindings.yaml"
        assert {"name": "bindings", "configMap": {"name": "chamber-kube-bindings"}} in spec["volumes"]
    scheduler = named(docs, "Deployment", "chamber-scheduler")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "CHAMBER_SCHEDULER_KUBERNETES", "value": "true"} in scheduler["env"]


def test_a_binding_to_a_name_that_is_not_a_team_is_refused_at_install(helm: Path) -> None:
    done = run_helm(helm, "template", "c", str(CHART), "--set", "kube.bindings.namespaces.ml.teams[0]=Vision_Team",
                    check=False)  # fmt: skip
    assert done.returncode != 0 and "kube" in done.stderr and "teams" in done.stderr


def test_monitor_mode_installs_no_webhook(helm: Path) -> None:
    docs = render(helm, [], "mode=monitor")
    assert not webhooks(docs) and not [d for d in docs if "webhook" in d["metadata"]["name"]]
