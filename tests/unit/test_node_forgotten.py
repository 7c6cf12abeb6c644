"""A node that left the fleet for good is forgotten: discovery decides it (a node Kubernetes deleted,
once lost a while; or a lost node an operator names), and every core that folds the fleet drops it."""

from __future__ import annotations

import pytest

from events import GpuInfo, NodeDiscovered, NodeForgotten, NodeLost
from events.base import Event
from events.fleet import NodeStatus
from services.discovery.core import (
    DiscoveryState,
    ForgetRefused,
    KubeNode,
    KubeNodesListed,
    event_id,
    evolve,
    forget,
    new_state,
)
from tests.health_builders import T0, a_fault, a_sample, an_inventory
from tests.unit.test_discovery_core import step

LOST_AFTER = 30.0


def a_kube_node(name: str) -> KubeNode:
    return KubeNode(name=name, labels={"nvidia.com/gpu.product": "H100"}, capacity_gpus=8, allocatable_gpus=8)


def forgotten(events: list[Event]) -> list[NodeForgotten]:
    return [e for e in events if isinstance(e, NodeForgotten)]


def a_lost_agent_node(state: DiscoveryState, node: str = "n1") -> None:
    """An agent-only node (no Kubernetes), silent since T0 and announced lost at T0 + LOST_AFTER."""
    step(state, an_inventory(node), a_sample(node, at=T0), now=T0)
    step(state, now=T0 + 10)
    [lost] = [e for e in step(state, now=T0 + LOST_AFTER + 1) if isinstance(e, NodeLost)]
    assert lost.node == node and state.nodes[("c1", node)].status == NodeStatus.LOST


# -- discovery: automatic --------------------------------------------------------------------------


def test_a_node_kubernetes_deleted_is_forgotten_once_lost_for_lost_after_again() -> None:
    state = new_state(lost_after_s=LOST_AFTER)
    step(state, KubeNodesListed("c1", T0, (a_kube_node("k1"),)), an_inventory("k1"), a_sample("k1", at=T0), now=T0)
    step(state, KubeNodesListed("c1", T0 + 10, ()), now=T0 + 10)  # scaled down: the Node is deleted
    [lost] = [e for e in step(state, now=T0 + LOST_AFTER + 1) if isinstance(e, NodeLost)]
    assert lost.at == T0 + LOST_AFTER
    assert forgotten(step(state, now=T0 + 2 * LOST_AFTER - 1)) == []  # the grace: lost_after_s again
    [gone] = step(state, now=T0 + 2 * LOST_AFTER + 5)
    assert isinstance(gone, NodeForgotten) and (gone.cluster, gone.node, gone.by) == ("c1", "k1", "discovery")
    assert gone.at == T0 + 2 * LOST_AFTER  # dated when the grace ran out: a replay decides the same id
    assert "deleted from Kubernetes" in gone.reason
    assert ("c1", "k1") not in state.nodes
    assert step(state, now=T0 + 10 * LOST_AFTER) == []


def test_the_forget_is_the_same_event_with_the_same_id_whenever_the_tick_notices() -> None:
    ids = set()
    for late in (0.5, 7.0, 300.0):
        state = new_state(lost_after_s=LOST_AFTER)
        step(state, KubeNodesListed("c1", T0, (a_kube_node("k1"),)), an_inventory("k1"), a_sample("k1", at=T0), now=T0)
        step(state, KubeNodesListed("c1", T0 + 10, ()), now=T0 + 10)
        step(state, now=T0 + LOST_AFTER + 1)
        [gone] = forgotten(step(state, now=T0 + 2 * LOST_AFTER + late))
        ids.add(event_id(gone))
    assert len(ids) == 1


