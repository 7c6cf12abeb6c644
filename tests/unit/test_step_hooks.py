"""chamber_hooks writes the step table from a training loop without the rest of Chamber (or torch); the
agent tails that JSONL log into RankStepTimings; replay reads the same file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chamber_hooks import StepLog
from node_agent.step_log import StepLogTail
from services.perf.replay import parse_rows, read_table


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_chamber_hooks_imports_nothing_of_chamber_and_not_torch() -> None:
    code = (
        "import sys; import chamber_hooks; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('events', 'services', 'node_agent', 'torch')]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_step_with_a_comm_block_reports_compute_and_wait(tmp_path: Path) -> None:
    clock = FakeClock()
    log = StepLog(str(tmp_path / "steps-{rank}.jsonl"), job="train-1", rank=3, gpu_index=3, dp_rank=3, clock=clock)
    with log.step(0, tokens=4096):
        clock.t += 7.0
        with log.comm():
            clock.t += 1.5
        clock.t += 0.5
    log.close()
    row = json.loads((tmp_path / "steps-3.jsonl").read_text())
    assert row == {
        "job": "train-1",
        "rank": 3,
        "step": 0,
        "step_start_s": 1000.0,
        "step_end_s": 1009.0,
        "compute_s": 7.5,
        "comm_wait_s": 1.5,
        "dp_rank": 3,
        "gpu_index": 3,
        "tokens": 4096,
    }
    assert parse_rows(read_table(tmp_path / "steps-3.jsonl"))[0].step.compute_s == 7.5


def test_a_pod_names_its_node_through_node_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")  # the downward API's spec.nodeName
    log = StepLog(str(tmp_path / "s.jsonl"), job="j", rank=0, clock=FakeClock())
    with log.step(0):
        pass
    log.close()
    assert json.loads((tmp_path / "s.jsonl").read_text())["node"] == "gpu-node-7"


def test_the_agent_tails_only_complete_new_lines_and_skips_garbage(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    log = StepLog(str(path), job="j", rank=0, clock=FakeClock())
    log.record(0, 1.0, 2.0, compute_s=0.9)
    tail = StepLogTail("j", path)
    first = tail.event("c", "n1", 5.0)
    assert first is not None and [s.step for s in first.steps] == [0] and first.source == "log"
    assert tail.event("c", "n1", 6.0) is None  # nothing new
    with path.open("a") as fh:
        fh.write("not json\n")
        fh.write(json.dumps({"job": "other", "rank": 1, "step": 1, "step_start_s": 2.0, "step_end_s": 3.0}) + "\n")
        fh.write('{"job": "j", "rank": 0, "step": 1, "step_start_s": 2.0, "step_e')  # half a line
    assert tail.event("c", "n1", 7.0) is None and tail.skipped == 1
    with path.open("a") as fh:
        fh.write('nd_s": 3.0}\n')
    again = tail.event("c", "n1", 8.0)
    assert again is not None and [s.step for s in again.steps] == [1]
    path.write_text("")  # truncated: starts over
    log.record(2, 3.0, 4.0)
    log.close()
    assert [s.step for s in tail.event("c", "n1", 9.0).steps] == [2]  # type: ignore[union-attr]


def test_an_assigned_log_that_appears_late_is_tailed_and_only_this_nodes_rows_count(tmp_path: Path) -> None:
    from events.steps import StepLogEntry
    from node_agent.step_log_watch import GLOB_EVERY_TICKS, StepLogSources

    sources = StepLogSources("n1", root=tmp_path)
    sources.assign({"j": StepLogEntry(job="j", path="/scratch/steps.jsonl", gpu_indices=[0, 1])})
    assert sources.tails() == []  # the job has not written it yet
    (tmp_path / "scratch").mkdir()
    rows = [
        {"job": "job", "rank": 0, "step": 1, "step_start_s": 0.0, "step_end_s": 1.0, "gpu_index": 1},
        {"job": "job", "rank": 8, "step": 1, "step_start_s": 0.0, "step_end_s": 1.0, "node": "n2"},
        {"job": "job", "rank": 9, "step": 1, "step_start_s": 0.0, "step_end_s": 1.0, "gpu_index": 5},
    ]
    (tmp_path / "scratch" / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tails = [sources.tails() for _ in range(GLOB_EVERY_TICKS)][-1]
    [tail] = tails
    assert [r.rank for r in tail.read()] == [0]  # another node's rank, a GPU not the job's here: left out
    sources.assign({})
    assert sources.tails() == []
