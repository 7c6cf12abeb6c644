"""The quota core: validation, usage, Slurm-style decayed fair share."""

from __future__ import annotations

import pytest

from events import JobCompleted, JobScheduled, NodeIsolated, Placement
from services.quota.core import QuotaRefused, QuotaState, decide, define_pool, evolve, fair_shares, rows, set_quota
from tests.scheduler_builders import a_job, a_node, a_quota

HOUR = 3600.0


def a_fleet(*events: object, half_life: float = HOUR) -> QuotaState:
    s = QuotaState(half_life_s=half_life)
    for e in (a_node("n1"), a_node("n2", model="A100"), *events):
        evolve(s, e)  # type: ignore[arg-type]
    return s


def run(job: str, at: float, pool: str = "default") -> JobScheduled:
    placements = [Placement(cluster="c1", node="n1", gpu_indices=[0])]
    return JobScheduled(job_id=job, at=at, team="?", placements=placements, pool=pool)


def test_invalid_quota_commands_are_refused_naming_the_field() -> None:
    s = a_fleet(a_quota("vision", 12))
    cases = [
        (dict(team="nlp", pool="gpu-h", gpus=1), "pool", "unknown pool 'gpu-h'"),
        (dict(team="nlp", pool="default", gpus=-1), "gpus", "0 or more"),
        (dict(team="nlp", pool="default", gpus=8), "gpus", "above its capacity of 16"),
        (dict(team="nlp", pool="default", gpus=2, lend_limit=3), "lend_limit", "above the guarantee"),
    ]
    for kwargs, field, text in cases:
        with pytest.raises(QuotaRefused, match=text) as refused:
            set_quota(s, **{"borrow_limit": None, "lend_limit": None, "weight": 1.0, "at": 0.0, **kwargs})  # type: ignore[arg-type]
        assert refused.value.field == field
    ok = set_quota(s, team="vision", pool="default", gpus=16, borrow_limit=None, lend_limit=None, weight=2, at=1)
    assert ok.guaranteed_gpus == 16  # a team may raise its own guarantee up to the capacity


def test_pools_select_nodes_and_isolation_shrinks_capacity() -> None:
    s = a_fleet()
    evolve(s, define_pool(s, name="ampere", gpu_model="A100", node_label=None, at=0))
    assert s.pool_capacity("ampere") == 8 and s.pool_capacity("default") == 8
    evolve(s, NodeIsolated(cluster="c1", node="n2", at=1, reason="x"))
    assert s.pool_capacity("ampere") == 0
    with pytest.raises(QuotaRefused, match="exactly one"):
        define_pool(s, name="p", gpu_model="A100", node_label="rack=a", at=0)
    with pytest.raises(QuotaRefused, match="KEY=VALUE"):
        define_pool(s, name="p", gpu_model=None, node_label="rack", at=0)


def test_fair_share_decays_with_the_half_life_and_orders_heavy_users_last() -> None:
    s = a_fleet(a_quota("a", 8), a_quota("b", 8), a_job("ja", team="a", gpus=8, at=0), run("ja", 0))
    shares = fair_shares(s, HOUR)
    assert shares[("default", "b")][0] == 1.0  # used nothing
    assert shares[("default", "a")][0] == pytest.approx(2 ** (-1 / 0.5))  # all the usage, half the share
    used = shares[("default", "a")][1]
    assert used == pytest.approx(8 * HOUR / 2 / __import__("math").log(2))  # exact integral over one half-life
    evolve(s, JobCompleted(job_id="ja", at=HOUR))
    assert fair_shares(s, 2 * HOUR)[("default", "a")][1] == pytest.approx(used / 2)  # decayed by half


def test_factors_are_published_when_they_move_and_rows_follow_the_contract() -> None:
    s = a_fleet(a_quota("a", 8, borrow=4), a_job("ja", team="a", gpus=8, at=0), run("ja", 0))
    first = decide(s, 10.0)
    assert [(e.team, e.factor) for e, _ in first] == [("a", 0.5)]
    for e, _ in first:
        evolve(s, e)
    assert decide(s, 20.0) == []  # nothing moved
    [row] = rows(s, 20.0)
    assert row == {
        "team": "a",
        "pool": "default",
        "guaranteed": 8,
        "borrow_limit": 4,
        "lend_limit": None,
        "weight": 1.0,
        "in_use": 8,
        "borrowed": 0,
        "fair_share": 0.5,
    }