def test_a_node_kubernetes_deleted_while_the_discovery_was_down_is_still_forgotten() -> None:
    """After a restart the discovery knows the lost node from FLEET only; FLEET was told Kubernetes'
    GPU counts for it, so the first listing without it counts as its deletion. An agent-only node
    (no such labels) is not forgotten that way."""
    before = new_state(lost_after_s=LOST_AFTER)
    log = step(
        before, KubeNodesListed("c1", T0, (a_kube_node("k1"),)), an_inventory("k1"), a_sample("k1", at=T0), now=T0
    )
    log += step(before, an_inventory("n1"), a_sample("n1", at=T0), now=T0)
    log += step(before, now=T0 + LOST_AFTER + 1)  # both silent: lost (k1 still a Node then)
    assert sorted(e.node for e in log if isinstance(e, NodeLost)) == ["k1", "n1"]
    after = new_state(lost_after_s=LOST_AFTER)  # restarted while Kubernetes deleted k1
    for e in log:
        evolve(after, e)
    assert step(after, KubeNodesListed("c1", T0 + 100, ()), now=T0 + 100) == []
    assert forgotten(step(after, now=T0 + 100 + LOST_AFTER - 1)) == []
    [gone] = step(after, now=T0 + 100 + LOST_AFTER)
    assert isinstance(gone, NodeForgotten) and gone.node == "k1" and gone.at == T0 + 100 + LOST_AFTER
    assert step(after, now=T0 + 1000) == [] and ("c1", "n1") in after.nodes


def test_a_node_deleted_without_an_agent_is_forgotten_lost_after_after_the_deletion() -> None:
    state = new_state(lost_after_s=LOST_AFTER)
    step(state, KubeNodesListed("c1", T0, (a_kube_node("k1"),)), now=T0)
    [lost] = step(state, KubeNodesListed("c1", T0 + 60, ()), now=T0 + 60)
    assert isinstance(lost, NodeLost)
    [gone] = step(state, now=T0 + 60 + LOST_AFTER)
    assert isinstance(gone, NodeForgotten) and gone.at == T0 + 60 + LOST_AFTER


def test_a_lost_node_kubernetes_never_listed_is_never_forgotten_by_itself() -> None:
    state = new_state(lost_after_s=LOST_AFTER)
    a_lost_agent_node(state)  # plain agents, `chamber up`
    assert forgotten(step(state, now=T0 + 365 * 86400)) == []
    assert state.nodes[("c1", "n1")].status == NodeStatus.LOST


def test_a_lost_node_kubernetes_still_lists_is_not_forgotten_by_itself() -> None:
    state = new_state(lost_after_s=LOST_AFTER)
    step(state, KubeNodesListed("c1", T0, (a_kube_node("k1"),)), an_inventory("k1"), a_sample("k1", at=T0), now=T0)
    step(state, now=T0 + LOST_AFTER + 1)
    listed_again = KubeNodesListed("c1", T0 + 500, (a_kube_node("k1"),))
    assert forgotten(step(state, listed_again, now=T0 + 1000)) == []


def test_a_node_deleted_then_listed_again_within_the_grace_is_kept() -> None:
    state = new_state(lost_after_s=LOST_AFTER)
    step(state, KubeNodesListed("c1", T0, (a_kube_node("k1"),)), an_inventory("k1"), a_sample("k1", at=T0), now=T0)
    step(state, KubeNodesListed("c1", T0 + 10, ()), now=T0 + 10)
    step(state, now=T0 + LOST_AFTER + 1)
    back = KubeNodesListed("c1", T0 + LOST_AFTER + 20, (a_kube_node("k1"),))  # made again under its name
    assert forgotten(step(state, back, now=T0 + 10 * LOST_AFTER)) == []
    assert ("c1", "k1") in state.nodes


# -- discovery: an operator's forget -----------------------------------------------------------------


def test_forget_refuses_a_healthy_node_and_one_that_does_not_exist() -> None:
    state = new_state(lost_after_s=LOST_AFTER)
    step(state, an_inventory("n1"), a_sample("n1", at=T0), now=T0)
    with pytest.raises(ForgetRefused, match="node n1 is HEALTHY: only a lost node can be forgotten"):
        forget(state, "c1", "n1", T0 + 1, "alice")
    with pytest.raises(ForgetRefused, match="no node n9 in cluster c1") as unknown:
        forget(state, "c1", "n9", T0 + 1, "alice")
    assert unknown.value.kind == "unknown"
    assert ("c1", "n1") in state.nodes


