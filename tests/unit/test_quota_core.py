"""The quota core: validation, usage, Slurm-style decayed fair share."""

from __future__ import annotations

import pytest

from events import BudgetAction, BudgetSet, GpuIsolated, JobCompleted, JobScheduled, NodeIsolated, NodeLost, Placement
from services.quota.core import (
    QuotaRefused,
    QuotaState,
    changes,
    decide,
    define_pool,
    evolve,
    fair_shares,
    over_commitment,
    patched,
    pool_rows,
    remove_pool,
    rows,
    set_quota,
    settings_of,
)
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
        (dict(team="nlp", pool="default", gpus=2, lend_limit=3), "lend_limit", "above the guarantee"),
    ]
    for kwargs, field, text in cases:
        with pytest.raises(QuotaRefused, match=text) as refused:
            set_quota(s, **{"borrow_limit": None, "lend_limit": None, "weight": 1.0, "at": 0.0, **kwargs})  # type: ignore[arg-type]
        assert refused.value.field == field
    ok = set_quota(s, team="vision", pool="default", gpus=16, borrow_limit=None, lend_limit=None, weight=2, at=1)
    assert ok.guaranteed_gpus == 16
    # above what is installed: accepted (nodes may not have joined yet); the service warns
    more = set_quota(s, team="nlp", pool="default", gpus=8, borrow_limit=None, lend_limit=None, weight=1, at=1)
    assert more.guaranteed_gpus == 8


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
        "np_lend_limit": None,
        "weight": 1.0,
        "critical": False,
        "budget": None,
        "currency": None,
        "on_budget": None,
        "in_use": 8,
        "borrowed": 0,
        "fair_share": 0.5,
    }


def test_a_patch_changes_only_what_it_names_and_a_replace_resets_the_rest() -> None:
    s = a_fleet(a_quota("vision", 8, borrow=4, critical=True))
    before = settings_of(s, "default", "vision")
    assert before == {
        "gpus": 8, "borrow_limit": 4, "lend_limit": None, "np_lend_limit": None, "weight": 1.0, "critical": True,
    }  # fmt: skip
    after = patched(before, {"weight": 2.0}, replace=False)
    assert after == {**before, "weight": 2.0}  # the borrow limit and the critical permission are kept
    diff = {c["setting"]: (c["before"], c["after"], c["changed"]) for c in changes(before, after)}
    assert diff["borrow_limit"] == (4, 4, False) and diff["weight"] == (1.0, 2.0, True)
    assert patched(before, {"borrow_limit": None}, replace=False)["borrow_limit"] is None  # null clears a limit
    replaced = patched(before, {"gpus": 8, "weight": 2.0}, replace=True)
    assert replaced["borrow_limit"] is None and replaced["critical"] is False
    with pytest.raises(QuotaRefused, match="no quota in this pool yet") as refused:
        patched(None, {"weight": 2.0}, replace=False)
    assert refused.value.field == "gpus"
    assert all(c["changed"] and c["before"] is None for c in changes(None, replaced))


def test_guarantees_are_promises_about_installed_gpus_not_healthy_ones() -> None:
    s = a_fleet(a_quota("vision", 10), a_quota("nlp", 6))  # n1 (H100) + n2 (A100): 16 GPUs
    evolve(s, NodeIsolated(cluster="c1", node="n2", at=1, reason="xid-79"))
    evolve(s, GpuIsolated(cluster="c1", node="n1", gpu_index=0, at=1, reason="ecc"))
    assert s.pool_capacity("default") == 7 and s.pool_installed("default") == 16
    # an unchanged quota stays valid with 9 of 16 GPUs isolated: no warning
    assert over_commitment(s, "default", "vision", 10) is None
    warning = over_commitment(s, "default", "vision", 12)
    assert warning is not None and "over-committed" in warning and "18 GPUs" in warning and "16 installed" in warning
    [pool] = pool_rows(s)
    assert (pool["installed"], pool["in_service"], pool["guaranteed"], pool["over_committed"]) == (16, 7, 16, 0)
    # a lost node is no longer installed: the pool is over-committed until it comes back
    evolve(s, NodeLost(cluster="c1", node="n2", at=2, last_seen_at=1))
    [pool] = pool_rows(s)
    assert (pool["installed"], pool["over_committed"]) == (8, 8)
    evolve(s, a_node("n2", model="A100"))
    assert s.pool_installed("default") == 16


