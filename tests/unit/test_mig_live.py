"""The MIG planner driven by the live cycle (services/scheduler/core/mig_live.py): on nodes the GPU
Operator's MIG manager serves (the `nvidia.com/mig.config` label), MIG jobs go only into instances of
applied layouts; when the queue finds none, the cycle plans a layout (MigLayoutPlanned) on a node
without GPU work, the node takes nothing while the change is pending, MigLayoutApplied opens the new
instances, a GPU changes at most once an hour, and whole-GPU work is never placed on a MIG GPU."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from events import GpuShare, ShareMode
from events.fleet import MigInstance, MigLayoutApplied, MigLayoutPlanned
from services.scheduler.core import CHAMBER, Admit, Preempt, schedule
from services.scheduler.core.decisions import PlanLayout
from services.scheduler.core.mig import MigModel, mig_model, occupancy, starts_in_mask
from services.scheduler.core.mig_live import MANAGED_LABEL
from tests.scheduler_builders import Driver, a_job, a_node, a_quota, done

MIG_LABEL = {MANAGED_LABEL: "all-disabled"}


def _h100() -> MigModel:
    table = mig_model("H100-80GB")
    assert table is not None
    return table


H100 = _h100()


def layout_mask(layout: Iterable[MigInstance]) -> int:
    mask = 0
    for i in layout:
        mask |= occupancy(H100, i.profile, i.start)
    return mask


def mig(profile: str) -> GpuShare:
    return GpuShare(mode=ShareMode.MIG, mig_profile=profile)


def planned(d: Driver) -> list[MigLayoutPlanned]:
    return [e for e in d.log if isinstance(e, MigLayoutPlanned)]


def applied(e: MigLayoutPlanned, at: float) -> MigLayoutApplied:
    """What the actuator reports once the GPU Operator has applied the plan."""
    return MigLayoutApplied(
        cluster=e.cluster,
        node=e.node,
        gpu_index=e.gpu_index,
        at=at,
        layout=list(e.after),
        mig_enabled=not e.disable_mig,
        planned_at=e.at,
    )


def managed_fleet(*nodes: tuple[str, int]) -> Driver:
    d = Driver().given(a_quota("vision", 16))
    for name, gpus in nodes:
        d.given(a_node(name, gpus, model="H100-80GB", **MIG_LABEL))
    return d


def test_a_mig_job_on_a_managed_node_waits_for_a_planned_layout_then_runs_in_it() -> None:
    d = managed_fleet(("n1", 2))
    d.given(*(a_job(f"s{i}", gpus=1, share=mig("1g.10gb"), at=1 + i) for i in range(3)))
    cycle = d.cycle(now=10)
    assert not [x for x in cycle.decisions if isinstance(x, Admit)]  # no instance exists yet
    [plan] = planned(d)  # one GPU: the node's last whole GPU is not turned to MIG ahead of the queue
    assert (plan.node, plan.enable_mig, plan.disable_mig) == ("n1", True, False)
    made = Counter(i.profile for i in plan.create)
    assert set(made) == {"1g.10gb"} and made["1g.10gb"] >= 3  # the queue's, and its free slices filled
    assert not starts_in_mask(H100, layout_mask(plan.after), "1g.10gb")
    assert plan.drain == [] and plan.before == []
    assert plan.mig_config and "3 queued" not in plan.reason and "1g.10gb" in plan.reason
    # while the change is pending the node takes nothing, and nothing more is planned
    d.given(a_job("w", gpus=1, at=11))
    d.cycle(now=20)
    assert d.state_of("w") == "pending" and len(planned(d)) == 1
    # applied: the three instances open and the jobs run in them; the other GPU is whole again
    d.given(applied(plan, at=30))
    d.cycle(now=40)
    for i in range(3):
        [p] = d.state.jobs[f"s{i}"].placements
        assert (p.node, p.gpu_indices, p.mig_profile) == ("n1", [plan.gpu_index], "1g.10gb")
        assert ("1g.10gb", p.mig_start) in {(x.profile, x.start) for x in plan.after}
    assert d.where("w") == {"n1": [1 - plan.gpu_index]}


def test_mig_jobs_use_the_layouts_instances_and_whole_gpu_work_never_lands_on_a_mig_gpu() -> None:
    d = managed_fleet(("n1", 1))
    layout = [MigInstance(profile="3g.40gb", start=0), MigInstance(profile="3g.40gb", start=4)]
    d.given(MigLayoutApplied(cluster="c1", node="n1", gpu_index=0, at=1, layout=layout))
    # a profile the layout has goes into one of its instances, with no change
    d.given(a_job("big", gpus=1, share=mig("3g.40gb"), at=3))
    cycle = d.cycle(now=10)
    [p] = d.state.jobs["big"].placements
    assert p.mig_start in (0, 4) and not [x for x in cycle.decisions if isinstance(x, PlanLayout)]
    # whole-GPU work does not take the GPU's other, idle, half; nor does a profile the layout lacks,
    # although its slices are free; and the GPU holds work, so no change is planned for either
    d.given(a_job("whole", gpus=1, at=4), a_job("small", gpus=1, share=mig("1g.10gb"), at=5))
    d.cycle(now=11)
    assert d.state_of("whole") == "pending" and d.state_of("small") == "pending"
    assert planned(d) == []
    d.given(a_job("big2", gpus=1, share=mig("3g.40gb"), at=6))
    d.cycle(now=12)
    [q] = d.state.jobs["big2"].placements
    assert {p.mig_start, q.mig_start} == {0, 4}


def test_a_node_with_gpu_work_is_never_changed_and_a_gpu_changes_at_most_once_an_hour() -> None:
    d = managed_fleet(("a", 1), ("b", 1))
    d.given(a_job("train", gpus=1, at=1))
    d.cycle(now=5)
    [node] = d.where("train")
    d.given(a_job("s0", gpus=1, share=mig("2g.20gb"), at=6))
    d.cycle(now=10)
    plans = planned(d)
    assert [p.node for p in plans] == [{"a": "b", "b": "a"}[node]]  # the node holding work keeps its layout
    d.given(applied(plans[0], at=20))
    d.cycle(now=30)
    assert d.state_of("s0") == "running"
    d.given(done("s0", at=40))
    # within the hour the same GPU is not changed again, whatever the queue asks
    d.given(a_job("big", gpus=1, share=mig("7g.80gb"), at=41))
    d.cycle(now=50)
    assert len(planned(d)) == len(plans)
    d.cycle(now=plans[0].at + 3600, policy=CHAMBER)  # a full cycle (the service runs one every --full-every)
    later = planned(d)[len(plans) :]
    assert [(p.node, p.gpu_index) for p in later] == [(plans[0].node, plans[0].gpu_index)]
    assert [i.profile for i in later[0].after] == ["7g.80gb"]
    assert later[0].drain == plans[0].after  # every instance idle: drained, nothing disturbed


def test_waiting_whole_gpu_jobs_turn_an_idle_mig_gpu_back_into_a_whole_one() -> None:
    d = managed_fleet(("n1", 1))
    d.given(
        MigLayoutApplied(cluster="c1", node="n1", gpu_index=0, at=1, layout=[MigInstance(profile="7g.80gb", start=0)])
    )
    d.given(a_job("whole", gpus=1, at=2))
    d.cycle(now=4000)
    [plan] = planned(d)
    assert plan.disable_mig and plan.mig_config == "all-disabled"
    d.given(applied(plan, at=4010))
    d.cycle(now=4020)
    assert d.where("whole") == {"n1": [0]}


def test_nodes_without_the_label_keep_placing_instances_at_any_free_legal_start() -> None:
    d = Driver().given(a_quota("vision", 8), a_node("plain", 1, model="H100-80GB"))
    d.given(a_job("s", gpus=1, share=mig("1g.10gb"), at=1))
    cycle = d.cycle(now=10)
    assert d.state_of("s") == "running" and not [x for x in cycle.decisions if isinstance(x, PlanLayout)]


def test_a_cycle_that_plans_leaves_the_state_as_it_found_it() -> None:
    d = managed_fleet(("n1", 2))
    d.given(a_job("s", gpus=1, share=mig("1g.10gb"), at=1))
    before = d.state.capacity.digest()
    cycle = schedule(d.state, 10.0)
    assert [type(x) for x in cycle.decisions] == [PlanLayout]
    assert d.state.capacity.digest() == before


def test_a_pending_change_counts_as_made_so_the_same_queue_is_not_planned_for_twice() -> None:
    d = managed_fleet(("a", 1), ("b", 1))
    d.given(*(a_job(f"s{i}", gpus=1, share=mig("1g.10gb"), at=1 + i) for i in range(2)))
    d.cycle(now=10)
    assert len(planned(d)) == 1
    d.cycle(now=20, policy=CHAMBER)  # a full cycle: the jobs still wait, for the instances being made
    assert len(planned(d)) == 1


def test_a_gpu_given_whole_work_in_the_same_cycle_is_not_planned_for() -> None:
    d = managed_fleet(("a", 1))
    d.given(a_job("whole", gpus=1, at=1), a_job("small", gpus=1, share=mig("1g.10gb"), at=2))
    d.cycle(now=10)
    assert d.where("whole") == {"a": [0]} and planned(d) == []


def test_with_no_node_free_the_cheapest_checkpointed_node_is_drained_for_more_urgent_mig_work() -> None:
    d = managed_fleet(("a", 1), ("b", 1), ("c", 1))
    d.given(a_job("ckpt", gpus=1, priority="low", checkpoint=600, at=1))  # loses at most 10 minutes
    d.given(a_job("long", gpus=1, priority="low", at=2))  # loses everything since it started
    d.given(a_job("mine", gpus=1, priority="high", preemptible=False, at=3))  # not preemptible
    d.cycle(now=10)
    nodes = {j: next(iter(d.where(j))) for j in ("ckpt", "long", "mine")}
    d.given(a_job("small", gpus=1, share=mig("1g.10gb"), priority="high", at=4000))
    cycle = d.cycle(now=4000)
    preempted = [x for x in cycle.decisions if isinstance(x, Preempt)]
    assert [(p.job_id, p.preemptor) for p in preempted] == [("ckpt", "small")]
    assert "drained for a MIG layout change" in preempted[0].detail and preempted[0].lost_work_gpu_s < 600
    [plan] = planned(d)
    assert plan.node == nodes["ckpt"] and plan.enable_mig
    assert d.state_of("ckpt") == "suspended" and d.state_of("small") == "pending"
    # the suspended job does not go back onto the node while it is being changed, nor is another drained
    d.cycle(now=4010, policy=CHAMBER)
    assert d.state_of("ckpt") == "suspended" and len(planned(d)) == 1
    assert d.state_of("long") == "running" and d.state_of("mine") == "running"


def test_work_the_mig_job_may_not_preempt_is_never_drained() -> None:
    d = managed_fleet(("a", 1))
    d.given(a_job("peer", gpus=1, priority="normal", at=1))
    d.cycle(now=10)
    d.given(a_job("small", gpus=1, share=mig("1g.10gb"), priority="normal", at=20))  # same team, same priority
    cycle = d.cycle(now=4000, policy=CHAMBER)
    assert not [x for x in cycle.decisions if isinstance(x, Preempt)] and planned(d) == []


def test_a_gpu_turned_to_mig_is_filled_with_the_queued_profiles_in_proportion_and_serves_the_queue() -> None:
    d = managed_fleet(("n1", 2))
    asked = ["1g.10gb", "1g.10gb", "2g.20gb"]
    d.given(*(a_job(f"s{i}", gpus=1, share=mig(p), at=1 + i) for i, p in enumerate(asked)))
    d.cycle(now=10)
    plans = planned(d)
    made = Counter(i.profile for p in plans for i in p.after)
    assert set(made) == set(asked) and made - Counter(asked) and not Counter(asked) - made
    assert made["1g.10gb"] > made["2g.20gb"]  # asked twice as often
    for plan in plans:  # no free slice left that a profile in use would fit
        assert not any(starts_in_mask(H100, layout_mask(plan.after), p) for p in asked)
    d.given(*(applied(p, at=20) for p in plans))
    d.cycle(now=30)
    assert all(d.state_of(f"s{i}") == "running" for i in range(3))


def test_mig_mode_gets_the_mig_works_part_of_the_gpus_whole_nodes_at_a_time() -> None:
    d = managed_fleet(("a", 2), ("b", 2), ("c", 2), ("d", 2))
    d.given(a_job("t1", gpus=2, at=1), a_job("t2", gpus=2, at=2))  # whole-GPU work: half the GPUs
    d.cycle(now=5)
    busy = {n for j in ("t1", "t2") for n in d.where(j)}
    d.given(*(a_job(f"s{i}", gpus=1, share=mig("1g.10gb"), at=6 + i) for i in range(8)))
    d.cycle(now=10)
    plans = planned(d)
    # 8 x 1g.10gb (about one GPU) against 4 whole GPUs: MIG's part is 2 of the 8 GPUs, one node's
    assert len({p.node for p in plans}) == 1 and {p.node for p in plans}.isdisjoint(busy)
    assert sorted(p.gpu_index for p in plans) == [0, 1] and all(p.enable_mig for p in plans)
    assert sum(n for p in plans for n in Counter(i.profile for i in p.create).values()) >= 8
    # whole-GPU work that comes next still finds a node of whole GPUs
    d.given(*(applied(p, at=20) for p in plans), a_job("t3", gpus=2, at=21))
    d.cycle(now=30)
    assert d.state_of("t3") == "running" and all(d.state_of(f"s{i}") == "running" for i in range(8))


def test_the_first_small_job_turns_one_whole_node_to_mig_not_the_idle_fleet() -> None:
    d = managed_fleet(("a", 2), ("b", 2), ("c", 2))
    d.given(a_job("s", gpus=1, share=mig("1g.10gb"), at=1))
    d.cycle(now=10)
    plans = planned(d)
    # planned ahead, within bounds: every GPU of one node (filled), the other nodes left whole
    assert len({p.node for p in plans}) == 1 and sorted(p.gpu_index for p in plans) == [0, 1]
    assert all(Counter(i.profile for i in p.after) == {"1g.10gb": 7} for p in plans)
    assert sum(p.reason.startswith("queued MIG jobs (1x1g.10gb)") for p in plans) == 1
