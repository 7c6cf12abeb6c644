"""bench/fairness.py: `inversion_p` (is a class-mean inversion more than its classes' sizes explain?),
per-size waits, and a trace of the operator's own."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from events import PriorityClass

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.fairness import (
    OPENB,
    TRACES,
    against_fifo,
    by_size,
    inversion_p,
    inverted,
    main,
    matched_waits,
    met_by_split,
    met_within,
    rests_on,
    worst_p99_ratio,
)

HIGH, NORMAL = PriorityClass.HIGH, PriorityClass.NORMAL


def _outcome(*jobs: tuple[PriorityClass, int, float | None]) -> Any:
    """An outcome of (class, GPUs, wait in hours or None for never started) jobs: what inversion_p reads."""
    return SimpleNamespace(
        jobs={
            f"j{i}": SimpleNamespace(
                t=SimpleNamespace(priority=c, gpus=g, submit_s=100.0),
                first_start=None if w is None else 100.0 + w * 3600,
            )
            for i, (c, g, w) in enumerate(jobs)
        }
    )


def test_an_urgent_class_that_waits_longer_at_every_size_is_not_noise() -> None:
    jobs = [(HIGH, g, 10.0 + i % 3) for i in range(20) for g in (1, 8)]
    jobs += [(NORMAL, g, 1.0 + i % 3) for i in range(20) for g in (1, 8)]
    assert inversion_p(_outcome(*jobs), "high", "normal") < 0.01


def test_a_gap_made_by_the_classes_mix_of_sizes_is_named_so() -> None:
    # normal waits longer only because its jobs are big; at one GPU it waits less than low does
    jobs = [(NORMAL, 8, 50.0)] * 5 + [(NORMAL, 1, 0.5)] * 5 + [(PriorityClass.LOW, 1, 2.0 + i % 2) for i in range(50)]
    assert inversion_p(_outcome(*jobs), "normal", "low") == 1.0


def test_a_small_class_drawn_from_the_same_waits_is_within_noise() -> None:
    waits = [float(w) for w in range(40)]
    jobs = [(HIGH, 1, w) for w in waits] + [(NORMAL, 1, w) for w in (1.0, 30.0, 5.0)] + [(HIGH, 1, None)]
    p = inversion_p(_outcome(*jobs), "high", "normal")
    assert 0.05 < p < 0.5  # high's mean 19.5 h against normal's 12 h: three jobs tell little
    assert inversion_p(_outcome(*jobs), "high", "normal") == p  # seeded


def _timed(*jobs: tuple[PriorityClass, int, float, float | None]) -> Any:
    """An outcome of (class, GPUs, submitted at hour, wait in hours or None) jobs."""
    return SimpleNamespace(
        jobs={
            f"j{i}": SimpleNamespace(
                t=SimpleNamespace(priority=c, gpus=g, submit_s=at * 3600),
                first_start=None if w is None else (at + w) * 3600,
            )
            for i, (c, g, at, w) in enumerate(jobs)
        }
    )


def test_a_gap_made_by_when_the_jobs_came_sets_each_job_against_its_company() -> None:
    # high's busy day (hour 0: 20 h waits) has no normal job; in the calm week after, high waits
    # 1 h and normal 2 h at the same sizes: normal's mean is lower, yet high was served first
    busy = [(HIGH, 8, 0.0, 20.0)] * 30
    calm = [(HIGH, g, 100.0 + h, 1.0) for h in range(0, 48, 4) for g in (1, 8)]
    normal = [(NORMAL, g, 101.0 + h, 2.0) for h in range(0, 48, 12) for g in (1, 8)]
    outcome = _timed(*busy, *calm, *normal, (NORMAL, 4, 102.0, 9.0), (NORMAL, 8, 103.0, None))
    assert inverted({"by_priority": {"high": {"wait_mean_s": 1}, "normal": {"wait_mean_s": 0}}}) == [("high", "normal")]
    # the 4-GPU normal job has no high company of its size; the unstarted one counts for neither
    assert matched_waits(outcome, "high", "normal") == {"jobs": 8, "normal_h": 2.0, "high_h": 1.0}
    # the window is the submit time +- 6 h: a job 7 h from any of its size has no company
    lonely = _timed((HIGH, 1, 0.0, 5.0), (NORMAL, 1, 7.0, 1.0))
    assert matched_waits(lonely, "high", "normal") == {"jobs": 0, "normal_h": None, "high_h": None}
    near = _timed((HIGH, 1, 0.0, 5.0), (HIGH, 1, 12.0, 3.0), (NORMAL, 1, 6.0, 1.0))
    assert matched_waits(near, "high", "normal") == {"jobs": 1, "normal_h": 1.0, "high_h": 4.0}


def test_an_inversion_that_rests_on_one_big_job_names_it() -> None:
    # 60 normal jobs wait 4 h, one 64-GPU job 450 h: normal's mean 11.3 h against low's 10 h
    jobs = [(NORMAL, 1, 4.0)] * 60 + [(NORMAL, 64, 450.0), (NORMAL, 8, None)] + [(PriorityClass.LOW, 1, 10.0)] * 100
    assert rests_on(_outcome(*jobs), "normal", "low") == {"jobs": 1, "gpus": [64], "waits_h": [450.0]}
    # a class that waits longer throughout rests on no few jobs
    even = [(HIGH, 1, 12.0)] * 50 + [(NORMAL, 1, 10.0)] * 50
    assert rests_on(_outcome(*even), "high", "normal") == {"jobs": None}
    assert rests_on(_outcome(*even), "high", "low") == {"jobs": None}  # no low job at all


def test_mean_waits_per_job_size() -> None:
    out = by_size(_outcome((HIGH, 1, 1.0), (HIGH, 1, 3.0), (HIGH, 8, 40.0), (NORMAL, 8, None)))
    assert out == {"high": {"1": {"jobs": 2, "mean_h": 2.0}, "8": {"jobs": 1, "mean_h": 40.0}}}


def _run(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["fairness.py", *argv])
    return main()


def test_a_trace_of_your_own_runs_with_its_own_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = ["job_id,submit_time_s,duration_s,num_gpus,team,priority,preemptible"]
    for i in range(60):  # three teams, a burst that leaves 8 GPUs under pressure
        c = ("high", "normal", "low")[i % 3]
        rows.append(f"j{i},{i * 60},{3600 + 600 * (i % 5)},{1 + 3 * (i % 2)},{'abc'[i % 3]},{c},{c == 'low'}")
    trace = tmp_path / "ours.csv"
    trace.write_text("\n".join(rows) + "\n")
    assert _run(monkeypatch, "--csv", str(trace), "--gpus", "8", "--json-only") == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["runs"]) == ["csv:ours.csv"] and out["traces"]["csv:ours.csv"]["split"] == "yours"
    [run] = out["runs"]["csv:ours.csv"].values()
    assert set(run["per_class"]) == {"high", "normal", "low"}
    assert run["per_class"]["high"]["mean"]["fifo_h"] > 0  # under pressure: fifo waits
    assert out["met_by_split"] == {"yours": {"runs": 1, "met": int(run["all_targets_met"])}}
    assert out["met_within"]["yours"]["1"] == int(run["all_targets_met"])  # the strict column is the count met
    assert run["worst_p99_ratio"] is None or run["worst_p99_ratio"] > 0
    assert set(run["utilization_while_submitting"]) == {"fifo", "chamber"} and run["makespan_h"]["fifo"] > 0
    assert out["fair_share_factor"] is True  # as deployed, by default
    assert _run(monkeypatch, "--csv", str(trace), "--gpus", "8", "--json-only", "--no-fair-share") == 0
    held = json.loads(capsys.readouterr().out)
    assert held["fair_share_factor"] is False and held["runs"]["csv:ours.csv"]  # every team's factor at 1


def test_runs_meeting_every_target_are_counted_per_split() -> None:
    out = {
        "traces": {"a": {"split": "tuning"}, "b": {"split": "fresh"}, "c": {"split": "fresh"}},
        "runs": {
            "a": {"seed0/8gpus": {"all_targets_met": True}},
            "b": {"seed0/8gpus": {"all_targets_met": False}, "seed1/8gpus": {"all_targets_met": True}},
            "c": {"seed0/8gpus": {"all_targets_met": False}},
        },
    }
    assert met_by_split(out) == {"tuning": {"runs": 1, "met": 1}, "fresh": {"runs": 3, "met": 1}}


def _summary(**p99s: tuple[float, float]) -> dict[str, Any]:
    return {"by_priority": {c: {"wait_p99_s": w, "queued_p99_s": q} for c, (w, q) in p99s.items()}}


def test_the_worst_p99_ratio_is_the_farthest_class_on_either_measure_rounded_up() -> None:
    fifo = _summary(high=(100.0, 100.0), low=(200.0, 200.0))
    assert worst_p99_ratio(fifo, _summary(high=(50.0, 50.0), low=(200.0, 260.0))) == 1.3  # low in all
    assert worst_p99_ratio(fifo, _summary(high=(100.0, 100.0), low=(100.0, 100.0))) == 1.0
    assert worst_p99_ratio(fifo, _summary(high=(100.01, 100.0), low=(0.0, 0.0))) == 1.001  # over is never 1.0
    # a class that waits where fifo's p99 was 0 has no ratio
    assert worst_p99_ratio(_summary(high=(0.0, 0.0)), _summary(high=(5.0, 5.0))) is None


def test_met_within_counts_runs_near_the_p99_target_only_if_every_other_target_holds() -> None:
    ok = {"mean_inversions": [], "queued_mean_inversions": [], "utilization_ge_fifo_minus_1pt": True}
    inverted_means = ok | {"mean_inversions": ["high 2.00 h > low 1.00 h"]}
    out = {
        "traces": {"a": {"split": "fresh"}},
        "runs": {
            "a": {
                "seed0/8gpus": {"worst_p99_ratio": 0.9, "targets": ok},
                "seed1/8gpus": {"worst_p99_ratio": 1.04, "targets": ok},
                "seed2/8gpus": {"worst_p99_ratio": 1.04, "targets": inverted_means},
                "seed3/8gpus": {"worst_p99_ratio": 1.3, "targets": ok | {"unfinished_le_fifo": False}},
                "seed4/8gpus": {"worst_p99_ratio": None, "targets": ok},
            }
        },
    }
    assert met_within(out) == {"fresh": {"1": 1, "1.02": 1, "1.05": 2, "1.1": 2, "1.25": 2, "1.5": 2, "2": 2}}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--csv", "x.csv"], "--csv needs --gpus"),
        (["--csv", "x.csv", "--gpus", "8,eight"], "positive whole numbers"),
        (["--csv", "missing.csv", "--gpus", "8"], "does not exist"),
        (["--traces", "philly"], "unknown trace philly"),
        (["--traces", "itp-cluster03", "--teams", "0"], "--teams must be at least 1"),
    ],
)
def test_a_bad_command_line_gets_one_line(
    argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(monkeypatch, *argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_teams_draws_the_random_teams_anew_and_nothing_else() -> None:
    four = TRACES["itp-cluster03"].build(0, OPENB, 4)
    two = TRACES["itp-cluster03"].build(0, OPENB, 2)
    assert len({j.team for j in four}) == 4 and {j.team for j in two} == {"team-0", "team-1"}
    assert [replace(j, team="") for j in two] == [replace(j, team="") for j in four]  # same jobs, classes


def test_each_itp_cluster_is_its_own_jobs_rebased_and_the_fresh_ones_are_new_data() -> None:
    clusters = {n: TRACES[n].build(0, OPENB, 4) for n in TRACES if n.startswith("itp-cluster")}
    ids = {n: {j.id for j in jobs} for n, jobs in clusters.items()}
    for name, jobs in clusters.items():
        assert jobs and min(j.submit_s for j in jobs) == 0
        assert all(ids[name].isdisjoint(other) for n, other in ids.items() if n != name)
    fresh = {n for n, spec in TRACES.items() if spec.split == "fresh"}
    assert fresh == {f"itp-cluster0{n}" for n in (1, 4, 5, 6, 7, 8, 9)}
    assert {spec.split for spec in TRACES.values()} == {"tuning", "held out", "fresh"}


def test_serving_and_high_rank_alike_so_neither_inverts_the_other() -> None:
    def row(hours: float) -> dict[str, float]:
        return {"wait_mean_s": hours * 3600}

    summary = {"by_priority": {"serving": row(2), "high": row(1), "normal": row(1.5), "low": row(3)}}
    assert inverted(summary) == [("serving", "normal")]


def test_bad_rows_of_your_trace_are_left_out_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "ours.csv"
    rows = ["job_id,submit_time_s,duration_s,num_gpus,team,priority,preemptible"]
    rows += [f"j{i},{i * 60},3600,2,{'ab'[i % 2]},{('high', 'low')[i % 2]},{i % 2 == 1}" for i in range(20)]
    rows.append("bad,0,3600,2,a,urgent,false")
    trace.write_text("\n".join(rows) + "\n")
    assert _run(monkeypatch, "--csv", str(trace), "--gpus", "4", "--json-only") == 0
    err = capsys.readouterr().err
    assert "left out 1 bad row(s), the first at line 22: priority is 'urgent'" in err


def test_a_trace_without_a_preemptible_column_is_said_to_be_all_preemptible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The column's default is true (as for a workload without the label): a trace that only gives
    classes would otherwise be judged with its high work preemptible without anyone noticing."""
    trace = tmp_path / "classes-only.csv"
    rows = ["job_id,submit_time_s,duration_s,num_gpus,team,priority"]
    rows += [f"j{i},{i * 60},3600,2,{'ab'[i % 2]},{('high', 'low')[i % 2]}" for i in range(20)]
    trace.write_text("\n".join(rows) + "\n")
    assert _run(monkeypatch, "--csv", str(trace), "--gpus", "4", "--json-only") == 0
    captured = capsys.readouterr()
    assert "no preemptible column: every job is preemptible" in captured.err
    assert "every job is preemptible" in json.loads(captured.out)["traces"]["csv:classes-only.csv"]["classes"]