def test_a_quota_before_any_node_joins_is_accepted_and_shown_over_committed() -> None:
    s = QuotaState()
    event = set_quota(s, team="vision", pool="default", gpus=32, borrow_limit=None, lend_limit=None, weight=1, at=0)
    evolve(s, event)
    warning = over_commitment(s, "default", "vision", 32)
    assert warning is not None and "32 more than the 0 installed" in warning
    assert pool_rows(s)[0]["over_committed"] == 32


def test_quota_rows_carry_every_setting_and_the_teams_budget() -> None:
    s = a_fleet(a_quota("vision", 8, borrow=4, critical=True))
    evolve(s, BudgetSet(team="vision", at=1, amount=2000.0, on_budget=BudgetAction.HOLD))
    [row] = rows(s, 2)
    assert row["np_lend_limit"] is None and row["critical"] is True
    assert (row["budget"], row["on_budget"], row["currency"]) == (2000.0, "hold", "USD")


def test_a_pool_is_deleted_only_when_no_guarantee_job_or_node_uses_it() -> None:
    s = a_fleet()
    evolve(s, define_pool(s, name="ampere", gpu_model="A100", node_label=None, at=0))  # selects n2
    evolve(s, define_pool(s, name="spare", gpu_model="B200", node_label=None, at=0))  # selects nothing
    evolve(s, a_quota("vision", 4, pool="ampere"))
    with pytest.raises(QuotaRefused, match=r"pool ampere still guarantees GPUs to vision \(4\): set them to 0"):
        remove_pool(s, name="ampere", at=1)
    evolve(s, a_quota("vision", 0, pool="ampere"))
    evolve(s, a_job("j1", gpus=1, pool="ampere"))
    evolve(s, run("j1", 2, pool="ampere"))
    with pytest.raises(QuotaRefused, match=r"pool ampere still runs 1 job\(s\) \(j1\)"):
        remove_pool(s, name="ampere", at=3)
    evolve(s, JobCompleted(job_id="j1", at=4))
    with pytest.raises(QuotaRefused, match=r"pool ampere still selects 1 node\(s\) \(n2\); deleting it would move"):
        remove_pool(s, name="ampere", at=5)
    with pytest.raises(QuotaRefused, match=r"default pool .* cannot be deleted"):
        remove_pool(s, name="default", at=5)
    with pytest.raises(QuotaRefused, match=r"no pool 'spar' \(pools: ampere, spare\)"):
        remove_pool(s, name="spar", at=5)
    evolve(s, a_quota("vision", 0, pool="spare"))
    evolve(s, remove_pool(s, name="spare", at=6))
    assert "spare" not in s.pools and ("spare", "vision") not in s.quotas  # its quotas of 0 GPUs go with it
    assert [p["pool"] for p in pool_rows(s)] == ["ampere"]


def test_usage_in_use_is_exact_for_shares_and_survives_a_snapshot() -> None:
    """The in-use totals are kept as jobs start and stop (not summed on every read): shares of a GPU
    add and subtract exactly, a team with nothing running has no entry, and a snapshot, which
    leaves the totals out, derives the same ones from the running jobs."""
    from services.quota.service import snapshot_codec

    s = QuotaState()
    for i, share in enumerate((0.1, 0.2, 0.3)):
        s.start(f"f{i}", "default", "nlp", share)
    s.start("w", "default", "vision", 8)
    s.stop("f1")
    assert s.in_use() == {("default", "nlp"): 0.4, ("default", "vision"): 8}
    assert isinstance(s.in_use()[("default", "vision")], int)  # whole GPUs stay ints, as `quota list` shows
    codec = snapshot_codec()
    assert b"use_milli" not in codec.encode(s)  # a cache: the snapshot holds the running jobs only
    restored = codec.decode(codec.encode(s))
    assert restored.use_milli == s.use_milli and restored.in_use() == s.in_use()
    for job in ("f0", "f2", "w"):
        s.stop(job)
    assert s.in_use() == {} and s.use_milli == {}