def test_forget_refuses_a_lost_node_kubernetes_still_lists() -> None:
    state = new_state(lost_after_s=LOST_AFTER)
    step(state, KubeNodesListed("c1", T0, (a_kube_node("k1"),)), an_inventory("k1"), a_sample("k1", at=T0), now=T0)
    step(state, now=T0 + LOST_AFTER + 1)
    with pytest.raises(ForgetRefused, match="still a Kubernetes Node"):
        forget(state, "c1", "k1", T0 + 100, "alice")


def test_a_forgotten_node_whose_agent_reports_again_is_discovered_anew() -> None:
    state = new_state(lost_after_s=LOST_AFTER)
    a_lost_agent_node(state)
    event = forget(state, "c1", "n1", T0 + 100, "alice", "decommissioned")
    assert (event.by, event.reason, event.at) == ("alice", "decommissioned", T0 + 100)
    evolve(state, event)
    assert state.nodes == {} and step(state, now=T0 + 200) == []
    [found] = step(state, an_inventory("n1", at=T0 + 300), a_sample("n1", at=T0 + 300), now=T0 + 300)
    assert isinstance(found, NodeDiscovered) and found.at == T0 + 300 and len(found.gpus) == 8


def test_a_node_heard_from_after_the_forget_was_decided_is_discovered_anew() -> None:
    state = new_state(lost_after_s=LOST_AFTER)
    a_lost_agent_node(state)
    event = forget(state, "c1", "n1", T0 + 100, "alice")
    evolve(state, a_sample("n1", at=T0 + 101))  # the agent came back before the forget was folded
    evolve(state, event)
    [found] = step(state, now=T0 + 102)
    assert isinstance(found, NodeDiscovered) and found.at == T0 + 101


# -- every fold drops the node ------------------------------------------------------------------------


def _lost(node: str, at: float = 50.0) -> NodeLost:
    return NodeLost(cluster="c1", node=node, at=at, last_seen_at=at - 30, reason="silent")


def _forgotten(node: str, at: float = 100.0) -> NodeForgotten:
    return NodeForgotten(cluster="c1", node=node, at=at, reason="scaled down", by="discovery")


def test_the_scheduler_drops_a_forgotten_node_and_reuses_its_id() -> None:
    from services.scheduler.core.state import JobState
    from tests.scheduler_builders import Driver, a_job, a_node

    d = Driver().given(a_node("n1"), a_node("n2"), a_job("j1", gpus=8))
    d.cycle(now=10.0)
    held = d.where("j1")
    [on] = held
    other = "n1" if on == "n2" else "n2"
    nid = d.state.nodes[("c1", on)].nid
    before = d.state.capacity_epoch
    # lost and forgotten before the scheduler requeued its job: the job keeps a claim, displaced
    d.given(_lost(on), _forgotten(on))
    assert ("c1", on) not in d.state.nodes and d.state.free_nids == [nid]
    assert d.state.claims[("c1", on)] == dict.fromkeys(range(8), "j1") and "j1" in d.state.displaced
    assert d.state.capacity_epoch > before and d.state.node_by_id[nid].gpus == {}
    d.cycle(now=20.0)
    assert d.where("j1") == {other: list(range(8))} and d.state.jobs["j1"].state is JobState.RUNNING
    assert not d.state.claims.get(("c1", on)) and "j1" not in d.state.displaced
    d.given(a_node("n3"))  # the next node discovered takes the forgotten node's id
    assert d.state.nodes[("c1", "n3")].nid == nid and d.state.node_by_id[nid].name == "n3"
    assert d.state.free_nids == [] and len(d.state.node_by_id) == 2
    d.given(a_job("j2", gpus=8))
    d.cycle(now=30.0)
    assert d.where("j2") == {"n3": list(range(8))}


def test_the_quota_service_drops_a_forgotten_node() -> None:
    from services.quota.core import QuotaState
    from services.quota.core import evolve as quota_evolve
    from tests.scheduler_builders import a_node

    s = QuotaState()
    for e in (a_node("n1"), a_node("n2"), _lost("n2")):
        quota_evolve(s, e)
    installed = s.pool_installed("default")
    quota_evolve(s, _forgotten("n2"))
    assert set(s.nodes) == {("c1", "n1")} and s.pool_installed("default") == installed == 8


