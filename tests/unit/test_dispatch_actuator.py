"""A cluster's dispatch actuator, the pure part (services/dispatch/actuator.py `plan`): the copy it
creates (same spec, held, labelled with its origin and generation), stale copies deleted before
anything is created, a fenced actuator deleting every copy, origins kept suspended with the copy's
phase mirrored, and a deleted origin withdrawn."""

from __future__ import annotations

import json
from typing import Any

from events.dispatch import (
    CopyPhase,
    CopyRecalled,
    CopyReported,
    WorkloadDispatched,
    WorkloadOffered,
    WorkloadWithdrawn,
)
from services.dispatch.actuator import (
    GENERATION_LABEL,
    ORIGIN_LABEL,
    STATUS_ANNOTATION,
    WORKLOAD_LABEL,
    ActuatorState,
    Create,
    Delete,
    Patch,
    Refuse,
    copy_body,
    evolve,
    load,
    multi_cluster,
    offer_of,
    plan,
    released,
)
from services.kube.kinds import BatchJob, Observed, Pod
from services.kube.serving import Deployment
from tests.kube_workloads import a_batch_job, a_deployment, a_pod

JOB = BatchJob()


def origin(*, suspend: bool = True, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = a_batch_job("train", gpus=4, parallelism=2, suspend=suspend)
    obj["metadata"]["uid"] = "uid-1"
    obj["metadata"]["annotations"] = {"chamber.io/clusters": "b, a"}
    if status is not None:
        obj["metadata"]["annotations"][STATUS_ANNOTATION] = json.dumps(status, sort_keys=True, separators=(",", ":"))
    return obj


def the_offer() -> WorkloadOffered:
    offer = offer_of(Observed(JOB, origin()), "a", 1.0)
    assert isinstance(offer, WorkloadOffered)
    return offer


def state(cluster: str, *events: Any) -> ActuatorState:
    s = ActuatorState(cluster)
    for e in events:
        evolve(s, e)
    return s


def a_copy(generation: int, *, suspend: bool = True, done: str | None = None) -> Observed:
    body = copy_body(the_offer(), "b", generation)
    body["metadata"]["uid"] = f"copy-{generation}"
    body["spec"]["suspend"] = suspend
    if done:
        body["status"] = {"conditions": [{"type": done, "status": "True"}]}
    return Observed(JOB, body)


def dispatched(cluster: str, generation: int) -> WorkloadDispatched:
    return WorkloadDispatched(workload="k8s-a-ml-train", cluster=cluster, generation=generation, at=2.0)


def test_an_origin_is_offered_with_its_allow_list_and_what_to_copy() -> None:
    offer = the_offer()
    assert (offer.workload, offer.origin, offer.team, offer.gpus, offer.clusters) == (
        "k8s-a-ml-train",
        "a",
        "vision",
        8,
        ("b", "a"),
    )
    events, actions = plan(state("a"), [Observed(JOB, origin())], 1.0)
    assert [e for e, _ in events] == [offer] and actions == []  # no status before it is offered


def test_the_copy_keeps_the_spec_held_and_names_its_origin_and_generation() -> None:
    s = state("b", the_offer(), dispatched("b", 1))
    events, actions = plan(s, [], 3.0)
    [create] = actions
    assert isinstance(create, Create) and (create.namespace, create.name) == ("ml", "train")
    body = create.body
    assert body["spec"] == origin()["spec"] and body["spec"]["suspend"] is True
    labels = body["metadata"]["labels"]
    assert labels[WORKLOAD_LABEL] == "k8s-a-ml-train" and labels[GENERATION_LABEL] == "1"
    assert labels[ORIGIN_LABEL] == "a" and labels["chamber.io/team"] == "vision"
    assert not multi_cluster(body)  # the copy is an ordinary held workload where it lands
    assert [(e.phase, e.generation) for e, _ in events] == [(CopyPhase.CREATED, 1)]
    # another cluster creates nothing
    assert plan(state("c", the_offer(), dispatched("b", 1)), [], 3.0) == ([], [])


def test_a_fenced_copy_is_deleted_before_anything_is_created() -> None:
    recalled = CopyRecalled(workload="k8s-a-ml-train", cluster="b", generation=1, at=5.0, reason="cluster b lost")
    s = state("b", the_offer(), dispatched("b", 1), recalled, dispatched("b", 3))
    _, actions = plan(s, [a_copy(1, suspend=False)], 6.0)
    assert [type(a) for a in actions] == [Delete, Create]
    assert (actions[0].name, actions[1].body["metadata"]["labels"][GENERATION_LABEL]) == ("train", "3")


def test_a_fenced_actuator_deletes_every_copy_and_creates_none() -> None:
    s = state("b", the_offer(), dispatched("b", 1))
    events, actions = plan(s, [a_copy(1, suspend=False)], 6.0, fenced=True)
    assert events == [] and [type(a) for a in actions] == [Delete]


def test_a_copys_phase_is_reported_on_each_change_only() -> None:
    s = state("b", the_offer(), dispatched("b", 1))
    created = CopyReported(workload="k8s-a-ml-train", cluster="b", generation=1, phase=CopyPhase.CREATED, at=3.0)
    evolve(s, created)
    assert plan(s, [a_copy(1)], 4.0) == ([], [])
    [(running, _)], _ = plan(s, [a_copy(1, suspend=False)], 4.0)
    assert running.phase == CopyPhase.RUNNING
    evolve(s, running)
    [(suspended, _)], _ = plan(s, [a_copy(1)], 5.0)
    assert suspended.phase == CopyPhase.SUSPENDED  # held again after running: preempted there
    [(complete, _)], _ = plan(s, [a_copy(1, suspend=False, done="Complete")], 5.0)
    assert complete.phase == CopyPhase.COMPLETE
    [(gone, _)], _ = plan(s, [], 5.0)
    assert gone.phase == CopyPhase.GONE


def test_the_origin_stays_suspended_and_shows_where_its_copy_runs() -> None:
    report = CopyReported(workload="k8s-a-ml-train", cluster="b", generation=1, phase=CopyPhase.RUNNING, at=3.0)
    s = state("a", the_offer(), dispatched("b", 1), report)
    _, [patch] = plan(s, [Observed(JOB, origin(suspend=False))], 4.0)
    assert isinstance(patch, Patch)
    ops = {op["path"]: op["value"] for op in patch.ops}
    assert ops["/spec/suspend"] is True
    mirrored = {"cluster": "b", "generation": 1, "phase": "running"}
    assert json.loads(ops[f"/metadata/annotations/{STATUS_ANNOTATION.replace('/', '~1')}"]) == mirrored
    assert plan(s, [Observed(JOB, origin(status=mirrored))], 5.0) == ([], [])  # converged


def test_an_origin_deleted_by_its_user_is_withdrawn() -> None:
    s = state("a", the_offer(), dispatched("b", 1))
    [(withdrawn, _)], actions = plan(s, [], 4.0)
    assert withdrawn == WorkloadWithdrawn(workload="k8s-a-ml-train", origin="a", at=4.0) and actions == []


def test_a_copy_may_be_created_released_for_kubernetes_to_place() -> None:
    s = state("b", the_offer(), dispatched("b", 1))
    _, [create] = plan(s, [], 3.0, release=True)
    assert isinstance(create, Create) and create.body["spec"]["suspend"] is False
    assert create.body["spec"]["template"] == origin()["spec"]["template"]


def test_a_released_pod_loses_chambers_gate_and_keeps_any_other() -> None:
    pod = a_pod()
    pod["spec"]["schedulingGates"].append({"name": "example.com/other"})
    assert released(Pod(), pod)["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    assert "schedulingGates" not in released(Pod(), a_pod())["spec"]


def test_the_schedulers_own_actuator_leaves_a_multi_cluster_origin_alone() -> None:
    from services.scheduler.kubernetes import reconcile
    from tests.scheduler_builders import Driver, a_quota

    d = Driver().given(a_quota("vision", 16))
    plain = a_batch_job("plain")
    plain["metadata"]["uid"] = "uid-2"
    events, actions = reconcile(d.state, [origin(), plain], "a", now=1.0)
    assert [e.job_id for e, _ in events] == ["k8s-a-ml-plain"] and actions == []  # type: ignore[attr-defined]


def test_an_origin_that_cannot_be_dispatched_as_written_is_refused_with_the_fix() -> None:
    bad = origin()
    bad["metadata"]["annotations"]["chamber.io/clusters"] = " , "
    events, [refuse] = plan(state("a"), [Observed(JOB, bad)], 1.0)
    assert events == [] and isinstance(refuse, Refuse) and refuse.uid == "uid-1"
    assert "names no cluster" in refuse.reason


def test_a_serving_workload_that_names_clusters_is_refused_and_left_untouched() -> None:
    deployment = a_deployment("chat", replicas=2, gpus=1)
    deployment["metadata"]["uid"] = "uid-d"
    deployment["metadata"].setdefault("annotations", {})["chamber.io/clusters"] = "b"
    events, actions = plan(state("a"), [Observed(Deployment(), deployment)], 1.0)
    assert events == []  # never offered: a copy of it could not be made
    [refuse] = actions  # and no patch (the actuator may not patch Deployments)
    assert (
        isinstance(refuse, Refuse) and refuse.uid == "uid-d" and "runs in the cluster it is created in" in refuse.reason
    )


def test_the_heartbeat_load_counts_the_clusters_own_workloads_not_copies_or_origins() -> None:
    running = a_batch_job("local-running", gpus=4, parallelism=2, suspend=False)
    waiting = a_batch_job("local-waiting", gpus=2, parallelism=1)
    done = a_batch_job("local-done", gpus=8, parallelism=1, suspend=False)
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    listed = [Observed(JOB, o) for o in (running, waiting, done, origin())] + [a_copy(1, suspend=False)]
    assert load(listed) == (8, 2)


def test_a_finished_copy_stays_a_little_for_its_clusters_admission_to_see_it_finish() -> None:
    recalled = CopyRecalled(
        workload="k8s-a-ml-train", cluster="b", generation=1, at=10.0, reason="complete", final=True
    )
    s = state("b", the_offer(), dispatched("b", 1), recalled)
    finished = a_copy(1, suspend=False, done="Complete")
    assert plan(s, [finished], 12.0, keep_finished_s=5.0) == ([], [])
    _, [delete] = plan(s, [finished], 15.0, keep_finished_s=5.0)
    assert isinstance(delete, Delete)
    _, [delete] = plan(s, [a_copy(1, suspend=False)], 12.0, keep_finished_s=5.0)  # not finished: at once
    assert isinstance(delete, Delete)
