"""Kubernetes workloads the Kueue way, with the real `kubernetes` client against the local API-server
stub (tests/kube_stub.py) that records every request: pick up a held workload, admit it with node
affinity (keeping the user's own) and release it, suspend it on preemption with the user's affinity
restored, report its completion. Every kind: batch Job, JobSet, TrainJob, PyTorchJob, MPIJob, RayJob,
plain Pods with a scheduling gate; and a serving Deployment scaled up, down and to zero."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from events import JobCompleted, JobSubmitted, PriorityClass
from events.names import InvalidName
from services.kube.bindings import Bindings, NamespaceBinding
from services.kube.cluster import KubernetesWorkloads
from services.kube.kinds import KINDS, kind_of
from services.scheduler.kubernetes import CHECKPOINT_ANNOTATION, Admit, Refuse, Suspend, reconcile
from services.scheduler.serving import DeletePod, reconcile_serving, split
from tests.kube_stub import KubeStub, Request
from tests.kube_workloads import (
    USER_AFFINITY,
    a_batch_job,
    a_deployment,
    a_jobset,
    a_pod,
    a_pytorchjob,
    a_rayjob,
    a_replica_pod,
    a_statefulset,
    a_trainjob,
    an_mpijob,
)
from tests.scheduler_builders import Driver, a_job, a_node, a_quota

pytestmark = pytest.mark.integration

CRDS = [
    ("jobset.x-k8s.io", "v1alpha2"),
    ("trainer.kubeflow.org", "v1alpha1"),
    ("kubeflow.org", "v1"),
    ("kubeflow.org", "v2beta1"),
    ("ray.io", "v1"),
]
JSON_PATCH = "application/json-patch+json"
# Workloads pass the same door as `chamber submit`: their team needs a quota (0: it only borrows idle
# GPUs); `other`, whose critical jobs preempt them here, is guaranteed the GPUs it reclaims.
QUOTA = (a_quota("vision", 0), a_quota("other", 16, critical=True))
SEL_TEAM, SEL_QUEUE = "labelSelector=chamber.io/team", "labelSelector=kueue.x-k8s.io/queue-name"


@pytest.fixture
def api() -> Iterator[KubeStub]:
    with KubeStub() as stub:
        stub.api_groups = list(CRDS)
        yield stub


def workloads(stub: KubeStub, skipped: list[str] | None = None) -> KubernetesWorkloads:
    w = KubernetesWorkloads(client.ApiClient(client.Configuration(host=stub.url)))
    w.detect(lambda kind: (skipped if skipped is not None else []).append(kind.kind))
    return w


def pinned(nodes: list[str], user: dict[str, Any] | None = None) -> dict[str, Any]:
    terms = (user or {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
    host = {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
    out = copy.deepcopy(user or {})
    out.setdefault("nodeAffinity", {})["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": [
            {**t, "matchExpressions": [*t.get("matchExpressions", []), host]}
            for t in (terms.get("nodeSelectorTerms") or [{}])
        ]
    }
    return out


def test_a_held_job_is_admitted_with_the_users_affinity_kept_then_preempted_with_it_restored(api: KubeStub) -> None:
    w = workloads(api)
    api.add(a_batch_job("train", affinity=USER_AFFINITY))
    api.add(a_batch_job("unlabeled", labels={}))
    d = Driver().given(*QUOTA, a_node("n1", cluster="c1"), a_node("n2", cluster="c1"))

    # picked up: a gang of 2 x 4 GPUs in cluster c1; one request per selector and kind
    api.requests.clear()
    events, actions = reconcile(d.state, w.list(), "c1", now=10.0)
    assert [(r.method, r.path, r.query) for r in api.requests[:2]] == [
        ("GET", "/apis/batch/v1/jobs", SEL_TEAM),
        ("GET", "/apis/batch/v1/jobs", SEL_QUEUE),
    ]
    [(submitted, _)] = events
    assert isinstance(submitted, JobSubmitted) and actions == []
    spec = submitted.spec
    assert (submitted.job_id, spec.team, spec.gpus_per_replica, spec.replicas) == ("k8s-c1-ml-train", "vision", 4, 2)
    assert (spec.namespace, spec.name, spec.cluster, spec.priority) == ("ml", "train", "c1", PriorityClass.NORMAL)

    # admitted: one JSON Patch pins the pods (the user's term keeps its GPU-product constraint),
    # keeps the user's affinity in an annotation, and unsuspends
    d.given(submitted)
    d.cycle(now=11.0)
    _, actions = reconcile(d.state, w.list(), "c1", now=12.0)
    assert actions == [Admit("ml", "train", ("n1",))]
    api.requests.clear()
    w.patch(KINDS[0], "ml", "train", list(actions[0].ops))
    path = "/apis/batch/v1/namespaces/ml/jobs/train"
    saved = json.dumps({"/spec/template/spec": USER_AFFINITY}, sort_keys=True)
    assert api.requests == [
        Request(
            "PATCH",
            path,
            JSON_PATCH,
            [
                {"op": "add", "path": "/spec/template/spec/affinity", "value": pinned(["n1"], USER_AFFINITY)},
                {"op": "add", "path": "/metadata/annotations", "value": {"chamber.io/user-affinity": saved}},
                {"op": "add", "path": "/spec/suspend", "value": False},
            ],
        )
    ]
    job = api.get("batch/v1", "Job", "ml", "train")
    assert job["spec"]["suspend"] is False
    assert job["spec"]["template"]["spec"]["affinity"] == pinned(["n1"], USER_AFFINITY)
    assert reconcile(d.state, w.list(), "c1", now=13.0) == ([], [])  # converged

    # preempted by critical work: suspended again, and the user's own affinity is back as written
    d.given(a_node("n2", cluster="c1"), a_job("urgent", team="other", gpus=8, priority="critical", at=14, cluster="c1"))
    d.given(a_job("urgent2", team="other", gpus=8, priority="critical", at=14.5, cluster="c1"))
    d.cycle(now=15.0)
    assert d.state_of("k8s-c1-ml-train") == "suspended"
    _, actions = reconcile(d.state, w.list(), "c1", now=16.0)
    assert actions == [Suspend("ml", "train")]
    reason = actions[0].reason
    assert isinstance(actions[0], Suspend) and "urgent" in reason
    api.requests.clear()
    w.patch(KINDS[0], "ml", "train", list(actions[0].ops))
    # suspended with a checkpoint request (the annotation says why); the pods' SIGTERM is the job's signal
    assert api.requests == [
        Request(
            "PATCH",
            path,
            JSON_PATCH,
            [
                {"op": "add", "path": "/spec/suspend", "value": True},
                {"op": "add", "path": "/spec/template/spec/affinity", "value": USER_AFFINITY},
                {"op": "remove", "path": "/metadata/annotations/chamber.io~1user-affinity"},
                {"op": "add", "path": "/metadata/annotations/chamber.io~1checkpoint-requested", "value": reason},
            ],
        )
    ]
    job = api.get("batch/v1", "Job", "ml", "train")
    assert job["spec"]["template"]["spec"]["affinity"] == USER_AFFINITY
    assert job["metadata"]["annotations"] == {CHECKPOINT_ANNOTATION: reason}

    # resumed and finished: the Job's Complete condition becomes JobCompleted
    d.given(JobCompleted(job_id="urgent", at=17.0))
    d.cycle(now=18.0)
    _, actions = reconcile(d.state, w.list(), "c1", now=19.0)
    w.patch(KINDS[0], "ml", "train", list(actions[0].ops))
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 2}
    job = api.get("batch/v1", "Job", "ml", "train")
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 2}
    events, actions = reconcile(d.state, w.list(), "c1", now=20.0)
    assert [type(e).__name__ for e, _ in events] == ["JobCompleted"] and actions == []


def test_each_cluster_acts_only_on_its_own_jobs(api: KubeStub) -> None:
    w = workloads(api)
    api.add(a_batch_job("train", gpus=8, parallelism=1))
    d = Driver().given(*QUOTA, a_node("n1", cluster="c1"), a_node("m1", cluster="c2"))
    [(submitted, _)] = reconcile(d.state, w.list(), "c2", now=1.0)[0]
    d.given(submitted)
    d.cycle(now=2.0)
    assert d.where("k8s-c2-ml-train") == {"m1": list(range(8))}  # the job names its cluster
    assert reconcile(d.state, w.list(), "c2", now=3.0)[1] == [Admit("ml", "train", ("m1",))]


# kind, object, (GPUs per pod, pods), JSON pointers of the GPU pod templates, the suspend flag's pointer,
# and the status that means it completed
CASES = [
    (a_jobset(), (8, 2), ["/spec/replicatedJobs/1/template/spec/template/spec"], "/spec/suspend",
     {"conditions": [{"type": "Completed", "status": "True"}]}),
    (a_pytorchjob(), (4, 4), ["/spec/pytorchReplicaSpecs/Master/template/spec",
                              "/spec/pytorchReplicaSpecs/Worker/template/spec"], "/spec/runPolicy/suspend",
     {"conditions": [{"type": "Succeeded", "status": "True"}]}),
    (a_rayjob(), (8, 2), ["/spec/rayClusterSpec/workerGroupSpecs/0/template/spec"], "/spec/suspend",
     {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}),
    (an_mpijob(), (8, 2), ["/spec/mpiReplicaSpecs/Worker/template/spec"], "/spec/runPolicy/suspend",
     {"conditions": [{"type": "Succeeded", "status": "True"}]}),
]  # fmt: skip


def _at(obj: Any, pointer: str) -> Any:
    for token in pointer.split("/")[1:]:
        obj = obj[int(token)] if isinstance(obj, list) else obj[token]
    return obj


@pytest.mark.parametrize(
    "workload,demand,templates,suspend,complete", CASES, ids=lambda c: getattr(c, "get", None) and c.get("kind")
)
def test_each_kind_is_submitted_admitted_suspended_and_completed(
    api: KubeStub,
    workload: dict[str, Any],
    demand: tuple[int, int],
    templates: list[str],
    suspend: str,
    complete: dict[str, Any],
) -> None:
    w = workloads(api)
    stored = api.add(workload)
    kind = kind_of(workload["apiVersion"], workload["kind"])
    assert kind is not None
    api_path = f"/apis/{workload['apiVersion']}/namespaces/ml/{kind.plural}/{stored['metadata']['name']}"
    d = Driver().given(*QUOTA, a_node("n1", cluster="c1"), a_node("n2", cluster="c1"))

    [(submitted, _)] = reconcile(d.state, w.list(), "c1", now=1.0)[0]
    assert (submitted.spec.gpus_per_replica, submitted.spec.replicas) == demand
    assert submitted.job_id == f"k8s-c1-ml-{kind.short}-{stored['metadata']['name']}"
    d.given(submitted)
    d.cycle(now=2.0)
    nodes = sorted(d.where(submitted.job_id))
    [admit] = reconcile(d.state, w.list(), "c1", now=3.0)[1]
    assert isinstance(admit, Admit) and admit.kind == workload["kind"] and list(admit.nodes) == nodes
    api.requests.clear()
    w.patch(kind, "ml", stored["metadata"]["name"], list(admit.ops))
    [request] = api.requests
    assert (request.method, request.path, request.content_type) == ("PATCH", api_path, JSON_PATCH)
    obj = api.get(workload["apiVersion"], workload["kind"], "ml", stored["metadata"]["name"])
    assert _at(obj, suspend) is False
    for t in templates:
        assert _at(obj, t)["affinity"] == pinned(nodes)
    assert reconcile(d.state, w.list(), "c1", now=4.0) == ([], [])

    # preempted: suspended, Chamber's affinity removed (the user had none)
    d.given(a_job("urgent", team="other", gpus=8, replicas=2, priority="critical", at=5, cluster="c1"))
    d.cycle(now=6.0)
    [suspend_action] = reconcile(d.state, w.list(), "c1", now=7.0)[1]
    assert isinstance(suspend_action, Suspend)
    w.patch(kind, "ml", stored["metadata"]["name"], list(suspend_action.ops))
    obj = api.get(workload["apiVersion"], workload["kind"], "ml", stored["metadata"]["name"])
    assert _at(obj, suspend) is True
    assert all("affinity" not in _at(obj, t) for t in templates)
    assert "chamber.io/user-affinity" not in obj["metadata"].get("annotations", {})

    obj["status"] = complete
    d.given(JobCompleted(job_id="urgent", at=8.0))
    d.cycle(now=9.0)
    events, _ = reconcile(d.state, w.list(), "c1", now=10.0)
    assert [type(e).__name__ for e, _ in events] == ["JobCompleted"]


def test_a_trainjob_is_placed_by_an_override_entry_that_suspension_removes(api: KubeStub) -> None:
    w = workloads(api)
    original = api.add(a_trainjob())
    d = Driver().given(*QUOTA, a_node("n1", cluster="c1"), a_node("n2", cluster="c1"))
    [(submitted, _)] = reconcile(d.state, w.list(), "c1", now=1.0)[0]
    assert (submitted.spec.gpus_per_replica, submitted.spec.replicas) == (8, 2)
    d.given(submitted)
    d.cycle(now=2.0)
    [admit] = reconcile(d.state, w.list(), "c1", now=3.0)[1]
    api.requests.clear()
    w.patch(KINDS[2], "ml", "tj", list(admit.ops))
    [request] = api.requests
    assert request.path == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/tj"
    assert request.body == [
        {
            "op": "add",
            "path": "/spec/podTemplateOverrides",
            "value": [
                *original["spec"]["podTemplateOverrides"],
                {"targetJobs": [{"name": "node"}], "spec": {"affinity": pinned(["n1", "n2"])}},
            ],
        },
        {"op": "add", "path": "/metadata/annotations", "value": {"chamber.io/placement-override": "1"}},
        {"op": "add", "path": "/spec/suspend", "value": False},
    ]
    d.given(a_job("urgent", team="other", gpus=8, replicas=2, priority="critical", at=5, cluster="c1"))
    d.cycle(now=6.0)
    [suspend] = reconcile(d.state, w.list(), "c1", now=7.0)[1]
    w.patch(KINDS[2], "ml", "tj", list(suspend.ops))
    obj = api.get("trainer.kubeflow.org/v1alpha1", "TrainJob", "ml", "tj")
    assert obj["spec"]["suspend"] is True
    assert obj["spec"]["podTemplateOverrides"] == original["spec"]["podTemplateOverrides"]  # the user's, as written


def test_a_gated_pod_gets_its_node_then_its_gate_lifted_and_is_never_preempted(api: KubeStub) -> None:
    w = workloads(api)
    pod = a_pod("p", gpus=2)
    pod["spec"]["schedulingGates"].insert(0, {"name": "example.com/other"})
    pod["spec"]["affinity"] = USER_AFFINITY
    api.add(pod)
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))  # not preemptible: within its guarantee
    [(submitted, _)] = reconcile(d.state, w.list(), "c1", now=1.0)[0]
    assert submitted.job_id == "k8s-c1-ml-pod-p" and submitted.spec.preemptible is False
    d.given(submitted)
    d.cycle(now=2.0)
    [admit] = reconcile(d.state, w.list(), "c1", now=3.0)[1]
    api.requests.clear()
    w.patch(KINDS[-1], "ml", "p", list(admit.ops))
    [placement] = d.state.jobs["k8s-c1-ml-pod-p"].placements  # the pod carries the GPUs chosen for it
    gpus = ",".join(map(str, placement.gpu_indices))
    uuids = ",".join(f"GPU-c1-n1-{i}" for i in placement.gpu_indices)  # as discovery reported them
    assert len(placement.gpu_indices) == 2
    assert api.requests == [
        Request(
            "PATCH",
            "/api/v1/namespaces/ml/pods/p",
            JSON_PATCH,
            [
                {"op": "add", "path": "/metadata/annotations", "value": {"chamber.io/gpus": gpus}},
                {"op": "add", "path": "/metadata/annotations/chamber.io~1gpu-uuids", "value": uuids},
                {"op": "add", "path": "/spec/affinity", "value": pinned(["n1"], USER_AFFINITY)},
                {"op": "test", "path": "/spec/schedulingGates/1", "value": {"name": "chamber.io/admission"}},
                {"op": "remove", "path": "/spec/schedulingGates/1"},
            ],
        )
    ]
    obj = api.get("v1", "Pod", "ml", "p")
    assert obj["spec"]["schedulingGates"] == [{"name": "example.com/other"}]  # only Chamber's gate lifted
    assert obj["metadata"]["annotations"] == {"chamber.io/gpus": gpus, "chamber.io/gpu-uuids": uuids}
    assert reconcile(d.state, w.list(), "c1", now=4.0) == ([], [])
    obj["status"] = {"phase": "Succeeded"}
    events, _ = reconcile(d.state, w.list(), "c1", now=5.0)
    assert [type(e).__name__ for e, _ in events] == ["JobCompleted"]


def test_a_kind_whose_crd_is_missing_is_skipped_once_and_never_listed(api: KubeStub) -> None:
    api.api_groups = [("kubeflow.org", "v1")]  # no JobSet, Trainer, Ray CRDs; MPIJob's v2beta1 absent too
    skipped: list[str] = []
    w = workloads(api, skipped)
    assert skipped == ["JobSet", "TrainJob", "MPIJob", "RayJob", "LeaderWorkerSet"]
    assert [k.kind for k in w.kinds] == ["Job", "PyTorchJob", "Pod", "Deployment", "StatefulSet"]
    api.requests.clear()
    w.list()
    assert sorted({r.path for r in api.requests}) == [
        "/api/v1/pods",
        "/apis/apps/v1/deployments",
        "/apis/apps/v1/statefulsets",
        "/apis/batch/v1/jobs",
        "/apis/kubeflow.org/v1/pytorchjobs",
    ]


def test_kueue_labels_name_the_team_through_the_namespace_binding_and_map_priorities(api: KubeStub) -> None:
    w = workloads(api)
    bindings = Bindings(
        namespaces={"ml": NamespaceBinding(teams=["vision"], queues={"main": "vision"})},
        priorities={"prod-critical": PriorityClass.CRITICAL},
    )
    api.add(
        a_batch_job(
            "kq", labels={"kueue.x-k8s.io/queue-name": "main", "kueue.x-k8s.io/priority-class": "prod-critical"}
        )
    )
    state = Driver().given(*QUOTA, a_quota("vision", 0, critical=True)).state  # vision may run critical work
    [(submitted, _)] = reconcile(state, w.list(), "c1", now=1.0, bindings=bindings)[0]
    assert (submitted.spec.team, submitted.spec.priority) == ("vision", PriorityClass.CRITICAL)


def test_critical_work_from_kubernetes_passes_the_same_critical_check_as_chamber_submit(api: KubeStub) -> None:
    """A workload asking for critical, from a team whose quota does not allow it, is refused with the
    message `chamber submit` (the scheduler's submit command, which the HTTP API forwards to) gives;
    once an operator allows it, the next round submits it."""
    from events.commands import SubmitJob
    from services.runtime.commands import CommandRefused
    from services.scheduler.service import validate_submit

    w = workloads(api)
    labels = {"chamber.io/team": "vision", "chamber.io/priority": "critical"}
    stored = api.add(a_batch_job("urgent", labels=labels))
    d = Driver().given(*QUOTA, a_node("n1", cluster="c1"))
    events, [refuse] = reconcile(d.state, w.list(), "c1", now=1.0)
    assert events == [] and isinstance(refuse, Refuse) and refuse.uid == stored["metadata"]["uid"]
    cli = SubmitJob(team="vision", gpus=1, priority=PriorityClass.CRITICAL)
    with pytest.raises((CommandRefused, InvalidName)) as by_cli:
        validate_submit(d.state, cli, 1.0, new_id=lambda name, team: "cli-job")
    assert "team vision may not run critical work in pool default" in str(by_cli.value)
    assert refuse.reason == f"Chamber refuses this workload as it would the same `chamber submit`: {by_cli.value}"
    assert getattr(by_cli.value, "field", None) == "priority"
    d.cycle(now=2.0)
    assert api.get("batch/v1", "Job", "ml", "urgent")["spec"]["suspend"] is True  # held, never admitted
    d.given(a_quota("vision", 0, critical=True))
    [(submitted, _)], actions = reconcile(d.state, w.list(), "c1", now=3.0)
    assert actions == [] and submitted.spec.priority == PriorityClass.CRITICAL


def test_a_namespace_charging_a_team_it_is_not_bound_to_is_never_admitted_and_told_why(api: KubeStub) -> None:
    w = workloads(api)
    bindings = Bindings(namespaces={"ml": NamespaceBinding(teams=["vision"])})
    stored = api.add(a_batch_job("steal", labels={"chamber.io/team": "research"}))
    d = Driver().given(*QUOTA, a_node("n1", cluster="c1"))
    events, actions = reconcile(d.state, w.list(), "c1", now=1.0, bindings=bindings)
    assert events == []
    [refuse] = actions
    assert isinstance(refuse, Refuse) and refuse.uid == stored["metadata"]["uid"]
    assert "may not charge team 'research'" in refuse.reason and "vision" in refuse.reason
    api.requests.clear()
    w.event(KINDS[0], refuse.namespace, refuse.name, refuse.uid, "ChamberRefused", refuse.reason, now=1_700_000_000.0)
    [request] = api.requests
    assert (request.method, request.path) == ("POST", "/api/v1/namespaces/ml/events")
    [event] = api.events
    assert event["involvedObject"] == {
        "apiVersion": "batch/v1", "kind": "Job", "name": "steal", "namespace": "ml", "uid": stored["metadata"]["uid"]
    }  # fmt: skip
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "ChamberRefused", refuse.reason)
    stamp = datetime.fromisoformat(event["firstTimestamp"].replace("Z", "+00:00"))
    assert stamp == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    d.cycle(now=2.0)
    assert "k8s-c1-ml-steal" not in d.state.jobs
    assert api.get("batch/v1", "Job", "ml", "steal")["spec"]["suspend"] is True  # still held


def test_a_workload_passes_the_same_door_as_chamber_submit(api: KubeStub) -> None:
    """A team without a quota is refused as `chamber submit` refuses it, with the fix in the Event; once an
    operator sets the quota, the next round submits the same workload."""
    w = workloads(api)
    stored = api.add(a_batch_job("train", labels={"chamber.io/team": "Research"}))  # label case is folded
    d = Driver().given(*QUOTA, a_node("n1", cluster="c1"))
    events, [refuse] = reconcile(d.state, w.list(), "c1", now=1.0)
    assert events == [] and isinstance(refuse, Refuse) and refuse.uid == stored["metadata"]["uid"]
    assert "team 'research' has no quota" in refuse.reason and "chamber quota set research" in refuse.reason
    d.given(a_quota("research", 0))
    [(submitted, _)], actions = reconcile(d.state, w.list(), "c1", now=2.0)
    assert actions == [] and (submitted.job_id, submitted.spec.team, submitted.spec.namespace) == (
        "k8s-c1-ml-train",
        "research",
        "ml",
    )


def test_a_job_id_from_a_long_namespace_and_name_stays_within_the_name_limit(api: KubeStub) -> None:
    w = workloads(api)
    long_ns, long_name = "n" * 63, "j" * 253  # Kubernetes' own limits
    api.add(a_batch_job(long_name, namespace=long_ns))
    api.add(a_batch_job(long_name[:-1] + "k", namespace=long_ns))
    d = Driver().given(*QUOTA, a_node("n1", cluster="c1"))
    events, actions = reconcile(d.state, w.list(), "c1", now=1.0)
    assert actions == []
    ids = [e.job_id for e, _ in events]  # type: ignore[attr-defined]
    assert len(ids) == 2 and len(set(ids)) == 2 and all(len(i) == 253 for i in ids)  # distinct, and valid Names
    for event, _ in events:
        d.given(event)
    d.cycle(now=2.0)
    assert reconcile(d.state, w.list(), "c1", now=3.0)[0] == []  # known now: not submitted twice


# -- serving workloads: scaled, replica by replica, under the same quotas --------------------------------


def a_replicaset_round(api: KubeStub, deployment: str) -> None:
    """What the Deployment's ReplicaSet does: make gated pods up to spec.replicas, or delete the surplus,
    pods not yet scheduled (gated) first, then the lowest `controller.kubernetes.io/pod-deletion-cost`."""
    dep = api.get("apps/v1", "Deployment", "ml", deployment)
    pods = [o for (a, p, _, _), o in sorted(api.objects.items()) if a == "/api/v1" and p == "pods"]

    def deletion_order(pod: dict[str, Any]) -> tuple[bool, int, str]:
        cost = int((pod["metadata"].get("annotations") or {}).get("controller.kubernetes.io/pod-deletion-cost", 0))
        return (not pod["spec"].get("schedulingGates"), cost, pod["metadata"]["name"])

    for pod in sorted(pods, key=deletion_order)[: max(0, len(pods) - dep["spec"]["replicas"])]:
        del api.objects[("/api/v1", "pods", "ml", pod["metadata"]["name"])]
    names = {p["metadata"]["name"] for p in pods}
    made = (f"{deployment}-abc12-{i}" for i in range(100) if f"{deployment}-abc12-{i}" not in names)
    for _ in range(dep["spec"]["replicas"] - len(pods)):
        api.add(a_replica_pod(dep, next(made)))


def serving_round(api: KubeStub, w: KubernetesWorkloads, d: Driver, now: float) -> list[Any]:
    """One actuator round for serving workloads: list, reconcile, record, act (as actuator.py does)."""
    _, serving = split(w.list())
    events, actions = reconcile_serving(d.state, serving, "c1", now)
    d.given(*(e for e, _ in events))
    for action in actions:
        if isinstance(action, DeletePod):
            w.delete_pod(action.namespace, action.name)
        elif isinstance(action, Admit):
            w.patch(kind_of("v1", "Pod"), action.namespace, action.name, list(action.ops))  # type: ignore[arg-type]
    return [e for e, _ in events]


def test_a_deployment_scales_up_down_and_to_zero_replica_by_replica_through_the_api_server(api: KubeStub) -> None:
    w = workloads(api)
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    api.add(a_deployment("llm", replicas=1, gpus=2, min_replicas=1))
    a_replicaset_round(api, "llm")
    [r0] = serving_round(api, w, d, now=1.0)
    assert isinstance(r0, JobSubmitted) and (r0.spec.priority, r0.spec.preemptible) == ("serving", False)
    d.cycle(now=2.0)
    api.requests.clear()
    serving_round(api, w, d, now=3.0)
    pod = "/api/v1/namespaces/ml/pods/llm-abc12-0"
    gate = "/spec/schedulingGates/0"
    assert api.writes() == [
        Request(
            "PATCH",
            pod,
            JSON_PATCH,
            [
                {"op": "add", "path": "/metadata/annotations", "value": {"chamber.io/replica": "0"}},
                {
                    "op": "add",
                    "path": "/metadata/annotations/controller.kubernetes.io~1pod-deletion-cost",
                    "value": "0",
                },
                {"op": "add", "path": "/spec/affinity", "value": pinned(["n1"])},
                {"op": "test", "path": gate, "value": {"name": "chamber.io/admission"}},
                {"op": "remove", "path": gate},
            ],
        )
    ]
    first = api.get("v1", "Pod", "ml", "llm-abc12-0")["metadata"]["resourceVersion"]

    # an HPA scales to 3: two replicas more are submitted and their pods released; the first is not touched
    api.get("apps/v1", "Deployment", "ml", "llm")["spec"]["replicas"] = 3
    a_replicaset_round(api, "llm")
    up = serving_round(api, w, d, now=4.0)
    assert [(e.job_id, e.spec.preemptible) for e in up if isinstance(e, JobSubmitted)] == [
        ("k8s-c1-ml-deployment-llm-r1", True),
        ("k8s-c1-ml-deployment-llm-r2", True),
    ]
    d.cycle(now=5.0)
    api.requests.clear()
    serving_round(api, w, d, now=6.0)
    assert [(r.method, r.path) for r in api.writes()] == [
        ("PATCH", "/api/v1/namespaces/ml/pods/llm-abc12-1"),
        ("PATCH", "/api/v1/namespaces/ml/pods/llm-abc12-2"),
    ]
    assert api.get("v1", "Pod", "ml", "llm-abc12-0")["metadata"]["resourceVersion"] == first
    assert d.state.usage[("default", "vision")] == 6

    # down to 2: the ReplicaSet deletes the highest replica's pod (its deletion cost), Chamber cancels that replica
    api.get("apps/v1", "Deployment", "ml", "llm")["spec"]["replicas"] = 2
    a_replicaset_round(api, "llm")
    assert sorted(n for (_, p, _, n) in api.objects if p == "pods") == ["llm-abc12-0", "llm-abc12-1"]
    api.requests.clear()
    down = serving_round(api, w, d, now=7.0)
    assert [(type(e).__name__, e.job_id) for e in down] == [("JobCancelled", "k8s-c1-ml-deployment-llm-r2")]
    assert api.writes() == [] and d.state.usage[("default", "vision")] == 4

    # to zero: every replica goes in the same round, and the quota with it
    d.given(a_job("train", team="vision", gpus=8, at=8.0, cluster="c1"))
    d.cycle(now=8.5)
    assert d.state_of("train") == "pending"
    api.get("apps/v1", "Deployment", "ml", "llm")["spec"]["replicas"] = 0
    a_replicaset_round(api, "llm")
    zero = serving_round(api, w, d, now=9.0)
    assert sorted(e.job_id for e in zero) == ["k8s-c1-ml-deployment-llm-r0", "k8s-c1-ml-deployment-llm-r1"]
    assert d.state.usage.get(("default", "vision"), 0) == 0
    d.cycle(now=10.0)
    assert d.state_of("train") == "running"


def test_a_statefulsets_borrowed_replica_reclaimed_by_its_lender_has_its_pod_deleted(api: KubeStub) -> None:
    w = workloads(api)
    d = Driver().given(a_quota("vision", 2), a_quota("nlp", 6), a_node("n1", cluster="c1"))
    sts = api.add(a_statefulset("kv", replicas=2, gpus=2))
    for ordinal in (0, 1):
        api.add(a_replica_pod(sts, f"kv-{ordinal}"))
    submitted = serving_round(api, w, d, now=1.0)
    assert [(e.job_id, e.spec.preemptible) for e in submitted if isinstance(e, JobSubmitted)] == [
        ("k8s-c1-ml-statefulset-kv-r0", False),
        ("k8s-c1-ml-statefulset-kv-r1", True),  # beyond the minimum of 1: borrows nlp's idle GPUs
    ]
    d.cycle(now=2.0)
    api.requests.clear()
    serving_round(api, w, d, now=3.0)
    gate = "/spec/schedulingGates/0"
    assert [(r.method, r.path, [op["path"] for op in r.body]) for r in api.writes()] == [
        ("PATCH", f"/api/v1/namespaces/ml/pods/kv-{i}", ["/spec/affinity", gate, gate]) for i in (0, 1)
    ]
    d.given(a_job("nlp-train", team="nlp", gpus=6, priority="high", at=4.0, cluster="c1"))
    d.cycle(now=5.0)
    api.requests.clear()
    serving_round(api, w, d, now=6.0)
    assert [(r.method, r.path) for r in api.writes()] == [("DELETE", "/api/v1/namespaces/ml/pods/kv-1")]
    api.add(a_replica_pod(sts, "kv-1"))  # the StatefulSet makes it again, gated by the webhook
    api.requests.clear()
    assert serving_round(api, w, d, now=7.0) == [] and api.writes() == []  # it waits for replica 1's admission
    assert (d.state_of("k8s-c1-ml-statefulset-kv-r0"), d.state_of("k8s-c1-ml-statefulset-kv-r1")) == (
        "running",
        "suspended",
    )


def test_pods_asking_through_claim_templates_have_their_namespaces_templates_listed_and_read(api: KubeStub) -> None:
    api.api_groups = [*CRDS, ("resource.k8s.io", "v1")]
    selector = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    request = {
        "name": "mig",
        "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression": selector}}]},
    }
    api.add(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-mig", "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        }
    )
    pod = a_pod("p", gpus=0)
    pod["spec"]["resourceClaims"] = [{"name": "mig", "resourceClaimTemplateName": "one-mig"}]
    api.add(pod)
    plain = a_pod("q", gpus=1)
    plain["metadata"]["namespace"] = "other"
    api.add(plain)
    w = workloads(api)
    listed = w.list()
    api.requests.clear()
    templates = w.claim_templates(listed)
    assert [(r.method, r.path) for r in api.requests] == [
        ("GET", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates")  # not "other": no pod names one
    ]
    assert list(templates) == ["ml"] and list(templates["ml"]) == ["one-mig"]
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    submitted = {e.job_id: e for e, _ in reconcile(d.state, listed, "c1", now=1.0, templates=templates)[0]}
    share = submitted["k8s-c1-ml-pod-p"].spec.share
    assert share is not None and share.mig_profile == "1g.10gb"
    # without the templates the pod is not known to ask for a GPU at all
    assert "k8s-c1-ml-pod-p" not in {e.job_id for e, _ in reconcile(d.state, listed, "c1", now=1.0)[0]}
