"""The warehouse history's pure parts: the window and step, and rows shaped into the API's points."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.gateway.history import CostPoint, cost_series, points, window

T = 1_800_000_000.0  # a whole minute


def test_the_window_ends_at_the_last_whole_minute_and_an_hour_is_per_minute() -> None:
    assert window(T - 3600 + 5, T + 59) == (T - 3600, T, 60)


@given(st.floats(min_value=60, max_value=366 * 86400), st.floats(min_value=0, max_value=59.9))
def test_a_window_never_has_more_than_720_whole_steps(span: float, offset: float) -> None:
    since, until, step = window(T - span, T + offset)
    assert until == T and since <= until and step % 60 == 0
    assert (until - since) / step <= 720


def test_cost_accumulates_per_team_and_totals_put_the_largest_first() -> None:
    rows = [
        {"at": T, "who": "nlp", "cost": 1.0, "gpu_seconds": 3600.0},
        {"at": T, "who": "vision", "cost": 2.0, "gpu_seconds": 7200.0},
        {"at": T + 300, "who": "nlp", "cost": 3.0, "gpu_seconds": 3600.0},
    ]
    series, totals = cost_series(rows)
    assert [(p.at, p.team, p.cost) for p in series] == [(T, "nlp", 1.0), (T, "vision", 2.0), (T + 300, "nlp", 4.0)]
    assert [(t.team, t.cost, t.gpu_hours) for t in totals] == [("nlp", 4.0, 2.0), ("vision", 2.0, 2.0)]


def test_points_are_step_averages_with_the_queue_and_the_cost_so_far() -> None:
    efficiency = [
        {"at": T, "minutes": 1, "capacity_s": 480.0, "allocated_s": 240.0, "busy_s": 120.0},
        {"at": T + 60, "minutes": 1, "capacity_s": 480.0, "allocated_s": 480.0, "busy_s": 480.0},
        {"at": T + 120, "minutes": 1, "capacity_s": 0.0, "allocated_s": 0.0, "busy_s": 0.0},  # all isolated
    ]
    cost = [CostPoint(at=T + 60, team="nlp", cost=1.5), CostPoint(at=T + 120, team="nlp", cost=2.5)]
    got = points(efficiency, [{"at": T + 60, "depth": 3}], cost)
    assert [(p.capacity, p.allocated, p.busy, p.idle) for p in got] == [(8, 4, 2.0, 4), (8, 8, 8.0, 0), (0, 0, 0.0, 0)]
    assert [(p.efficiency_score, p.idle_ratio) for p in got] == [(0.25, 0.5), (1.0, 0.0), (0.0, 0.0)]
    assert [p.queue_depth for p in got] == [0, 3, 0]
    assert [p.cost_total for p in got] == [1.5, 2.5, 2.5]  # cost of the periods that ended by the step's end
