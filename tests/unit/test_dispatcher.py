"""The dispatcher's core (services/dispatch/dispatcher.py), fed as the host feeds it: offers, heartbeats
and quotas in, decisions out and folded back. One copy per workload, in the best cluster answering;
a lost cluster's workloads go elsewhere after the stated timeout, once; a finished workload is never
dispatched again. And the conformance checks every decider core passes."""

from __future__ import annotations

import random

import pytest

from events import Event, TeamQuotaSet
from events.dispatch import (
    ClusterHeartbeat,
    CopyPhase,
    CopyRecalled,
    CopyReported,
    WorkloadDispatched,
    WorkloadOffered,
    WorkloadWithdrawn,
)
from services.dispatch import core
from services.dispatch.dispatcher import DispatcherState, Seen, decide, evolve
from services.runtime.decider import pickle_codec
from tests.conformance.harness import (
    CoreSpec,
    decide_only_reads,
    interleavings_fold_to_one_state,
    restart_mid_cycle,
    snapshot_restore_continue,
)

LOST = 120.0


def offer(
    w: str = "w1", *, gpus: int = 8, origin: str = "a", at: float = 1.0, clusters: tuple[str, ...] = ()
) -> WorkloadOffered:
    return WorkloadOffered(
        workload=w, origin=origin, namespace="ml", name=w, team="vision", gpus=gpus, at=at, clusters=clusters
    )


def beat(cluster: str, at: float, *, gpus: int = 16, price: float = 1.0) -> ClusterHeartbeat:
    return ClusterHeartbeat(cluster=cluster, at=at, capacity_gpus=gpus, price_per_gpu_hour=price)


def quota(gpus: int = 32) -> TeamQuotaSet:
    return TeamQuotaSet(team="vision", pool="default", guaranteed_gpus=gpus, borrow_limit=0, at=0.0)


class Given:
    """Events folded; `decide` folds its own decisions back, as the host does once they return."""

    def __init__(self, *events: Event) -> None:
        self.state = DispatcherState(lost_after_s=LOST)
        self.given(*events)

    def given(self, *events: Event) -> Given:
        for e in events:
            evolve(self.state, e)
        return self

    def decide(self, now: float) -> list[Event]:
        out = [e for e, _ in decide(self.state, now)]
        self.given(*out)
        return out


def test_a_workload_goes_to_the_cheaper_cluster_once_and_is_not_decided_again() -> None:
    d = Given(quota(), beat("a", 10.0, price=10.0), beat("b", 10.0, price=1.0), offer())
    assert d.decide(11.0) == [WorkloadDispatched(workload="w1", cluster="b", generation=1, at=11.0)]
    assert d.decide(12.0) == []


def test_the_allow_list_and_the_quota_and_capacity_bound_the_choice() -> None:
    d = Given(quota(8), beat("a", 10.0, price=10.0), beat("b", 10.0, price=1.0, gpus=4))
    d.given(offer("big", gpus=8), offer("pinned", gpus=4, clusters=("a",), at=2.0))
    [first] = d.decide(11.0)
    assert (first.workload, first.cluster) == ("big", "a")  # b has 4 GPUs: no candidate for 8
    assert d.decide(12.0) == []  # the team's 8 GPUs are held by `big`: `pinned` waits
    d.given(CopyReported(workload="big", cluster="a", generation=1, phase=CopyPhase.COMPLETE, at=13.0))
    out = d.decide(14.0)
    assert [type(e).__name__ for e in out] == ["CopyRecalled", "WorkloadDispatched"]
    assert out[0].final and (out[1].workload, out[1].cluster) == ("pinned", "a")


def test_a_workload_goes_only_where_its_kind_is_served() -> None:
    jobset = WorkloadOffered(
        workload="js", origin="a", namespace="ml", name="js", team="vision", gpus=8, at=1.0, kind="JobSet"
    )
    cheap_without = ClusterHeartbeat(cluster="b", at=10.0, capacity_gpus=16, price_per_gpu_hour=1.0, kinds=("Job",))
    dear_with = ClusterHeartbeat(
        cluster="c", at=10.0, capacity_gpus=16, price_per_gpu_hour=9.0, kinds=("Job", "JobSet")
    )
    d = Given(quota(), cheap_without, dear_with, jobset, offer())
    placed = {e.workload: e.cluster for e in d.decide(11.0) if isinstance(e, WorkloadDispatched)}
    assert placed == {"js": "c", "w1": "b"}


def test_a_cluster_busy_with_its_own_work_waits_longer() -> None:
    busy = ClusterHeartbeat(
        cluster="b", at=10.0, capacity_gpus=16, price_per_gpu_hour=1.0, running_gpus=16, queued_gpus=8
    )
    d = Given(quota(), beat("a", 10.0, price=2.0), busy, offer())
    [placed] = d.decide(11.0)
    assert isinstance(placed, WorkloadDispatched) and placed.cluster == "a"  # dearer, but b would make it wait
    d = Given(quota(), beat("a", 10.0, price=2.0), beat("b", 10.0, price=1.0), offer())
    [placed] = d.decide(11.0)
    assert isinstance(placed, WorkloadDispatched) and placed.cluster == "b"  # idle: the cheaper one wins


def test_a_team_without_a_quota_dispatches_nothing() -> None:
    d = Given(beat("a", 10.0), offer())
    assert d.decide(11.0) == []


