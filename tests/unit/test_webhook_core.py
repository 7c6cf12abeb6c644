"""The webhook's decisions on AdmissionReviews: hold on create, refuse with the fix, never crash."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from services.kube.bindings import Bindings, NamespaceBinding
from services.webhook.core import BadReview, mutate, parse, validate
from tests.kube_workloads import a_batch_job, a_jobset, a_pod, a_pytorchjob, a_rayjob, a_trainjob, an_mpijob

BOUND = Bindings(namespaces={"ml": NamespaceBinding(teams=["vision"])})


def review(
    obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None, like: Any = None
) -> bytes:
    """The AdmissionReview the API server sends for `obj`; its kind and namespace from `like` if given."""
    like = like or obj
    group, _, version = like["apiVersion"].rpartition("/")
    request = {
        "uid": "u1",
        "kind": {"group": group, "version": version, "kind": like["kind"]},
        "namespace": like["metadata"]["namespace"],
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
        (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "x", "kind": '
         b'{"kind": "Job"}, "operation": "CREATE", "object": {"metadata": []}}}', "request.object.metadata is not"),
        (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "x", "kind": '
         b'{"kind": "Job"}, "operation": "UPDATE", "object": {}, "oldObject": {"metadata": "x"}}}',
         "request.oldObject.metadata is not"),
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


@pytest.mark.parametrize("team", ["vision_ml", "vision.ml", "-vision", "v" * 64])
def test_a_team_label_kubernetes_allows_but_team_names_do_not_is_refused_not_mapped(team: str) -> None:
    answer = validate(parse(review(a_batch_job(labels={"chamber.io/team": team}))), BOUND)["response"]
    assert answer["allowed"] is False and "is not a team name" in answer["status"]["message"]
    assert "lower-case letters, digits and '-'" in answer["status"]["message"]


def test_an_unknown_kind_is_refused_naming_the_kinds_chamber_manages() -> None:
    cron = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c", "namespace": "ml",
            "labels": {"chamber.io/team": "vision"}}, "spec": {}}  # fmt: skip
    answer = validate(parse(review(cron)), BOUND)["response"]
    assert answer["allowed"] is False and "does not manage CronJob objects" in answer["status"]["message"]
    assert "Job (batch/v1)" in answer["status"]["message"] and "RayJob" in answer["status"]["message"]
    assert mutate(parse(review(cron)))["response"] == {"uid": "u1", "allowed": True}  # nothing to hold


@pytest.mark.parametrize("parallelism,message", [(100_000, "outside 0..10000"), (-1, "outside 0..10000")])
def test_absurd_replica_counts_are_refused_with_the_field(parallelism: int, message: str) -> None:
    answer = validate(parse(review(a_batch_job(parallelism=parallelism))), BOUND)["response"]
    assert answer["allowed"] is False and "spec.parallelism" in answer["status"]["message"]
    assert message in answer["status"]["message"]


def _paths(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    children = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in children:
        yield from _paths(value, (*path, key))


def _replaced(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(obj)
    at = out
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return out


def test_no_field_of_any_kind_set_to_a_wrong_value_makes_the_webhook_raise() -> None:
    """Every field of every managed kind, replaced by a value of another type or out of range: the answer
    is a decision (allowed, or refused with a message) or BadReview (a 400), never an exception, which
    the service could only turn into a failed review."""
    wrong: list[Any] = [None, [], {}, "x", -1, 1.5, True, "99999999999999999999", {"a": 1}]
    for base in (a_batch_job(suspend=None), a_pod(gated=False), a_jobset(), a_rayjob(), a_trainjob(),
                 a_pytorchjob(), an_mpijob()):  # fmt: skip
        for path in list(_paths(base))[1:]:
            for value in wrong:
                obj = _replaced(base, path, value)
                for operation, old in (("CREATE", None), ("UPDATE", base)):
                    try:
                        req = parse(review(obj, operation, old, like=base))
                    except BadReview:
                        continue
                    for answer in (mutate(req), validate(req, BOUND)):
                        response = answer["response"]
                        assert response["allowed"] or "Chamber: " in response["status"]["message"], (path, value)
