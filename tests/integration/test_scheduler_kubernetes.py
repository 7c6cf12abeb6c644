"""Kubernetes Jobs the Kueue way, with the real `kubernetes` client against a local stub of the API
server that records every request: pick up a suspended labeled Job, admit it with node affinity
and unsuspend, suspend it on preemption, report its completion."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

from events import JobCompleted, JobSubmitted
from services.scheduler.kubernetes import CHECKPOINT_ANNOTATION, Admit, KubernetesJobs, Suspend, reconcile
from tests.scheduler_builders import Driver, a_job, a_node

pytestmark = pytest.mark.integration


def a_k8s_job(name: str, *, team: str = "vision", gpus: int = 4, parallelism: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": {"chamber.io/team": team}},
        "spec": {
            "suspend": True,
            "parallelism": parallelism,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "train", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
                    ],
                }
            },
        },
        "status": {},
    }


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


class ApiStub:
    """Just enough of the API server: list Jobs by label, patch one; every request is recorded."""

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str, str | None, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                stub.requests.append(("GET", self.path, None, None))
                url = urlsplit(self.path)
                if url.path == "/apis/batch/v1/jobs" and parse_qs(url.query) == {"labelSelector": ["chamber.io/team"]}:
                    items = [copy.deepcopy(j) for _, j in sorted(stub.jobs.items())]
                    self._reply(200, {"apiVersion": "batch/v1", "kind": "JobList", "metadata": {}, "items": items})
                else:
                    self._reply(404, {"kind": "Status", "code": 404})

            def do_PATCH(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(("PATCH", self.path, self.headers.get("Content-Type"), body))
                parts = self.path.split("/")  # /apis/batch/v1/namespaces/<ns>/jobs/<name>
                job = stub.jobs.get((parts[5], parts[7]))
                if job is None:
                    self._reply(404, {"kind": "Status", "code": 404})
                    return
                _merge(job, body)
                self._reply(200, job)

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"


@pytest.fixture
def api() -> Iterator[ApiStub]:
    stub = ApiStub()
    yield stub
    stub.server.shutdown()


def test_a_suspended_labeled_job_is_admitted_preempted_and_completed(api: ApiStub) -> None:
    config = client.Configuration()
    config.host = api.url
    jobs = KubernetesJobs(client.BatchV1Api(client.ApiClient(config)))
    api.jobs[("ml", "train")] = a_k8s_job("train")
    api.jobs[("ml", "unlabeled")] = {**a_k8s_job("unlabeled"), "metadata": {"name": "unlabeled", "namespace": "ml"}}
    d = Driver().given(a_node("n1", cluster="c1"), a_node("n2", cluster="c1"))

    # picked up: a gang of 2 x 4 GPUs in cluster c1
    events, actions = reconcile(d.state, jobs.list(), "c1", now=10.0)
    assert api.requests == [("GET", "/apis/batch/v1/jobs?labelSelector=chamber.io/team", None, None)]
    [(submitted, _)] = events
    assert isinstance(submitted, JobSubmitted) and actions == []
    assert (submitted.job_id, submitted.spec.team, submitted.spec.gpus_per_replica, submitted.spec.replicas) == (
        "k8s-c1-ml-train",
        "vision",
        4,
        2,
    )
    assert (submitted.spec.namespace, submitted.spec.name, submitted.spec.cluster) == ("ml", "train", "c1")

    # admitted: node affinity for the chosen node, then unsuspended, in that order
    d.given(submitted)
    d.cycle(now=11.0)
    _, actions = reconcile(d.state, jobs.list(), "c1", now=12.0)
    assert actions == [Admit("ml", "train", ("n1",))]
    api.requests.clear()
    jobs.act(actions[0])
    path = "/apis/batch/v1/namespaces/ml/jobs/train"
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}
                ]
            }
        }
    }
    assert api.requests == [
        (
            "PATCH",
            path,
            "application/strategic-merge-patch+json",
            {"spec": {"template": {"spec": {"affinity": affinity}}}},
        ),
        ("PATCH", path, "application/strategic-merge-patch+json", {"spec": {"suspend": False}}),
    ]
    assert reconcile(d.state, jobs.list(), "c1", now=13.0) == ([], [])  # converged

    # preempted by critical work: suspended again
    d.given(a_node("n2", cluster="c1"), a_job("urgent", team="other", gpus=8, priority="critical", at=14, cluster="c1"))
    d.given(a_job("urgent2", team="other", gpus=8, priority="critical", at=14.5, cluster="c1"))
    d.cycle(now=15.0)
    assert d.state_of("k8s-c1-ml-train") == "suspended"
    _, actions = reconcile(d.state, jobs.list(), "c1", now=16.0)
    assert [(a.namespace, a.name) for a in actions] == [("ml", "train")]
    assert isinstance(actions[0], Suspend) and "urgent" in actions[0].reason
    api.requests.clear()
    jobs.act(actions[0])
    # suspended with a checkpoint request (the annotation says why); the pods' SIGTERM is the job's signal
    body = {"spec": {"suspend": True}, "metadata": {"annotations": {CHECKPOINT_ANNOTATION: actions[0].reason}}}
    assert api.requests == [("PATCH", path, "application/strategic-merge-patch+json", body)]

    # resumed and finished: the Job's Complete condition becomes JobCompleted
    d.given(JobCompleted(job_id="urgent", at=17.0))
    d.cycle(now=18.0)
    _, actions = reconcile(d.state, jobs.list(), "c1", now=19.0)
    jobs.act(actions[0])
    api.jobs[("ml", "train")]["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 2}
    events, actions = reconcile(d.state, jobs.list(), "c1", now=20.0)
    assert [type(e).__name__ for e, _ in events] == ["JobCompleted"] and actions == []


def test_each_cluster_acts_only_on_its_own_jobs(api: ApiStub) -> None:
    config = client.Configuration()
    config.host = api.url
    jobs = KubernetesJobs(client.BatchV1Api(client.ApiClient(config)))
    api.jobs[("ml", "train")] = a_k8s_job("train", gpus=8, parallelism=1)
    d = Driver().given(a_node("n1", cluster="c1"), a_node("m1", cluster="c2"))
    [(submitted, _)] = reconcile(d.state, jobs.list(), "c2", now=1.0)[0]
    d.given(submitted)
    d.cycle(now=2.0)
    assert d.where("k8s-c2-ml-train") == {"m1": list(range(8))}  # the job names its cluster
    assert reconcile(d.state, jobs.list(), "c2", now=3.0)[1] == [Admit("ml", "train", ("m1",))]