def _runs(waits: list[tuple[float, float | None, float]]) -> tuple[Any, Any]:
    """fifo's and chamber's outcomes of low one-GPU jobs: (fifo wait, chamber wait, chamber queued
    in all), in hours, None for a job chamber never started."""

    def job(w: float | None, queued: float) -> Any:
        first = None if w is None else 100.0 + w * 3600
        return SimpleNamespace(
            t=SimpleNamespace(priority=PriorityClass.LOW, gpus=1, submit_s=100.0),
            first_start=first,
            queued_s=queued * 3600,
        )

    fifo = SimpleNamespace(jobs={f"j{i}": job(f, f) for i, (f, _, _) in enumerate(waits)})
    chamber = SimpleNamespace(jobs={f"j{i}": job(c, q) for i, (_, c, q) in enumerate(waits)})
    return fifo, chamber


def test_against_fifo_says_which_jobs_waited_longer_and_whose_waits_make_each_tail() -> None:
    # 98 jobs fifo served within 10 h, chamber 5 h later; one that fifo served in 5 h chamber kept
    # 60 h; the one fifo kept longest (100 h) chamber started in 20 h but threw back, 150 h in all;
    # one more chamber never started (left out).
    waits: list[tuple[float, float | None, float]] = [(i / 10, i / 10 + 5, i / 10 + 5) for i in range(98)]
    waits += [(5.0, 60.0, 60.0), (100.0, 20.0, 150.0), (1.0, None, 0.0)]
    row = against_fifo(*_runs(waits))["low"]
    assert row["jobs"] == 100
    assert row["waited_longer"] == 0.99 and row["queued_longer_in_all"] == 1.0
    assert row["fifo_tail_jobs"] == 1 and row["fifo_tail_waited_longer"] == 0.0
    assert row["fifo_tail_mean_h"] == {"fifo": 100.0, "chamber": 20.0, "chamber_in_all": 150.0}
    assert row["chamber_tail_jobs"] == 1 and row["chamber_tail_mean_h"] == {"fifo": 5.0, "chamber": 60.0}


def test_a_job_that_starts_within_a_minute_of_fifo_did_not_wait_longer() -> None:
    row = against_fifo(*_runs([(2.0, 2.0 + 59 / 3600, 2.0), (2.0, 2.0 + 61 / 3600, 2.0)]))["low"]
    assert row["waited_longer"] == 0.5 and row["queued_longer_in_all"] == 0.0