def test_the_gateway_drops_a_forgotten_node_from_its_views() -> None:
    from services.gateway import core as gateway
    from services.gateway import views
    from tests.scheduler_builders import a_node

    state = gateway.GatewayState()
    for e in (a_node("n1"), a_node("n2"), _lost("n2")):
        gateway.evolve(state, e)
    assert views.fleet(state).nodes_by_status == {"healthy": 1, "lost": 1}
    gateway.evolve(state, _forgotten("n2"))
    assert set(state.nodes) == {("c1", "n1")}
    assert views.fleet(state).nodes_by_status == {"healthy": 1}
    assert gateway.efficiency(state).total == 8
    assert any(entry.kind == "node_forgotten" for entry in state.timeline)


def test_health_drops_a_forgotten_node_and_decides_nothing_about_it() -> None:
    from services.health.core import decide as health_decide
    from services.health.core import evolve as health_evolve
    from services.health.core import new_state as health_state
    from services.health.policy import load_policy
    from tests.health_builders import a_fleet

    state = health_state(load_policy())
    for e in a_fleet(2):
        health_evolve(state, e)
    for d in health_decide(state, T0):
        health_evolve(state, d)
    health_evolve(state, a_fault("n000", xid=79, at=T0))
    for d in health_decide(state, T0):
        health_evolve(state, d)
    assert state.nodes[("c1", "n000")].isolated is not None
    health_evolve(state, NodeLost(cluster="c1", node="n000", at=T0 + 60, last_seen_at=T0))
    health_evolve(state, NodeForgotten(cluster="c1", node="n000", at=T0 + 120))
    assert ("c1", "n000") not in state.nodes and ("c1", "n001") in state.nodes
    assert not any(t[:2] == ("c1", "n000") for t in state.restores)
    assert health_decide(state, T0 + 86400) == []  # no probation restore of a node that is gone


def test_billing_drops_a_forgotten_nodes_gpus_once_their_time_is_accrued() -> None:
    from services.billing.core import BillingState
    from services.billing.core import decide as billing_decide
    from services.billing.core import evolve as billing_evolve

    t = 1_767_225_600.0
    gpus = [GpuInfo(index=i, uuid=f"GPU-n{n}-{i}", model="H100-80GB") for n in (1, 2) for i in range(2)]
    state = BillingState(period_s=3600, settle_s=30)
    for i, e in enumerate(
        [
            NodeDiscovered(cluster="c1", node="n1", at=t, gpus=gpus[:2]),
            NodeDiscovered(cluster="c1", node="n2", at=t, gpus=gpus[2:]),
            NodeLost(cluster="c1", node="n2", at=t + 600, last_seen_at=t + 570),
            NodeForgotten(cluster="c1", node="n2", at=t + 700),
        ]
    ):
        billing_evolve(state, e, f"in-{i}")
    # its idle time before it was lost is not accrued yet: the model that prices it is kept
    assert ("c1", "n2", 0) in state.gpu_model and ("c1", "n2") in state.forgotten
    decisions = billing_decide(state, t + 3600 + 30)
    idle = sum(e.gpu_seconds for e, _ in decisions if getattr(e, "job_id", "x") is None)
    assert idle == pytest.approx(2 * 3600 + 2 * 600)
    for e, i in decisions:
        billing_evolve(state, e, i)
    assert not any(g[:2] == ("c1", "n2") for g in state.gpu_model) and ("c1", "n2") not in state.node_labels
    assert state.forgotten == set() and ("c1", "n1", 0) in state.gpu_model


def test_perf_drops_a_forgotten_nodes_samples_and_labels() -> None:
    from services.perf.core import PerfState
    from services.perf.core import evolve as perf_evolve
    from tests.scheduler_builders import a_node

    state = PerfState()
    for e in (a_node("n1", rack="r1"), a_node("n2", rack="r2"), a_sample("n2", at=T0), _lost("n2")):
        perf_evolve(state, e)
    assert ("c1", "n2") in state.nodes
    perf_evolve(state, _forgotten("n2"))
    assert set(state.nodes) == {("c1", "n1")} and state.nodes[("c1", "n1")].labels == {"rack": "r1"}
