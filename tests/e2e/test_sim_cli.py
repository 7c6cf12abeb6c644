"""`chamber sim` as a user runs it: the comparison table, the JSON contract, the plot, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
CHAMBER = [sys.executable, "-m", "services.cli"]
ROOT = Path(__file__).resolve().parents[2]


def sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CHAMBER, "sim", *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_compare_prints_the_contract_json_for_every_policy(tmp_path: Path) -> None:
    plot = tmp_path / "sim.png"
    result = sim(
        "--compare", "fifo,static-quota,chamber", "--gpus", "128", "--jobs", "300", "--json", "--plot", str(plot)
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc["policies"]) == {"fifo", "static-quota", "chamber"}
    for metrics in doc["policies"].values():
        for key in (
            "utilization", "makespan_s", "jct_mean_s", "jct_p50_s", "jct_p95_s", "jct_p99_s", "wait_mean_s",
            "wait_p99_s", "by_priority", "by_team", "jain_fairness", "preemptions", "lost_gpu_hours",
            "stranded_gpu_hours", "jobs_completed",
        ):  # fmt: skip
            assert key in metrics
        assert {"wait_mean_s", "wait_p50_s", "wait_p99_s", "jobs"} <= set(metrics["by_priority"]["normal"])
        team = next(iter(metrics["by_team"].values()))
        assert {"share_received", "entitlement", "wait_mean_s"} <= set(team)
    assert doc["policies"]["chamber"]["jobs_completed"] == 300
    assert "ratio_to_fifo" in doc["policies"]["chamber"]["by_priority"]["normal"]
    assert plot.stat().st_size > 10_000


def test_the_table_names_the_policies_and_bad_rows_are_reported_with_line_numbers(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,submit_time_s,duration_s,num_gpus,team,priority\n"
        "a,0,100,4,x,high\nb,5,oops,1,y,normal\nc,10,50,2,y,low\n"
    )
    result = sim("--trace", str(trace), "--compare", "fifo,chamber", "--gpus", "8", "--fault-rate", "1")
    assert result.returncode == 0, result.stderr
    assert f"{trace}:3: skipped: duration_s is 'oops', not a number" in result.stderr
    header = result.stdout.splitlines()[0]
    assert "fifo" in header and "chamber" in header
    strict = sim("--trace", str(trace), "--gpus", "8", "--strict")
    assert strict.returncode == 2 and ":3: duration_s" in strict.stderr and "Traceback" not in strict.stderr


def test_mistakes_are_one_clear_line() -> None:
    missing = sim("--trace", "nope.csv", "--gpus", "8")
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    policy = sim("--policy", "magic", "--gpus", "8")
    assert policy.returncode == 2 and "unknown policy magic" in policy.stderr


def test_classes_given_on_the_command_line_are_reported_per_class_against_fifo() -> None:
    result = sim("--compare", "fifo,chamber", "--gpus", "128", "--jobs", "300", "--classes", "high=1,low=1")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "high: jobs" in out and "low: jobs" in out and "ratio to fifo (mean / p99)" in out
    assert "queued in all mean / p99" in out
    assert "normal: jobs" not in out
    bad = sim("--gpus", "8", "--classes", "urgent=1")
    assert bad.returncode == 2 and "'urgent' is not a priority class" in bad.stderr and "Traceback" not in bad.stderr


def test_preemption_worth_tunes_the_chamber_policy(tmp_path: Path) -> None:
    """Team y's low job borrows x's half of the node for 10,000 s; x's urgent job arrives at 6,000 s.
    Preempting would throw away 48,000 GPU-s to save 16,000 (x's 4 GPUs for 4,000 s): not worth 2x."""
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,submit_time_s,duration_s,num_gpus,team,priority,preemptible\n"
        "long,0,10000,8,y,low,true\nurgent,6000,100,4,x,high,false\n"
    )
    runs = {}
    for worth in (None, "0", "4"):
        extra = () if worth is None else ("--preemption-worth", worth)
        result = sim("--trace", str(trace), "--compare", "fifo,chamber", "--gpus", "8", "--json", *extra)
        assert result.returncode == 0, result.stderr
        runs[worth] = json.loads(result.stdout)
    assert runs[None]["policies"]["chamber"]["preemptions"] == 0 and "chamber_tuning" not in runs[None]
    assert runs["0"]["policies"]["chamber"]["preemptions"] == 1  # 0: preempt whenever allowed
    assert runs["0"]["chamber_tuning"] == {"preemption_worth": None}
    assert runs["4"]["policies"]["chamber"]["preemptions"] == 1  # 48,000 <= 4 x 16,000
    assert all(r["policies"]["fifo"]["preemptions"] == 0 for r in runs.values())  # baselines untouched
    bad = sim("--trace", str(trace), "--gpus", "8", "--preemption-worth", "-1")
    assert bad.returncode == 2 and "--preemption-worth" in bad.stderr and "Traceback" not in bad.stderr


def test_the_quota_services_fair_share_factor_plays_unless_turned_off(tmp_path: Path) -> None:
    """Team a holds the one GPU for 10 h; then a's job and b's job queue, a's first. No guarantees."""
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time_s,duration_s,num_gpus,team\na0,0,36000,1,a\na1,10,100,1,a\nb1,20,100,1,b\n")
    quotas = tmp_path / "q.toml"
    quotas.write_text("[pools.default]\ngpus = 1\n[teams.a]\nguaranteed = 0\n[teams.b]\nguaranteed = 0\n")
    base = (
        "--trace",
        str(trace),
        "--policy",
        "chamber",
        "--gpus",
        "1",
        "--gpus-per-node",
        "1",
        "--quotas",
        str(quotas),
    )
    runs = {}
    for extra in ((), ("--no-fair-share",)):
        result = sim(*base, "--json", *extra)
        assert result.returncode == 0, result.stderr
        runs[extra] = json.loads(result.stdout)
    assert runs[()]["fair_share_factor"] is True and runs[("--no-fair-share",)]["fair_share_factor"] is False
    # by default (as deployed) b, which used nothing, goes first when a0 ends at 36,000 s; with every
    # factor held at 1, a's earlier job goes first and b waits behind it
    assert runs[()]["policies"]["chamber"]["by_team"]["b"]["wait_mean_s"] == 36_000 - 20
    assert runs[("--no-fair-share",)]["policies"]["chamber"]["by_team"]["b"]["wait_mean_s"] == 36_100 - 20
