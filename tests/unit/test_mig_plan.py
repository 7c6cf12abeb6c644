"""The MIG reconfiguration planner: serve the queue, disturb no running instance, never toggle MIG mode
on a GPU with work, at most one change per GPU per hour."""

from __future__ import annotations

from collections import Counter

from services.scheduler.core.mig import MIG_MODELS, used_mask
from services.scheduler.core.mig_plan import MigGpu, mig_config_name, plan

H100 = "H100-80GB"
NOW = 10_000.0


def gpu(i: int = 0, mig: bool = True, layout: tuple = (), busy: tuple = (), **kw: object) -> MigGpu:  # type: ignore[type-arg]
    return MigGpu(("c1", "n1", i), H100, mig, tuple(layout), frozenset(busy), **kw)  # type: ignore[arg-type]


def test_idle_instances_it_needs_are_drained_and_running_ones_kept() -> None:
    running, idle = ("4g.40gb", 0), ("3g.40gb", 4)
    [change] = plan([gpu(layout=(running, idle), busy=(running,))], Counter({"1g.10gb": 3}), NOW)
    assert change.drain == (idle,)
    assert running in change.after and not change.enable_mig
    assert set(change.create) == {("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6)}
    table = MIG_MODELS[H100]
    slices = sum(table.profiles[p].memory for p, _ in change.after)
    assert bin(used_mask(table, change.after)).count("1") == slices == 7, "no two instances share a slice"


def test_existing_idle_instances_serve_before_any_change() -> None:
    assert plan([gpu(layout=(("1g.10gb", 0),))], Counter({"1g.10gb": 1}), NOW) == []


def test_mig_mode_is_never_toggled_on_a_gpu_with_work() -> None:
    assert plan([gpu(mig=False, whole_busy=True)], Counter({"1g.10gb": 2}), NOW) == []
    [change] = plan([gpu(mig=False)], Counter({"1g.10gb": 2}), NOW)
    assert change.enable_mig and len(change.create) == 2
    busy_mig = gpu(layout=(("1g.10gb", 0),), busy=(("1g.10gb", 0),))
    assert all(not c.disable_mig for c in plan([busy_mig], Counter(), NOW, whole_demand=1))
    [off] = plan([gpu(layout=(("1g.10gb", 0),))], Counter(), NOW, whole_demand=1)
    assert off.disable_mig and off.after == ()


def test_at_most_one_change_per_gpu_per_hour() -> None:
    recent = gpu(mig=False, last_change=NOW - 1800)
    assert plan([recent], Counter({"1g.10gb": 1}), NOW) == []
    assert len(plan([gpu(mig=False, last_change=NOW - 3600)], Counter({"1g.10gb": 1}), NOW)) == 1


def test_idle_whole_gpus_stay_whole_while_whole_gpu_requests_wait() -> None:
    assert plan([gpu(mig=False)], Counter({"1g.10gb": 1}), NOW, whole_demand=1) == []


def test_the_layout_serves_the_queue_and_leaves_room_for_what_else_is_queued() -> None:
    [change] = plan([gpu(mig=False)], Counter({"3g.40gb": 1, "4g.40gb": 1}), NOW)
    assert sorted(change.create) == [("3g.40gb", 4), ("4g.40gb", 0)]
    [one] = plan([gpu(mig=False)], Counter({"2g.20gb": 2, "4g.40gb": 1}), NOW)
    assert sum(MIG_MODELS[H100].share_milli(p) for p, _ in one.create) >= 1000 - 200


def test_a_plan_becomes_an_event() -> None:
    [change] = plan([gpu(mig=False)], Counter({"1g.10gb": 2}), NOW)
    event = change.event(NOW, reason="queue")
    assert (event.cluster, event.node, event.gpu_index, event.enable_mig) == ("c1", "n1", 0, True)
    assert [i.profile for i in event.create] == ["1g.10gb", "1g.10gb"]
    assert event.mig_config == mig_config_name(change.after) == "custom-2x1g.10gb"


def test_a_simulated_fleet_keeps_the_rules() -> None:
    """bench/mig.py's simulation, short: layouts change under the planner's rules only."""
    from bench.mig import most_changes_in_an_hour, trace, with_mig

    run, gpus = with_mig(trace(seed=3, hours=6, load=2.0), hours=6)
    assert run.started["small"] > 0 and run.changes > 0
    assert run.disturbed == 0 and run.toggled_with_work == 0
    assert most_changes_in_an_hour([g.changes for g in gpus]) <= 1


def test_the_simulated_fleet_through_the_live_cycle_keeps_the_rules() -> None:
    """bench/mig.py --live, short: the scheduler's own cycle plans layouts, and they keep the rules."""
    from bench.mig import live, most_changes_in_an_hour, trace

    run = live(trace(seed=3, hours=2, load=2.0), hours=2)
    assert run.started["small"] > 0 and run.changes
    assert run.disturbed == 0 and run.stopped == 0
    assert most_changes_in_an_hour(list(run.changes.values())) <= 1


def test_through_the_gpu_operator_only_gpus_without_running_instances_change() -> None:
    running, idle = ("4g.40gb", 0), ("3g.40gb", 4)
    busy = gpu(0, layout=(running, idle), busy=(running,))
    assert plan([busy], Counter({"1g.10gb": 3}), NOW, rewrites_whole_gpu=True) == []
    [change] = plan([busy, gpu(1, mig=False)], Counter({"1g.10gb": 3}), NOW, rewrites_whole_gpu=True)
    assert change.gpu.key[2] == 1
