"""The webhook's decisions on AdmissionReviews: hold on create, refuse with the fix, never crash."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from services.kube.bindings import Bindings, NamespaceBinding
from services.webhook.core import BadReview, mutate, parse, validate
from tests.kube_workloads import a_batch_job, a_pod, a_rayjob

BOUND = Bindings(namespaces={"ml": NamespaceBinding(teams=["vision"])})


def review(obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None) -> bytes:
    group, _, version = obj["apiVersion"].rpartition("/")
    request = {
        "uid": "u1",
        "kind": {"group": group, "version": version, "kind": obj["kind"]},
        "namespace": obj["metadata"]["namespace"],
        "operation": operation,
        "object": obj,
        "oldObject": old,
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    response = answer["response"]
    return json.loads(base64.b64decode(response["patch"])) if "patch" in response else []


@pytest.mark.parametrize(
    "body,message",
    [
        (b"\xff", "not JSON"),
        (b"[]", "expected an AdmissionReview"),
        (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1", "request": {}}', "configure"),
        (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "x"}}', "request.kind"),
        (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "x", "kind": '
         b'{"kind": "Job"}, "operation": "CREATE"}}', "request.object is missing"),
    ],
)  # fmt: skip
def test_a_body_that_is_not_an_admission_review_is_refused_with_the_reason(body: bytes, message: str) -> None:
    with pytest.raises(BadReview, match=message):
        parse(body)


def test_an_upper_case_team_is_folded_and_the_pod_gated() -> None:
    pod = a_pod(gated=False, labels={"chamber.io/team": "Vision"})
    assert patch_of(mutate(parse(review(pod)))) == [
        {"op": "replace", "path": "/metadata/labels/chamber.io~1team", "value": "vision"},
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "chamber.io/admission"}]},
    ]


def test_children_of_managed_workloads_and_unlabeled_objects_pass_untouched() -> None:
    pod = a_pod(gated=False)
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "train", "apiVersion": "batch/v1", "uid": "u"}]
    assert mutate(parse(review(pod)))["response"] == {"uid": "u1", "allowed": True}
    assert validate(parse(review(a_batch_job(labels={}, suspend=None))), BOUND)["response"]["allowed"] is True


def test_a_malformed_workload_is_refused_not_crashed_on() -> None:
    job = a_batch_job(suspend=None)
    job["spec"]["template"]["spec"]["containers"] = [{"name": "x", "resources": {"limits": {"nvidia.com/gpu": []}}}]
    assert mutate(parse(review(job)))["response"]["allowed"] is True
    answer = validate(parse(review(job)), BOUND)["response"]
    assert answer["allowed"] is False and "must be a whole number of GPUs" in answer["status"]["message"]
    job["spec"]["parallelism"] = "two"
    assert (
        "spec.parallelism must be a whole number"
        in validate(parse(review(job)), BOUND)["response"]["status"]["message"]
    )


def test_a_workload_without_gpus_that_names_a_team_is_refused() -> None:
    answer = validate(parse(review(a_batch_job(gpus=0))), BOUND)["response"]
    assert answer["allowed"] is False and "asks for no nvidia.com/gpu" in answer["status"]["message"]


def test_updates_are_checked_only_when_the_team_or_priority_labels_change() -> None:
    # created before the namespace lost its binding: Chamber's own suspend patch must still go through
    old = a_batch_job(labels={"chamber.io/team": "research"})
    new = a_batch_job(labels={"chamber.io/team": "research"}, suspend=False)
    assert validate(parse(review(new, "UPDATE", old)), BOUND)["response"]["allowed"] is True
    relabeled = a_batch_job(labels={"chamber.io/team": "research"})
    answer = validate(parse(review(relabeled, "UPDATE", a_batch_job())), BOUND)["response"]
    assert answer["allowed"] is False and "may not charge team 'research'" in answer["status"]["message"]


def test_a_rayjob_that_kuberay_would_not_suspend_is_refused_with_the_fix() -> None:
    ray = a_rayjob()
    ray["spec"]["shutdownAfterJobFinishes"] = False
    answer = validate(parse(review(ray)), BOUND)["response"]
    assert answer["allowed"] is False and "spec.shutdownAfterJobFinishes: true" in answer["status"]["message"]
    assert validate(parse(review(a_rayjob())), BOUND)["response"]["allowed"] is True
