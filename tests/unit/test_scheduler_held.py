"""An isolation health's budget held back: the fault would have isolated the GPU or node, so new work
stays off it, while the work already there runs on (only an operator's confirm moves it)."""

from __future__ import annotations

from events import GpuIsolated, NodeIsolated
from events.fleet import IsolationDismissed, IsolationHeld
from services.scheduler.core import explain
from tests.scheduler_builders import Driver, a_job, a_node

REASON = "nic_down: NIC mlx5_0 down; held: the isolation budget is spent; confirm with `chamber health confirm n1`"


def held(node: str, gpu: int | None = None) -> IsolationHeld:
    action = "isolate_node" if gpu is None else "isolate_gpu"
    return IsolationHeld(cluster="c1", node=node, at=5.0, action=action, reason=REASON, gpu_index=gpu)


def test_new_work_stays_off_a_node_whose_isolation_is_held() -> None:
    d = Driver().given(a_node("n1"), a_node("n2"), held("n1"), a_job("j", gpus=8))
    d.cycle()
    assert d.where("j") == {"n2": list(range(8))}  # n1 comes first by node order
    d.given(a_job("k", gpus=1))
    d.cycle()
    assert d.state_of("k") == "pending"  # n1 is free but held; n2 is full


def test_a_held_gpu_is_not_given_out_and_work_on_it_runs_on_and_says_so() -> None:
    d = Driver().given(a_node("n1"), a_job("on-it", gpus=8))
    d.cycle()
    assert d.state_of("on-it") == "running"
    d.given(held("n1", gpu=3))
    d.cycle()
    assert d.state_of("on-it") == "running"  # not requeued: nothing was isolated yet
    text = explain(d.state, "on-it", d.waiting)["text"]  # type: ignore[index]
    assert "an isolation is held for n1 GPU 3 (nic_down: NIC mlx5_0 down; held:" in text
    d.given(a_job("on-it-done", gpus=1))  # a new one-GPU job while on-it holds 0-7
    d.cycle()
    assert d.state_of("on-it-done") == "pending"


def test_a_dismissed_hold_gives_the_gpus_back_and_a_confirmed_one_isolates() -> None:
    d = Driver().given(a_node("n1"), held("n1", gpu=3), a_job("a-seven", gpus=7), a_job("b-one", gpus=1))
    d.cycle()
    assert 3 not in d.where("a-seven")["n1"] and d.state_of("b-one") == "pending"
    d.given(IsolationDismissed(cluster="c1", node="n1", at=6.0, reason="dismissed", gpu_index=3))
    d.cycle(11.0)
    assert d.where("b-one") == {"n1": [3]}
    d2 = Driver().given(a_node("n1"), held("n1"))
    d2.given(NodeIsolated(cluster="c1", node="n1", at=7.0, reason="confirmed"))
    assert d2.state.nodes[("c1", "n1")].held == {}  # confirmed: an isolation now, no longer held
    d3 = Driver().given(a_node("n1"), held("n1", gpu=2))
    d3.given(GpuIsolated(cluster="c1", node="n1", gpu_index=2, at=7.0, reason="confirmed"))
    assert d3.state.nodes[("c1", "n1")].held == {}


def test_a_job_moved_off_a_failed_gpu_says_from_where_and_why() -> None:
    d = Driver().given(a_node("n1"), a_node("n2"), a_job("train", gpus=8))
    d.cycle()
    [(was, _)] = d.where("train").items()
    d.given(GpuIsolated(cluster="c1", node=was, gpu_index=0, at=5.0, reason="ecc_dbe: double-bit ECC error"))
    for t in (6.0, 7.0):
        d.cycle(t)
    text = explain(d.state, "train", d.waiting)["text"]  # type: ignore[index]
    assert d.state_of("train") == "running" and was not in d.where("train"), text
    assert f": moved here: a GPU or node it ran on went out of service ({was} GPU 0: ecc_dbe: double-bit" in text
