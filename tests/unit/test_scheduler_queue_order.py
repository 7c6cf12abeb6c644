"""`chamber queue` lists queued jobs in the order the next cycle takes them (issue 19): age and the
starvation guard included, the same key the cycle sorts by, not the static class/fair-share order."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from events import PriorityClass
from services.scheduler.core import CHAMBER, Admit, explain, queue_rows, schedule
from services.scheduler.core.explain import queue_order
from services.scheduler.core.policy import Policy
from tests.scheduler_builders import Driver, a_job, a_node, done

FIXED = {"gpus": 8, "preemptible": False}  # preemption goes by class alone: keep it out of the order


def _busy_node_with(*jobs: tuple[str, str, float]) -> Driver:
    """One 8-GPU node held by a running job; then (id, priority, submit time) jobs of 8 GPUs each."""
    d = Driver().given(a_node("n1"), a_job("busy", at=0, priority="low", **FIXED))  # type: ignore[arg-type]
    d.cycle(now=0.0)
    assert d.state_of("busy") == "running"
    d.given(*(a_job(j, at=at, priority=p, **FIXED) for j, p, at in jobs))  # type: ignore[arg-type]
    return d


def _admitted(d: Driver, now: float, policy: Policy) -> str:
    """Free the node; the one job the next cycle starts."""
    d.given(done("busy", at=now))
    [admit] = [x for x in schedule(d.state, now, None, policy=policy).decisions if isinstance(x, Admit)]
    return admit.job_id


def test_an_aged_job_is_listed_where_the_cycle_takes_it_ahead_of_fresher_work_of_a_higher_class() -> None:
    aging = replace(CHAMBER, starvation_bound_s=None, age_weight=1500.0)  # one and a half classes at the cap
    now = aging.age_cap_s + 10
    d = _busy_node_with(("old-normal", "normal", 1.0), ("new-high", "high", now))
    assert [k[3] for k in d.state.queue()] == ["new-high", "old-normal"]  # the static order says otherwise
    rows = [r for r in queue_rows(d.state, {}, now=now, policy=aging) if r["state"] == "pending"]
    assert [(r["id"], r["position"]) for r in rows] == [("old-normal", 1), ("new-high", 2)]
    assert rows[0]["priority_score"] > rows[1]["priority_score"]
    assert rows[0]["age_s"] == now - 1.0 and rows[1]["age_s"] == 0.0
    assert rows[0]["protected"] is False and rows[0]["protected_since"] is None  # no guard in this policy
    found = explain(d.state, "old-normal", {}, now=now, policy=aging)
    assert found is not None and "position 1 of 2" in found["text"]
    assert _admitted(d, now, aging) == "old-normal"


def test_a_protected_job_is_listed_first_of_its_class_and_never_ahead_of_a_higher_class() -> None:
    guarded = replace(CHAMBER, starvation_bound_s=100.0, age_weight=0.0)
    d = _busy_node_with(("old-low", "low", 0.0), ("later-low", "low", 10.0), ("fresh-high", "high", 150.0))
    rows = {r["id"]: r for r in queue_rows(d.state, {}, now=150.0, policy=guarded)}
    assert rows["old-low"]["protected"] is True and rows["fresh-high"]["protected"] is False
    assert [rows[j]["position"] for j in ("fresh-high", "old-low", "later-low")] == [1, 2, 3]
    # one class more per guard_lift_every_s protected: two of them lift a low job to high's class
    lifting = replace(guarded, guard_lift_every_s=100.0)
    assert {r["id"]: r["position"] for r in queue_rows(d.state, {}, now=150.0, policy=lifting)}["old-low"] == 2
    # ... past unprotected work of the class it reaches, never past that class's protected work
    later = {r["id"]: r["position"] for r in queue_rows(d.state, {}, now=300.0, policy=lifting)}
    assert [later[j] for j in ("fresh-high", "old-low", "later-low")] == [1, 2, 3]  # fresh-high protected at 250
    d2 = _busy_node_with(("old-low", "low", 0.0), ("new-high", "high", 250.0))
    passed = {r["id"]: r["position"] for r in queue_rows(d2.state, {}, now=300.0, policy=lifting)}
    assert [passed[j] for j in ("old-low", "new-high")] == [1, 2]
    assert _admitted(d, 150.0, guarded) == "fresh-high"


def test_a_job_protected_by_the_starvation_guard_is_listed_first_when_the_guard_lifts_classes() -> None:
    guarded = replace(CHAMBER, starvation_bound_s=100.0, age_weight=0.0, guard_lifts_classes=2)
    d = _busy_node_with(("old-low", "low", 0.0), ("fresh-high", "high", 150.0))
    rows = {r["id"]: r for r in queue_rows(d.state, {}, now=150.0, policy=guarded)}
    assert rows["old-low"]["position"] == 1 and rows["old-low"]["protected"] is True
    assert rows["old-low"]["protected_since"] == 100.0
    assert rows["fresh-high"]["position"] == 2 and rows["fresh-high"]["protected"] is False
    assert rows["fresh-high"]["protected_since"] == 250.0
    assert rows["busy"]["position"] is None and rows["busy"]["protected"] is None  # running: not in the queue
    assert _admitted(d, 150.0, guarded) == "old-low"


def test_without_a_multifactor_order_there_is_no_priority_score() -> None:
    fifo_order = replace(CHAMBER, order="fifo")
    d = _busy_node_with(("a", "high", 2.0), ("b", "low", 1.0))
    rows = [r for r in queue_rows(d.state, {}, now=5.0, policy=fifo_order) if r["state"] == "pending"]
    assert [(r["id"], r["priority_score"]) for r in rows] == [("b", None), ("a", None)]


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(st.sampled_from([p.value for p in PriorityClass]), st.floats(min_value=1.0, max_value=200_000.0)),
        min_size=1,
        max_size=8,
    ),
    now_after=st.floats(min_value=0.0, max_value=200_000.0),
)
def test_the_first_listed_job_is_the_one_the_next_cycle_starts(jobs: list[tuple[str, float]], now_after: float) -> None:
    d = _busy_node_with(*((f"j{i}", p, at) for i, (p, at) in enumerate(jobs)))
    now = max(at for _, at in jobs) + now_after
    rows = [r for r in queue_rows(d.state, {}, now=now, policy=CHAMBER) if r["position"] is not None]
    assert [r["id"] for r in rows] == [k[3] for k in queue_order(d.state, now, CHAMBER)]
    assert [r["position"] for r in rows] == list(range(1, len(jobs) + 1))
    assert _admitted(d, now, CHAMBER) == rows[0]["id"]
