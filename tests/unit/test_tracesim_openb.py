"""The openb pod list (Alibaba cluster-trace-gpu-v2023) as simulator jobs, and bench/fairness.py's targets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from events import PriorityClass
from services.tracesim.openb import load_openb
from services.tracesim.trace import TraceError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.fairness import met, targets

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)
ROWS = [
    "p0,1000,1,1,500,,LS,Running,100,400,100",  # GPU-sharing: one whole GPU
    "p1,1000,1,8,1000,,Burstable,Succeeded,150,1150,200",
    "p2,1000,1,0,0,,BE,Running,160,900,160",  # no GPU: left out
    "p3,1000,1,1,1000,,BE,Pending,170,180,",  # never scheduled: left out
    "p4,1000,1,1,1000,,Guaranteed,Running,180,280,181",
    "p5,1000,1,1,1000,,BE,Failed,190,290,190",
]


def _write(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "pods.csv"
    path.write_text(HEADER + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_the_trace_s_qos_gives_the_class_and_only_best_effort_is_preemptible(tmp_path: Path) -> None:
    jobs = {j.id: j for j in load_openb(_write(tmp_path, ROWS))}
    assert sorted(jobs) == ["p0", "p1", "p4", "p5"]
    assert jobs["p0"].priority == PriorityClass.HIGH and jobs["p0"].gpus == 1 and not jobs["p0"].preemptible
    assert jobs["p1"].priority == PriorityClass.NORMAL and jobs["p1"].gpus == 8
    assert jobs["p1"].duration_s == 950  # deletion - scheduled
    assert jobs["p4"].priority == PriorityClass.CRITICAL
    assert jobs["p5"].priority == PriorityClass.LOW and jobs["p5"].preemptible
    assert jobs["p0"].submit_s == 0 and jobs["p5"].submit_s == 90  # re-based on the first kept pod


def test_teams_are_drawn_per_seed_and_the_same_seed_gives_the_same_teams(tmp_path: Path) -> None:
    path = _write(tmp_path, [f"q{i},1,1,1,1000,,LS,Running,{i},{i + 10},{i}" for i in range(200)])
    a, b, c = load_openb(path, seed=0), load_openb(path, seed=0), load_openb(path, seed=1)
    assert a == b and a != c
    assert {j.team for j in a} == {"team-0", "team-1", "team-2", "team-3"}


def test_a_file_that_is_not_an_openb_pod_list_is_refused_clearly(tmp_path: Path) -> None:
    bad = tmp_path / "x.csv"
    bad.write_text("job_id,submit_time_s\n1,2\n", encoding="utf-8")
    with pytest.raises(TraceError, match="not an openb pod list"):
        load_openb(bad)
    with pytest.raises(TraceError, match="download it from"):
        load_openb(tmp_path / "missing.csv")
    with pytest.raises(TraceError, match="qos"):
        load_openb(_write(tmp_path, ["z,1,1,1,1000,,Odd,Running,1,2,1"]))


def _summary(util: float, queued: dict[str, tuple[float, float]] | None = None, **waits: tuple[float, float]):
    """A summary's classes; time queued in all as the first wait unless `queued` says otherwise."""
    queued = queued or {}
    return {
        "utilization": util,
        "by_priority": {
            c: {
                "wait_mean_s": m * 3600,
                "wait_p99_s": p * 3600,
                "queued_mean_s": queued.get(c, (m, p))[0] * 3600,
                "queued_p99_s": queued.get(c, (m, p))[1] * 3600,
            }
            for c, (m, p) in waits.items()
        },
    }


def test_the_bench_targets_catch_a_tail_an_inversion_and_lost_utilization() -> None:
    fifo = _summary(0.60, high=(10, 50), normal=(10, 50), low=(10, 50))
    good = _summary(0.60, high=(1, 5), normal=(2, 9), low=(3, 40))
    assert met(targets(fifo, good))
    inverted = _summary(0.60, high=(2, 5), normal=(1, 9), low=(3, 40))
    assert targets(fifo, inverted)["mean_inversions"] == ["high 2.00 h > normal 1.00 h"]
    assert not met(targets(fifo, _summary(0.60, high=(1, 5), normal=(2, 51), low=(3, 40))))
    assert not met(targets(fifo, _summary(0.58, high=(1, 5), normal=(2, 9), low=(3, 40))))


def test_the_bench_targets_count_the_wait_after_a_preemption_too() -> None:
    """Low work that starts early, is preempted and waits again past fifo's tail misses the target,
    though its wait to the first start alone meets it."""
    fifo = _summary(0.60, high=(10, 50), normal=(10, 50), low=(10, 50))
    requeued = _summary(0.60, queued={"low": (6, 70)}, high=(1, 5), normal=(2, 9), low=(3, 40))
    t = targets(fifo, requeued)
    assert all(t["p99_le_fifo"].values()) and not t["mean_inversions"]
    assert t["queued_p99_le_fifo"]["low"] is False
    assert not met(t)
    behind = _summary(0.60, queued={"normal": (7, 9)}, high=(1, 5), normal=(2, 9), low=(3, 40))
    assert targets(fifo, behind)["queued_mean_inversions"] == ["normal 7.00 h > low 3.00 h"]
    assert not met(targets(fifo, behind))
