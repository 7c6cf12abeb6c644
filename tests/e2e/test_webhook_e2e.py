"""End to end: the admission webhook over real HTTPS, then the scheduler admitting through the API stub.

`chamber service webhook` runs as a process with a certificate the test signs with its own CA
(openssl); the test plays the API server: it sends AdmissionReviews as the API server does, applies
the JSON Patch the webhook returns, and stores the object in the API stub. The quota and scheduler
services run as processes (`--kubernetes` against the stub through a kubeconfig), and the test
publishes the fleet discovery would. Then: the held Job is admitted on the node Chamber chose; a
Job whose namespace may not charge the team it names is refused by the webhook, and, created
anyway (as if the webhook had been down), is never admitted and gets a Kubernetes Event saying why.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from nats.js import JetStreamContext

from services.runtime import Publisher
from tests.integration.test_runtime import eventually
from tests.kube_stub import KubeStub
from tests.kube_workloads import a_batch_job
from tests.scheduler_builders import a_node
from tests.secured_bus import SecuredNatsServer
from tests.tls_certs import make_certificates

pytestmark = pytest.mark.e2e
CHAMBER = str(Path(sys.executable).parent / "chamber")
BINDINGS = """
namespaces:
  ml:
    teams: [vision]
    queues: {main: vision}
priorities:
  prod-high: high
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(tmp_path: Path, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = (tmp_path / f"{name}.log").open("w")
    return subprocess.Popen(
        [CHAMBER, "service", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


class Webhook:
    def __init__(self, url: str, ca: Path) -> None:
        self.url = url
        self.tls = ssl.create_default_context(cafile=str(ca))  # verifies the chain and the IP SAN

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            self.url + path, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, context=self.tls, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def review(self, path: str, obj: dict[str, Any], operation: str = "CREATE", uid: str = "rev-1") -> dict[str, Any]:
        group, _, version = obj["apiVersion"].rpartition("/")
        kind = {"group": group, "version": version, "kind": obj["kind"]}
        resource = {"group": group, "version": version, "resource": obj["kind"].lower() + "s"}
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": kind,
                "resource": resource,
                "requestKind": kind,
                "requestResource": resource,
                "name": obj["metadata"]["name"],
                "namespace": obj["metadata"]["namespace"],
                "operation": operation,
                "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
                "object": obj,
                "oldObject": None,
                "dryRun": False,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        }
        status, answer = self.post(path, json.dumps(review).encode())
        assert status == 200, answer
        assert (answer["apiVersion"], answer["kind"], answer["response"]["uid"]) == (
            "admission.k8s.io/v1",
            "AdmissionReview",
            uid,
        )
        return answer["response"]

    def admit(self, obj: dict[str, Any]) -> dict[str, Any]:
        """What the API server does on create: mutate, apply the patch, validate the result."""
        mutated = self.review("/mutate", obj)
        assert mutated["allowed"] is True
        if "patch" in mutated:
            assert mutated["patchType"] == "JSONPatch"
            obj = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(mutated["patch"])))
        validated = self.review("/validate", obj)
        assert validated["allowed"] is True, validated
        return obj


@pytest.fixture
def bindings(tmp_path: Path) -> Path:
    path = tmp_path / "bindings.yaml"
    path.write_text(BINDINGS)
    return path


@pytest.fixture
def webhook(tmp_path: Path, bindings: Path) -> Iterator[Webhook]:
    ca, cert, key = make_certificates(tmp_path)
    port = free_port()
    proc = spawn(tmp_path, "webhook", "webhook", "--host", "127.0.0.1", "--port", str(port), "--cert", str(cert),
                 "--key", str(key), "--bindings", str(bindings))  # fmt: skip
    try:
        yield Webhook(f"https://127.0.0.1:{port}", ca)
    finally:
        stop([proc])


@pytest.fixture
def scheduler(nats_server: SecuredNatsServer, tmp_path: Path, bindings: Path) -> Iterator[KubeStub]:
    with KubeStub() as api:
        env = {"KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig"))}
        procs = [
            spawn(tmp_path, "quota", "quota", "--nats", nats_server.url_for("quota"), "--interval", "0.5"),
            spawn(
                tmp_path,
                "scheduler",
                "scheduler",
                "--nats",
                nats_server.url_for("scheduler"),
                "--interval",
                "0.2",
                "--cluster",
                "c1",
                "--kubernetes",
                "--kubernetes-interval",
                "0.2",
                "--bindings",
                str(bindings),
                env=env,
            ),
        ]
        try:
            yield api
        finally:
            stop(procs)


