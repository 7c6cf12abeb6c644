"""Discovery scenarios with an injected clock: nodes found, changed, suspect, lost, back, and seen by
Kubernetes with or without an agent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from events import GpuInfo, NodeDiscovered, NodeIsolated, NodeLost, NodeUpdated
from events.base import Event
from events.fleet import GpuIsolated, NodeStatus
from services.discovery.core import (
    K8S_ALLOCATABLE_LABEL,
    DiscoveryState,
    KubeNode,
    KubeNodesListed,
    decide,
    desired_status,
    event_id,
    evolve,
    new_state,
    view,
)
from tests.health_builders import T0, a_sample, an_inventory


def step(state: DiscoveryState, *inputs: object, now: float) -> list[Event]:
    for item in inputs:
        evolve(state, item)
    events = decide(state, now)
    for e in events:
        evolve(state, e)
    return events


def test_an_agent_inventory_discovers_the_node_once() -> None:
    state = new_state()
    [found] = step(state, an_inventory("n1", labels={"zone": "a"}), now=T0)
    assert isinstance(found, NodeDiscovered)
    assert (found.node, found.source, len(found.gpus), found.labels) == ("n1", "agent", 8, {"zone": "a"})
    assert step(state, an_inventory("n1", labels={"zone": "a"}, at=T0 + 60), now=T0 + 60) == []


def test_a_changed_inventory_is_an_update_naming_the_change() -> None:
    state = new_state()
    step(state, an_inventory("n1"), now=T0)
    [update] = step(state, an_inventory("n1", n_gpus=7, at=T0 + 5), now=T0 + 5)
    assert isinstance(update, NodeUpdated)
    assert update.changes == ["gpus"] and len(update.gpus) == 7 and update.status == NodeStatus.HEALTHY


def test_a_silent_node_is_suspect_after_three_missed_intervals_then_lost_then_back() -> None:
    state = new_state(lost_after_s=30)
    step(state, an_inventory("n1"), a_sample("n1", at=T0, interval_s=2.0), now=T0)
    assert step(state, now=T0 + 6) == []  # exactly 3 intervals: not yet
    [suspect] = step(state, now=T0 + 6.5)
    assert isinstance(suspect, NodeUpdated) and suspect.status == NodeStatus.SUSPECT
    assert suspect.at == T0 + 6  # when the threshold was crossed, not when the tick noticed
    assert step(state, now=T0 + 20) == []
    [lost] = step(state, now=T0 + 31)
    assert isinstance(lost, NodeLost) and lost.at == T0 + 30 and lost.last_seen_at == T0
    [back] = step(state, a_sample("n1", at=T0 + 40, seq=1, interval_s=2.0), now=T0 + 40)
    assert isinstance(back, NodeUpdated) and back.status == NodeStatus.HEALTHY and back.changes == ["status"]


def test_a_sample_before_the_inventory_discovers_the_gpus_by_uuid() -> None:
    state = new_state()
    [found] = step(state, a_sample("n1", at=T0), now=T0)
    assert isinstance(found, NodeDiscovered) and found.gpus[0].uuid == "GPU-n1-00" and found.gpus[0].model == "unknown"
    [update] = step(state, an_inventory("n1", at=T0 + 1), now=T0 + 1)
    assert isinstance(update, NodeUpdated) and update.gpus[0].model == "H100-80GB"


def a_kube_node(name: str, *, gpus: int = 8, allocatable: int | None = None) -> KubeNode:
    return KubeNode(
        name=name,
        labels={
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.memory": "81559",
            "kubernetes.io/hostname": name,
        },
        capacity_gpus=gpus,
        allocatable_gpus=gpus if allocatable is None else allocatable,
    )


def test_a_kubernetes_node_without_an_agent_is_reported_as_such() -> None:
    state = new_state()
    events = step(state, KubeNodesListed("c1", T0, (a_kube_node("k1"),)), now=T0)
    assert [type(e) for e in events] == [NodeDiscovered, NodeUpdated]
    found, status = events
    assert isinstance(found, NodeDiscovered) and isinstance(status, NodeUpdated)
    assert found.source == "kubernetes" and len(found.gpus) == 8
    assert found.gpus[0].model == "NVIDIA-H100-80GB-HBM3" and found.gpus[0].memory_total_mib == 81559
    assert "kubernetes.io/hostname" not in found.labels and found.labels[K8S_ALLOCATABLE_LABEL] == "8"
    assert status.status == NodeStatus.NO_AGENT
    shown = view(state, state.nodes[("c1", "k1")], T0)
    assert shown["status"] == "suspect" and shown["agent"] is False and "no Chamber agent" in shown["reason"]


def test_an_agent_starting_on_a_kubernetes_node_makes_it_healthy() -> None:
    state = new_state()
    step(state, KubeNodesListed("c1", T0, (a_kube_node("k1"),)), now=T0)
    [update] = step(state, an_inventory("k1", at=T0 + 5), a_sample("k1", at=T0 + 5), now=T0 + 5)
    assert isinstance(update, NodeUpdated) and update.status == NodeStatus.HEALTHY
    assert set(update.changes) == {"status", "gpus"} and update.gpus[0].uuid == "GPU-k1-00"


def test_allocatable_changes_and_deletion_from_kubernetes() -> None:
    state = new_state()
    step(state, KubeNodesListed("c1", T0, (a_kube_node("k1"), a_kube_node("k2"))), now=T0)
    [update] = step(
        state, KubeNodesListed("c1", T0 + 30, (a_kube_node("k1", allocatable=6), a_kube_node("k2"))), now=T0 + 30
    )
    assert (
        isinstance(update, NodeUpdated) and update.changes == ["labels"] and update.labels[K8S_ALLOCATABLE_LABEL] == "6"
    )
    [lost] = step(state, KubeNodesListed("c1", T0 + 60, (a_kube_node("k1", allocatable=6),)), now=T0 + 60)
    assert isinstance(lost, NodeLost) and lost.node == "k2" and "deleted from Kubernetes" in lost.reason


def test_a_lost_agent_node_known_only_from_the_log_is_not_said_to_be_deleted_from_kubernetes() -> None:
    """After a restart the discovery knows a lost node from FLEET alone until its agent reports: the
    view says so, not "deleted from Kubernetes" (it never was a Kubernetes Node)."""
    state = new_state(lost_after_s=30)
    log = step(state, an_inventory("n1"), a_sample("n1", at=T0), now=T0) + step(state, now=T0 + 31)
    assert [type(e).__name__ for e in log] == ["NodeDiscovered", "NodeLost"]
    rebuilt = new_state(lost_after_s=30)
    for e in log:
        evolve(rebuilt, e)
    assert step(rebuilt, now=T0 + 100) == []
    shown = view(rebuilt, rebuilt.nodes[("c1", "n1")], T0 + 100)
    assert (shown["status"], shown["reason"]) == ("lost", "no heartbeat since the discovery started")


def test_the_view_shows_isolation_and_utilization() -> None:
    state = new_state()
    step(state, an_inventory("n1"), a_sample("n1", at=T0, util=93.0), now=T0)
    evolve(state, GpuIsolated(cluster="c1", node="n1", gpu_index=3, at=T0, reason="ecc_dbe: Volatile DBE"))
    shown = view(state, state.nodes[("c1", "n1")], T0)
    assert shown["status"] == "healthy"
    gpu3 = shown["gpus"][3]
    assert gpu3 == {
        **gpu3,
        "index": 3,
        "model": "H100-80GB",
        "util": 93.0,
        "isolated": True,
        "reason": "ecc_dbe: Volatile DBE",
    }
    assert shown["gpus"][0]["isolated"] is False
    evolve(state, NodeIsolated(cluster="c1", node="n1", at=T0, reason="xid-79: fell off the bus"))
    shown = view(state, state.nodes[("c1", "n1")], T0)
    assert (shown["status"], shown["reason"]) == ("isolated", "xid-79: fell off the bus")


def test_replaying_the_fleet_stream_rebuilds_what_was_announced() -> None:
    state = new_state(lost_after_s=30)
    log: list[Event] = []
    log += step(state, KubeNodesListed("c1", T0, (a_kube_node("n1"), a_kube_node("k9"))), now=T0)
    log += step(state, an_inventory("n1"), a_sample("n1", at=T0), an_inventory("n2"), a_sample("n2", at=T0), now=T0)
    for t in range(1, 50, 7):
        log += step(state, a_sample("n2", at=T0 + t, seq=t), now=T0 + t)
    log += step(state, an_inventory("n2", n_gpus=4, at=T0 + 50), now=T0 + 50)
    assert {type(e).__name__ for e in log} >= {"NodeDiscovered", "NodeUpdated", "NodeLost"}
    rebuilt = new_state(lost_after_s=30)
    for e in log:
        evolve(rebuilt, e)

    def announced(s: DiscoveryState) -> dict:  # type: ignore[type-arg]
        return {k: (r.status, r.announced_gpus, r.announced_labels) for k, r in s.nodes.items()}

    assert announced(rebuilt) == announced(state)
    # and ids are deterministic: the same decisions from a second run are the same messages
    again = new_state(lost_after_s=30)
    log2: list[Event] = []
    log2 += step(again, KubeNodesListed("c1", T0, (a_kube_node("n1"), a_kube_node("k9"))), now=T0)
    log2 += step(again, an_inventory("n1"), a_sample("n1", at=T0), an_inventory("n2"), a_sample("n2", at=T0), now=T0)
    assert [event_id(e) for e in log2] == [event_id(e) for e in log[: len(log2)]]


def test_gpu_info_equality_drives_updates() -> None:
    state = new_state()
    step(state, an_inventory("n1"), now=T0)
    inv = an_inventory("n1", at=T0 + 1)
    gpus = list(inv.gpus)
    gpus[0] = GpuInfo(index=0, uuid=gpus[0].uuid, model="H200-141GB")
    import msgspec

    [update] = step(state, msgspec.structs.replace(inv, gpus=gpus), now=T0 + 1)
    assert isinstance(update, NodeUpdated) and update.gpus[0].model == "H200-141GB"


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0.1, max_value=40.0), min_size=1, max_size=30),
    tick=st.floats(min_value=0.2, max_value=5.0),
)
def test_suspect_and_lost_are_dated_at_their_thresholds_whatever_the_ticks(gaps: list[float], tick: float) -> None:
    """Samples arrive with random gaps, ticks at a random period: every status event is dated exactly
    when its threshold was crossed, never in the future, and the last one told matches the truth."""
    state = new_state(lost_after_s=20)
    sample_times = [T0]
    for gap in gaps:
        sample_times.append(sample_times[-1] + gap)
    events: list[Event] = []
    now, i = T0, 0
    end = sample_times[-1] + 30
    last_seen = T0
    while now <= end:
        inputs = []
        while i < len(sample_times) and sample_times[i] <= now:
            inputs.append(a_sample("n1", at=sample_times[i], seq=i, interval_s=1.0))
            last_seen = sample_times[i]
            i += 1
        for e in step(state, *inputs, now=now):
            events.append(e)
            assert e.at <= now  # type: ignore[attr-defined]
            if isinstance(e, NodeUpdated) and e.status == NodeStatus.SUSPECT:
                assert e.at == last_seen + 3.0
            if isinstance(e, NodeLost):
                assert e.at == last_seen + 20 and e.last_seen_at == last_seen
        now += tick
    rec = state.nodes[("c1", "n1")]
    assert rec.status == desired_status(state, rec, now - tick)[0]
    assert isinstance(events[-1], NodeLost)  # 30 s of silence at the end


def test_the_agents_cpu_and_memory_reach_the_fleet_and_kubernetes_allocatable_wins() -> None:
    state = new_state()
    [found] = step(state, an_inventory("n1", cpu_milli=224_000, memory_mib=2_000_000), now=T0)
    assert isinstance(found, NodeDiscovered) and (found.cpu_milli, found.memory_mib) == (224_000, 2_000_000)
    [update] = step(state, an_inventory("n1", cpu_milli=112_000, memory_mib=2_000_000, at=T0 + 5), now=T0 + 5)
    assert isinstance(update, NodeUpdated) and update.changes == ["capacity"] and update.cpu_milli == 112_000
    kube = KubeNode(name="n1", allocatable_cpu_milli=100_000, allocatable_memory_mib=1_500_000)
    updates = step(state, KubeNodesListed("c1", T0 + 6, (kube,)), now=T0 + 6)
    last = [e for e in updates if isinstance(e, NodeUpdated)][-1]
    assert (last.cpu_milli, last.memory_mib) == (100_000, 1_500_000) and "capacity" in last.changes


def test_the_kubernetes_listing_reads_allocatable_cpu_and_memory() -> None:
    from kubernetes.client import V1Node, V1NodeList, V1NodeStatus, V1ObjectMeta

    from services.discovery.service import list_kube_nodes

    class Api:  # the client's list_node answer, built from its own models
        def list_node(self) -> V1NodeList:
            status = V1NodeStatus(
                capacity={"nvidia.com/gpu": "8"},
                allocatable={"nvidia.com/gpu": "8", "cpu": "223500m", "memory": "2113470212Ki"},
            )
            bare = V1NodeStatus(allocatable={"cpu": "lots"})
            return V1NodeList(
                items=[
                    V1Node(metadata=V1ObjectMeta(name="k1"), status=status),
                    V1Node(metadata=V1ObjectMeta(name="k2"), status=bare),
                ]
            )

    k1, k2 = list_kube_nodes(Api(), "c1", T0).nodes
    assert (k1.allocatable_cpu_milli, k1.allocatable_memory_mib) == (223_500, 2113470212 // 1024)
    assert (k2.allocatable_cpu_milli, k2.allocatable_memory_mib) == (None, None)  # unreadable: unknown
