"""Issue 19's evaluation, rebuilt small: the 4-team, 6,200-job analogue of the held-out trace
(services/tracesim/analogue.py) with the issue's class mix, replayed at 40 and 32 GPUs with the
DEFAULT quotas (equal guaranteed shares of the whole fleet), meets every target against fifo."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from services.tracesim.analogue import analogue, met, targets
from services.tracesim.classes import DEFAULT_MIX, assign, parse_mix
from services.tracesim.engine import FleetSpec
from services.tracesim.quotas import equal_shares
from services.tracesim.run import compare
from services.tracesim.trace import load

ITP = Path(__file__).resolve().parents[2] / "data" / "traces" / "itp" / "jobs.csv"


@pytest.fixture(scope="module")
def jobs():  # type: ignore[no-untyped-def]
    return assign(analogue(load(ITP).jobs), parse_mix(DEFAULT_MIX))


def test_the_analogue_looks_like_the_held_out_trace(jobs) -> None:  # type: ignore[no-untyped-def]
    assert len(jobs) == 6200
    teams = Counter(j.team for j in jobs)
    assert len(teams) == 4
    gpu_s = Counter()
    for j in jobs:
        gpu_s[j.team] += j.gpus * j.duration_s
    shares = sorted((v / sum(gpu_s.values()) for v in gpu_s.values()), reverse=True)
    assert shares[0] > 2 * shares[-1]  # skewed demand: equal guarantees do not fit it
    assert max(j.gpus for j in jobs) <= 16
    assert assign(analogue(load(ITP).jobs), parse_mix(DEFAULT_MIX)) == jobs  # seeded


@pytest.mark.parametrize("gpus", [40, 32])
def test_with_default_quotas_every_issue_target_holds(jobs, gpus) -> None:  # type: ignore[no-untyped-def]
    quotas = equal_shares(sorted({j.team for j in jobs}), gpus)
    result, _ = compare(jobs, FleetSpec(gpus=gpus), quotas, ["fifo", "chamber"])
    fifo, chamber = result["policies"]["fifo"], result["policies"]["chamber"]
    t = targets(fifo, chamber)
    assert met(t), t
    assert chamber["jobs_unfinished"] == 0


def test_the_strict_rule_fails_the_same_run(jobs) -> None:  # type: ignore[no-untyped-def]
    """np_lend_limit 0 everywhere, without fair-share borrowing, is the old rule (non-preemptible
    work never borrows a guarantee): on the same trace it leaves non-preemptible jobs larger than
    their team's 10 GPUs unstarted and serves high later than low. Fair-share borrowing (with the
    starvation guard's oldest job not held to the share) starts them even under that rule."""
    teams = sorted({j.team for j in jobs})
    quotas = {t: replace(q, np_lend_limit=0) for t, q in equal_shares(teams, 40).items()}
    result, _ = compare(jobs, FleetSpec(gpus=40), quotas, ["fifo", "chamber"], {"np_fair_share": False})
    fifo, chamber = result["policies"]["fifo"], result["policies"]["chamber"]
    assert chamber["jobs_unfinished"] > 0
    assert not met(targets(fifo, chamber))
    result, _ = compare(jobs, FleetSpec(gpus=40), quotas, ["chamber"])
    assert result["policies"]["chamber"]["jobs_unfinished"] == 0


def test_a_tail_in_all_past_fifo_misses_though_the_first_waits_meet() -> None:
    def summary(first_p99: float, queued_p99: float) -> dict[str, object]:
        row = {"wait_mean_s": 1.0, "wait_p99_s": first_p99, "queued_mean_s": 2.0, "queued_p99_s": queued_p99}
        return {"utilization": 0.6, "by_priority": {"high": dict(row), "low": dict(row, wait_mean_s=2.0)}}

    fifo = summary(100.0, 100.0)
    t = targets(fifo, summary(90.0, 130.0))  # a low job preempted and queued again past fifo's tail
    assert all(t["p99_le_fifo"].values()) and not t["queued_p99_le_fifo"]["low"]
    assert not met(t)
    assert met(targets(fifo, summary(90.0, 95.0)))


def test_every_pair_of_classes_out_of_order_is_shown_but_only_high_against_low_is_a_target() -> None:
    row = {"wait_p99_s": 1.0, "queued_mean_s": 1.0, "queued_p99_s": 1.0}
    waits = {"high": 2.0, "normal": 1.0, "low": 3.0}
    chamber = {"utilization": 0.6, "by_priority": {c: dict(row, wait_mean_s=m) for c, m in waits.items()}}
    t = targets(chamber, chamber)
    assert t["mean_inversions"] == ["high > normal"]
    assert met(t)
    chamber["by_priority"]["low"]["wait_mean_s"] = 1.5
    t = targets(chamber, chamber)
    assert t["mean_inversions"] == ["high > normal", "high > low"]
    assert not met(t)