def test_a_cluster_silent_past_the_timeout_has_its_workloads_requeued_elsewhere_once() -> None:
    d = Given(quota(), beat("a", 10.0, price=10.0), beat("b", 10.0, price=1.0), offer())
    d.decide(11.0)
    d.given(beat("a", 100.0, price=10.0))
    assert d.decide(10.0 + LOST) == []  # b is silent, but not for longer than the timeout yet
    out = d.decide(10.0 + LOST + 1.0)
    assert out == [
        CopyRecalled(workload="w1", cluster="b", generation=1, at=131.0, reason="cluster b lost"),
        WorkloadDispatched(workload="w1", cluster="a", generation=2, at=131.0),
    ]
    assert d.decide(132.0) == []
    # b comes back: its copy of generation 1 was fenced; reports about it change nothing
    d.given(beat("b", 140.0), CopyReported(workload="w1", cluster="b", generation=1, phase=CopyPhase.RUNNING, at=140.0))
    assert d.decide(141.0) == [] and d.state.copies.copies["w1"] == core.Copy("a", 2)


def test_a_completed_workload_is_recalled_for_good_and_never_dispatched_again() -> None:
    d = Given(quota(), beat("a", 10.0), offer())
    d.decide(11.0)
    d.given(CopyReported(workload="w1", cluster="a", generation=1, phase=CopyPhase.RUNNING, at=12.0))
    d.given(CopyReported(workload="w1", cluster="a", generation=1, phase=CopyPhase.COMPLETE, at=72.0))
    [recall] = d.decide(73.0)
    assert isinstance(recall, CopyRecalled) and recall.final and recall.reason == "complete"
    assert d.decide(74.0) == [] and d.state.done == {"w1": "complete"}
    assert d.state.runtimes == [60.0]  # the queue model learns the runtime
    d.given(offer())  # offered again (a replayed offer): done stays done
    assert d.decide(75.0) == []


def test_a_copy_preempted_in_its_cluster_is_recalled_and_dispatched_again() -> None:
    d = Given(quota(), beat("a", 10.0, price=10.0), beat("b", 10.0), offer())
    d.decide(11.0)
    d.given(CopyReported(workload="w1", cluster="b", generation=1, phase=CopyPhase.RUNNING, at=12.0))
    d.given(CopyReported(workload="w1", cluster="b", generation=1, phase=CopyPhase.SUSPENDED, at=13.0))
    out = d.decide(14.0)
    assert [(type(e).__name__, e.generation) for e in out] == [("CopyRecalled", 1), ("WorkloadDispatched", 2)]
    assert not out[0].final


def test_a_withdrawn_workload_has_its_copy_recalled_for_good() -> None:
    d = Given(quota(), beat("a", 10.0), offer())
    d.decide(11.0)
    d.given(WorkloadWithdrawn(workload="w1", origin="a", at=12.0))
    [recall] = d.decide(13.0)
    assert isinstance(recall, CopyRecalled) and recall.final and recall.reason == "withdrawn"
    assert d.decide(14.0) == [] and "w1" in d.state.done


# -- the conformance suite (tests/conformance/harness.py) on logs the core itself produced ---------

_codec = pickle_codec(DispatcherState, Seen, core.DispatchState, core.Copy, core.Workload, version=1)
DISPATCHER = CoreSpec[DispatcherState](
    name="dispatcher",
    initial=lambda: DispatcherState(lost_after_s=LOST),
    evolve=evolve,  # type: ignore[arg-type]
    snapshot=lambda s: _codec.decode(_codec.encode(s)),
    decide=decide,
)


def a_log(seed: int) -> tuple[list[Event], float]:
    rng = random.Random(seed)
    d = Given()
    log: list[Event] = []
    now = 0.0

    def happen(*events: Event) -> None:
        log.extend(events)
        d.given(*events)

    for step in range(60):
        now += rng.choice([5.0, 30.0, 90.0])
        kind = rng.choice(["offer", "offer", "beat", "beat", "beat", "quota", "report", "cycle", "cycle", "withdraw"])
        if kind == "offer":
            happen(
                offer(f"w{step}", gpus=rng.choice([1, 4, 8, 16]), at=now, clusters=rng.choice([(), ("b",), ("c", "a")]))
            )
        elif kind == "beat":
            happen(beat(rng.choice("abc"), now, gpus=rng.choice([8, 16]), price=rng.choice([1.0, 2.0])))
        elif kind == "quota":
            happen(quota(rng.choice([0, 8, 32])))
        elif kind == "report" and d.state.copies.copies:
            wid = rng.choice(sorted(d.state.copies.copies))
            c = d.state.copies.copies[wid]
            phase = rng.choice(list(CopyPhase))
            happen(CopyReported(workload=wid, cluster=c.cluster, generation=c.generation, phase=phase, at=now))
        elif kind == "withdraw" and d.state.offers:
            happen(WorkloadWithdrawn(workload=rng.choice(sorted(d.state.offers)), origin="a", at=now))
        elif kind == "cycle":
            happen(*(e for e, _ in decide(d.state, now)))
    return log, now


@pytest.mark.parametrize("seed", range(6))
def test_the_dispatcher_passes_the_conformance_suite(seed: int) -> None:
    log, now = a_log(seed)
    live: dict[str, int] = {}  # never two live copies: each dispatch follows the recall of the one before
    for e in log:
        if isinstance(e, WorkloadDispatched):
            assert e.workload not in live
            live[e.workload] = e.generation
        elif isinstance(e, CopyRecalled):
            assert live.pop(e.workload) == e.generation
    assert any(isinstance(e, WorkloadDispatched) for e in log)
    interleavings_fold_to_one_state(DISPATCHER, log, seed)
    snapshot_restore_continue(DISPATCHER, log, len(log) // 2)
    decide_only_reads(DISPATCHER, log, now + 200.0)
    restart_mid_cycle(DISPATCHER, log, now + 200.0)
