"""Serving workloads under the same quotas, as scenarios on the pure core: a Deployment's replicas up to
its minimum are guaranteed (they preempt training by class and are never preempted), the rest borrow
like any other work, scaling submits or cancels only the difference, and scale to zero returns the
quota in the same round (services/scheduler/serving.py)."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from events import Event, JobCancelled, JobSubmitted, PriorityClass
from events.commands import SubmitJob
from events.idle import IdleModeName, JobIdleDetected
from events.names import InvalidName
from services.kube.kinds import Observed, Pod
from services.kube.serving import SERVING_KINDS, LeaderWorkerSet
from services.scheduler.core.door import admit
from services.scheduler.serving import DeletePod, Workload, reconcile_serving, split
from tests.kube_workloads import a_deployment, a_leaderworkerset, a_replica_pod
from tests.scheduler_builders import Driver, a_job, a_node, a_quota

DEPLOYMENT = SERVING_KINDS[0]
R = "k8s-c1-ml-deployment-llm-r"  # a replica's job id, less its ordinal


def scaled(d: Driver, obj: dict[str, Any], replicas: int, now: float, pods: tuple[dict[str, Any], ...] = ()) -> list:
    """Set spec.replicas (as an HPA does), reconcile, fold what it recorded; the actions it asked for."""
    obj["spec"]["replicas"] = replicas
    events, actions = reconcile_serving(d.state, [Workload(DEPLOYMENT, obj, pods)], "c1", now)
    d.given(*(e for e, _ in events))
    return actions


def as_released(pod: dict[str, Any], replica: int) -> dict[str, Any]:
    """The pod once Chamber released it for `replica` (annotated, its gate gone)."""
    annotations = {"chamber.io/replica": str(replica)}
    return {**pod, "metadata": {**pod["metadata"], "annotations": annotations}, "spec": {"containers": []}}


def recorded(d: Driver, since: int) -> list[Event]:
    return d.log[since:]


def a_deployment_of(replicas: int, minimum: int, gpus: int = 2) -> dict[str, Any]:
    obj = a_deployment(replicas=replicas, gpus=gpus, min_replicas=minimum)
    obj["metadata"]["uid"] = "u1"
    return obj


def test_replicas_up_to_the_minimum_are_guaranteed_and_the_rest_borrow_as_preemptible() -> None:
    d = Driver().given(a_quota("vision", 4), a_node("n1", cluster="c1"))
    dep = a_deployment_of(3, minimum=2)
    scaled(d, dep, 3, now=1.0)
    submitted = [e for e in d.log if isinstance(e, JobSubmitted)]
    assert [(e.job_id, e.spec.priority, e.spec.preemptible) for e in submitted] == [
        (f"{R}0", PriorityClass.SERVING, False),
        (f"{R}1", PriorityClass.SERVING, False),
        (f"{R}2", PriorityClass.SERVING, True),
    ]
    assert [(e.spec.serving.workload, e.spec.serving.replica) for e in submitted if e.spec.serving] == [
        ("deployment/llm", 0),
        ("deployment/llm", 1),
        ("deployment/llm", 2),
    ]
    d.cycle(now=2.0)
    assert [d.state_of(f"{R}{i}") for i in range(3)] == ["running"] * 3
    assert d.state.jobs[f"{R}2"].borrowed_gpus == 2  # beyond the team's guarantee of 4


def test_guaranteed_replicas_preempt_lower_class_training_of_the_team_and_are_never_preempted() -> None:
    d = Driver().given(a_quota("vision", 8), a_quota("other", 0, critical=True), a_node("n1", cluster="c1"))
    d.given(a_job("train", team="vision", gpus=8, priority="normal", cluster="c1"))
    d.cycle(now=2.0)
    dep = a_deployment_of(1, minimum=1, gpus=4)
    scaled(d, dep, 1, now=3.0)
    d.cycle(now=4.0)
    assert (d.state_of("train"), d.state_of(f"{R}0")) == ("suspended", "running")
    # critical work of another team finds no victim in the guaranteed replica
    d.given(a_job("urgent", team="other", gpus=8, priority="critical", at=5.0, cluster="c1"))
    d.cycle(now=6.0)
    assert (d.state_of(f"{R}0"), d.state_of("urgent")) == ("running", "pending")


def test_borrowed_replicas_are_reclaimed_by_the_lender_but_never_below_the_minimum() -> None:
    d = Driver().given(a_quota("vision", 4), a_quota("nlp", 4), a_node("n1", cluster="c1"))
    dep = a_deployment_of(4, minimum=2)
    scaled(d, dep, 4, now=1.0)
    d.cycle(now=2.0)
    assert [d.state_of(f"{R}{i}") for i in range(4)] == ["running"] * 4
    d.given(a_job("nlp-train", team="nlp", gpus=4, priority="high", at=3.0, cluster="c1"))
    d.cycle(now=4.0)
    assert [d.state_of(f"{R}{i}") for i in range(4)] == ["running", "running", "suspended", "suspended"]
    assert d.state_of("nlp-train") == "running"


def test_scaling_up_and_down_moves_only_the_difference_and_never_restarts_running_replicas() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    dep = a_deployment_of(1, minimum=1)
    scaled(d, dep, 1, now=1.0)
    d.cycle(now=2.0)
    first = copy.deepcopy((d.state.jobs[f"{R}0"].placements, d.state.jobs[f"{R}0"].generation))
    mark = len(d.log)
    scaled(d, dep, 3, now=3.0)
    assert [e.job_id for e in recorded(d, mark)] == [f"{R}1", f"{R}2"]
    d.cycle(now=4.0)
    mark = len(d.log)
    scaled(d, dep, 2, now=5.0)  # the highest replica goes
    assert [(type(e), e.job_id) for e in recorded(d, mark)] == [(JobCancelled, f"{R}2")]
    assert [d.state_of(f"{R}{i}") for i in range(3)] == ["running", "running", "cancelled"]
    assert (d.state.jobs[f"{R}0"].placements, d.state.jobs[f"{R}0"].generation) == first
    # up again: replica 2 is a new job, replicas 0 and 1 are left as they run
    mark = len(d.log)
    scaled(d, dep, 3, now=6.0)
    assert [e.job_id for e in recorded(d, mark)] == [f"{R}2-1"]
    assert scaled(d, dep, 3, now=7.0) == [] and len(d.log) == mark + 1  # converged: nothing more


def test_scale_to_zero_returns_the_quota_at_once() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    dep = a_deployment_of(4, minimum=2)
    scaled(d, dep, 4, now=1.0)
    d.cycle(now=2.0)
    d.given(a_job("train", team="vision", gpus=8, at=3.0, cluster="c1"))
    d.cycle(now=4.0)
    assert d.state_of("train") == "pending" and d.state.usage[("default", "vision")] == 8
    scaled(d, dep, 0, now=5.0)
    assert [d.state_of(f"{R}{i}") for i in range(4)] == ["cancelled"] * 4
    assert d.state.usage.get(("default", "vision"), 0) == 0  # all of it, in the same round
    d.cycle(now=6.0)
    assert d.state_of("train") == "running"


def test_a_deleted_workload_is_scaled_to_zero() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    scaled(d, a_deployment_of(2, minimum=1), 2, now=1.0)
    d.cycle(now=2.0)
    events, _ = reconcile_serving(d.state, [], "c1", now=3.0)
    d.given(*(e for e, _ in events))
    assert [d.state_of(f"{R}{i}") for i in range(2)] == ["cancelled", "cancelled"]
    assert reconcile_serving(d.state, [], "c2", now=4.0) == ([], [])  # another cluster's actuator: not its own


def test_a_preempted_borrowed_replica_has_its_pod_deleted_and_the_next_pod_waits_gated() -> None:
    d = Driver().given(a_quota("vision", 2), a_quota("nlp", 6), a_node("n1", cluster="c1"))
    dep = a_deployment_of(2, minimum=1)
    pods = (a_replica_pod(dep, "llm-abc12-a"), a_replica_pod(dep, "llm-abc12-b"))
    scaled(d, dep, 2, now=1.0, pods=pods)
    d.cycle(now=2.0)
    released = scaled(d, dep, 2, now=3.0, pods=pods)
    assert [(a.name, a.ops[0]["value"]) for a in released] == [
        ("llm-abc12-a", {"chamber.io/replica": "0"}),
        ("llm-abc12-b", {"chamber.io/replica": "1"}),
    ]
    running = tuple(as_released(p, i) for i, p in enumerate(pods))
    d.given(a_job("nlp-train", team="nlp", gpus=6, priority="high", at=4.0, cluster="c1"))
    d.cycle(now=5.0)
    assert (d.state_of(f"{R}0"), d.state_of(f"{R}1")) == ("running", "suspended")
    actions = scaled(d, dep, 2, now=6.0, pods=running)
    assert [(type(a), a.name) for a in actions] == [(DeletePod, "llm-abc12-b")]
    # its controller makes the pod again, gated by the webhook: it waits for the replica's admission
    again = (running[0], a_replica_pod(dep, "llm-abc12-c"))
    assert scaled(d, dep, 2, now=7.0, pods=again) == []


def test_a_leaderworkerset_group_is_one_gang_and_its_pods_are_found_by_group() -> None:
    lws = a_leaderworkerset(replicas=2, size=3, gpus=8)
    lws["metadata"]["uid"] = "u2"
    group_pods = [
        a_replica_pod(
            lws,
            f"big-{g}{'' if w == 0 else f'-{w}'}",
            gpus=8,
            labels={"leaderworkerset.sigs.k8s.io/group-index": str(g)},
        )
        for g in range(2)
        for w in range(3)
    ]
    listed = [Observed(LeaderWorkerSet(), lws), *(Observed(Pod(), p) for p in group_pods)]
    rest, [w] = split(listed)
    assert rest == [] and len(w.pods) == 6
    d = Driver().given(a_quota("vision", 24), *(a_node(f"n{i}", cluster="c1") for i in range(6)))
    events, _ = reconcile_serving(d.state, [w], "c1", now=1.0)
    specs = [e.spec for e, _ in events if isinstance(e, JobSubmitted)]
    assert [(s.replicas, s.gpus_per_replica, s.preemptible) for s in specs] == [(3, 8, False), (3, 8, True)]
    d.given(*(e for e, _ in events))
    d.cycle(now=2.0)
    _, actions = reconcile_serving(d.state, [w], "c1", now=3.0)
    by_pod = {a.name: a.nodes for a in actions}
    group0 = {p.node for p in d.state.jobs["k8s-c1-ml-leaderworkerset-big-r0"].placements}
    assert len(group0) == 3 and {by_pod[n] for n in ("big-0", "big-0-1", "big-0-2")} == {tuple(sorted(group0))}
    assert len(by_pod) == 6


def test_class_serving_is_kept_to_serving_replicas() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    with pytest.raises(InvalidName, match="class serving is for the replicas of serving workloads"):
        admit(d.state, SubmitJob(team="vision", gpus=1, priority=PriorityClass.SERVING), "j", 1.0)


def test_a_bad_minimum_is_refused_with_the_fix() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    dep = a_deployment_of(2, minimum=1)
    dep["metadata"]["annotations"]["chamber.io/min-replicas"] = "two"
    events, actions = reconcile_serving(d.state, [Workload(DEPLOYMENT, dep, ())], "c1", now=1.0)
    assert events == [] and "chamber.io/min-replicas: 'two' is not a whole number" in actions[0].reason


def test_a_scale_down_that_removed_a_lower_replicas_pod_moves_that_replica_to_the_next_pod() -> None:
    """A ReplicaSet deletes a pod that is not ready before a ready one, whatever its deletion cost: if it
    took replica 1's pod, replica 2 (cancelled, the highest) must not keep running on GPUs it gave back."""
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    dep = a_deployment_of(3, minimum=1)
    gated = tuple(a_replica_pod(dep, f"llm-abc12-{x}") for x in "abc")
    scaled(d, dep, 3, now=1.0, pods=gated)
    d.cycle(now=2.0)
    released = scaled(d, dep, 3, now=3.0, pods=gated)
    running = {
        a.name: {
            **p,
            "metadata": {**p["metadata"], "annotations": {"chamber.io/replica": str(i)}},
            "spec": {"containers": []},
        }
        for i, (a, p) in enumerate(zip(released, gated, strict=True))
    }
    left = (running["llm-abc12-a"], running["llm-abc12-c"])  # the ReplicaSet took replica 1's pod
    actions = scaled(d, dep, 2, now=4.0, pods=left)
    assert [d.state_of(f"{R}{i}") for i in range(3)] == ["running", "running", "cancelled"]
    assert [(type(a), a.name) for a in actions] == [(DeletePod, "llm-abc12-c")]
    again = (running["llm-abc12-a"], a_replica_pod(dep, "llm-abc12-d"))
    [release] = scaled(d, dep, 2, now=5.0, pods=again)
    assert (release.name, release.ops[0]["value"]) == ("llm-abc12-d", {"chamber.io/replica": "1"})
    assert release.nodes == ("n1",)