async def _up(webhook: Webhook) -> bool:
    try:
        status, _ = await asyncio.to_thread(webhook.post, "/mutate", b"{}")
    except (urllib.error.URLError, ConnectionError):
        return False
    return status == 400


async def test_the_webhook_holds_and_refuses_then_the_scheduler_admits_through_the_api(
    tmp_path: Path, webhook: Webhook, scheduler: KubeStub, js: JetStreamContext, nats_server: SecuredNatsServer
) -> None:
    api = scheduler
    await eventually(lambda: _up(webhook), within=30)

    # not an AdmissionReview: a 400 naming the problem, never a 500
    assert webhook.post("/mutate", b"not json")[0] == 400
    assert webhook.post("/validate", b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}') == (
        400,
        {"error": "request.uid is missing", "status": 400},
    )

    # a Job naming a Kueue queue, created without spec.suspend: the webhook suspends it
    job = a_batch_job("train", gpus=8, parallelism=1, suspend=None, labels={"kueue.x-k8s.io/queue-name": "main"})
    mutated = webhook.review("/mutate", job)
    assert mutated["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(mutated["patch"])) == [{"op": "add", "path": "/spec/suspend", "value": True}]
    held = webhook.admit(job)
    assert held["spec"]["suspend"] is True

    # refusals, each naming the fix
    steal = a_batch_job("steal", labels={"chamber.io/team": "research"}, suspend=None)
    refused = webhook.review("/validate", steal)
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    assert "may not charge team 'research'; it may charge vision" in refused["status"]["message"]
    urgent = a_batch_job("urgent", labels={"chamber.io/team": "vision", "kueue.x-k8s.io/priority-class": "asap"})
    message = webhook.review("/validate", urgent)["status"]["message"]
    assert "unknown priority kueue.x-k8s.io/priority-class='asap'" in message and "prod-high" in message
    huge = a_batch_job("huge", gpus=800, labels={"chamber.io/team": "vision"})
    assert "800 GPUs is outside 0..64" in webhook.review("/validate", huge)["status"]["message"]
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "ml",
                  "labels": {"chamber.io/team": "vision"}}, "spec": {}}  # fmt: skip
    assert "Chamber does not manage Deployment objects" in webhook.review("/validate", deployment)["status"]["message"]

    # the API server stores the held Job; the scheduler picks it up and admits it on a node (its team
    # passes the same door as `chamber submit`: it has a quota)
    discovery = Publisher(js, source="test/discovery")
    await discovery.publish(a_node("n1", gpus=8, cluster="c1"))

    async def quota_set() -> bool:
        args = [CHAMBER, "quota", "set", "vision", "--gpus", "8", "--nats", nats_server.url]
        done = await asyncio.to_thread(subprocess.run, args, capture_output=True, timeout=60)
        return done.returncode == 0

    await eventually(quota_set, within=30)
    api.add(held)
    # ... and a Job that slipped past the webhook (say it was down) charging a team not bound to `ml`
    slipped = api.add(a_batch_job("steal", labels={"chamber.io/team": "research"}))

    def admitted() -> bool:
        spec = api.get("batch/v1", "Job", "ml", "train")["spec"]
        return spec.get("suspend") is False

    await eventually(admitted, within=60)
    template = api.get("batch/v1", "Job", "ml", "train")["spec"]["template"]["spec"]
    terms = template["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]

    await eventually(lambda: any(e["involvedObject"]["name"] == "steal" for e in api.events), within=30)
    [event] = [copy.deepcopy(e) for e in api.events if e["involvedObject"]["name"] == "steal"]
    assert event["involvedObject"]["uid"] == slipped["metadata"]["uid"]
    assert (event["type"], event["reason"]) == ("Warning", "ChamberRefused")
    assert "may not charge team 'research'" in event["message"]
    assert api.get("batch/v1", "Job", "ml", "steal")["spec"]["suspend"] is True  # never admitted
    log = (tmp_path / "scheduler.log").read_text()
    assert log.count("workload kind skipped") == 6  # JobSet, TrainJob, PyTorchJob, MPIJob, RayJob, LeaderWorkerSet