def test_a_leaderworkersets_own_statefulset_is_not_a_workload_and_a_gpu_less_one_releases_its_pods() -> None:
    lws = a_leaderworkerset(replicas=1, size=2)
    part = a_deployment("big", replicas=1)  # the leader StatefulSet LeaderWorkerSet makes, labelled as its pods
    part = {**part, "kind": "StatefulSet", "metadata": {**part["metadata"], "labels": {**part["metadata"]["labels"]}}}
    part["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/name"] = "big"
    _, workloads = split([Observed(LeaderWorkerSet(), lws), Observed(SERVING_KINDS[1], part)])
    assert [w.kind.kind for w in workloads] == ["LeaderWorkerSet"]

    web = a_deployment("web", replicas=2, gpus=0)
    web["spec"]["template"]["spec"]["containers"][0].pop("resources")
    pods = (a_replica_pod(web, "web-abc12-a", gpus=0),)
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    events, [release] = reconcile_serving(d.state, [Workload(DEPLOYMENT, web, pods)], "c1", now=1.0)
    assert events == [] and release.nodes == () and [op["op"] for op in release.ops] == ["test", "remove"]


def test_a_replica_is_found_by_its_spec_even_when_its_earlier_jobs_were_forgotten() -> None:
    """Finished jobs leave the state after the retention window, the oldest first: replica 0's first
    job may be gone while its second runs. The replica is known by `spec.serving`, not by its id."""
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    dep = a_deployment_of(1, minimum=1)
    scaled(d, dep, 0, now=1.0)
    scaled(d, dep, 1, now=2.0)
    first = d.log[-1]
    assert isinstance(first, JobSubmitted) and first.job_id == f"{R}0"
    again = msgspec.structs.replace(first, job_id=f"{R}0-1")  # as if r0 had finished and been forgotten
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"), again)
    mark = len(d.log)
    assert scaled(d, dep, 1, now=3.0) == [] and d.log[mark:] == []  # no second replica 0
    scaled(d, dep, 0, now=4.0)
    assert [(type(e), e.job_id) for e in d.log[mark:]] == [(JobCancelled, f"{R}0-1")]


def test_idle_reclaim_only_flags_a_serving_replica() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("n1", cluster="c1"))
    scaled(d, a_deployment_of(1, minimum=1), 1, now=1.0)
    d.cycle(now=2.0)
    verdict = JobIdleDetected(job_id=f"{R}0", at=4000.0, team="vision", action=IdleModeName.SUSPEND, idle_since=2000.0)
    d.given(verdict)
    d.cycle(now=4001.0)
    assert d.state_of(f"{R}0") == "running"
    assert "a serving replica keeps its GPUs" in d.state.idle_reclaim[f"{R}0"].detail


def test_guaranteed_replicas_reclaim_their_teams_guarantee_from_another_teams_borrowed_training() -> None:
    d = Driver().given(a_quota("vision", 4), a_quota("nlp", 4), a_node("n1", cluster="c1"))
    d.given(a_job("nlp-train", team="nlp", gpus=8, priority="normal", cluster="c1"))  # borrows vision's 4
    d.cycle(now=2.0)
    scaled(d, a_deployment_of(2, minimum=2), 2, now=3.0)
    d.cycle(now=4.0)
    assert (d.state_of("nlp-train"), d.state_of(f"{R}0"), d.state_of(f"{R}1")) == ("suspended", "running", "running")
