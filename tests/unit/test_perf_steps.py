"""Step-table diagnosis: a slow worker is named with all its GPUs within 5 steps (also when slow from the
first step), stage and data imbalance are reported as such with no straggler fault and no isolation, a
healthy noisy job gets no verdict; the replay command reads CSV, Parquet and JSONL; JobSlowdownDetected's
new fields keep old bodies and old subscribers decoding."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.base import Event, event_type
from events.codec import decode, encode
from events.fabric import CulpritKind, JobSlowdownDetected
from events.jobs import JobScheduled, Placement
from events.steps import RankStep, RankStepTimings
from services.perf import core as perf
from services.perf import steps
from services.perf.replay import StepTableError, parse_rows, replay
from services.perf.step_cases import make

STORED = Path(__file__).resolve().parents[1] / "data" / "events_v1" / "perf.jsonl"


def _steps_of(case, verdict) -> int:  # type: ignore[no-untyped-def]
    ends = sorted({r["step"]: r["step_end_s"] for r in case.rows}.items())
    return next(step for step, end in ends if end >= verdict.at) - case.onset_step + 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_slow_tensor_parallel_worker_is_named_with_all_four_gpus_within_five_steps(seed: int) -> None:
    case = make("slow_worker_tp4", seed)
    result = replay(parse_rows(case.rows))
    first = result.verdicts[0]
    assert first.pattern == "slow_worker" and first.culprit is CulpritKind.GPU
    assert first.node == case.target_node and first.gpu_indices == list(case.target_gpus)
    assert first.ranks == list(case.target_ranks)
    assert _steps_of(case, first) <= 5
    # a straggler fault for each of the worker's GPUs; health isolates those four and nothing else
    assert {f.gpu_index for f in result.stragglers} == set(case.target_gpus)
    assert sorted((d.node, d.gpu_index) for d in result.isolations) == [(case.target_node, g) for g in case.target_gpus]


def test_a_rank_slow_from_its_first_step_is_seen_without_any_healthy_history() -> None:
    case = make("slow_from_step_one", 1)
    assert case.onset_step == 0
    result = replay(parse_rows(case.rows))
    first = result.verdicts[0]
    assert first.pattern == "slow_worker" and first.ranks == list(case.target_ranks)
    assert first.score < 0.5  # 2.35x slower than its peers
    assert _steps_of(case, first) <= 5


def test_stage_imbalance_says_what_to_change_and_raises_no_fault_and_no_isolation() -> None:
    result = replay(parse_rows(make("stage_imbalance", 1).rows))
    assert [v.pattern for v in result.verdicts] == ["stage_imbalance"]
    v = result.verdicts[0]
    assert v.culprit is CulpritKind.UNKNOWN and v.node is None
    assert re.search(r"stage 3 computes 1\.[5-7]\dx the others", v.reason), v.reason
    assert "rebalance the pipeline split" in v.reason
    assert result.stragglers == [] and result.isolations == []


def test_data_imbalance_is_told_apart_from_a_slow_gpu() -> None:
    result = replay(parse_rows(make("data_imbalance", 2).rows))
    assert [v.pattern for v in result.verdicts] == ["data_imbalance"]
    assert "balance them by tokens" in result.verdicts[0].reason
    assert result.stragglers == [] and result.isolations == []


@pytest.mark.parametrize("case", ["healthy_tp4", "healthy_dp", "healthy_pp"])
def test_a_healthy_job_with_seven_percent_step_noise_gets_no_verdict(case: str) -> None:
    for seed in (1, 2):
        result = replay(parse_rows(make(case, seed).rows))
        assert result.verdicts == [] and result.stragglers == [] and result.isolations == []


def test_the_slow_worker_verdict_clears_once_the_worker_keeps_pace_again() -> None:
    track = steps.StepTrack(expected=8)

    def step(n: int, slow: bool) -> None:
        rows = [
            RankStep(
                rank=r,
                step=n,
                step_start_s=10.0 * n,
                step_end_s=10.0 * n + 9,
                compute_s=8.0 * (1.6 if slow and r == 3 else 1.0),
            )
            for r in range(8)
        ]
        steps.fold(track, RankStepTimings(cluster="c", node="n", job_id="j", observed_at=10.0 * n + 9, steps=rows))
        steps.evaluate(track)

    for n in range(5):
        step(n, slow=True)
    assert track.finding is not None and track.finding.ranks == (3,)
    # the first healthy step still leaves it slow in 4 of the last 5; then CLEAR_STEPS quiet steps
    for n in range(5, 5 + steps.CLEAR_STEPS):
        step(n, slow=False)
    assert track.finding is not None
    step(5 + steps.CLEAR_STEPS, slow=False)
    assert track.finding is None


def test_step_timings_for_a_job_the_service_does_not_track_change_nothing() -> None:
    state = perf.PerfState()
    perf.evolve(
        state,
        JobScheduled(
            job_id="j",
            at=0.0,
            team="t",
            placements=[Placement(cluster="c", node="n1", gpu_indices=[0])],
            pool="default",
        ),
    )
    rows = [RankStep(rank=0, step=0, step_start_s=0.0, step_end_s=1.0)]
    perf.evolve(state, RankStepTimings(cluster="c", node="n1", job_id="other", observed_at=1.0, steps=rows))
    perf.evolve(state, RankStepTimings(cluster="c", node="n9", job_id="j", observed_at=1.0, steps=rows))
    assert state.jobs["j"].steps is None and perf.decide(state, 2.0) == []


# --- the replay command ----------------------------------------------------------------------------------


def _chamber(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, timeout=120)


def _write(rows: list[dict[str, object]], path: Path) -> Path:
    if path.suffix == ".csv":
        cols = sorted({k for r in rows for k in r})
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl"])
def test_chamber_perf_replay_reads_each_format_and_prints_the_verdict(tmp_path: Path, suffix: str) -> None:
    case = make("slow_worker_tp4", 1)
    # without node and gpu_index: the ranks are placed by --gpus-per-node
    rows = [{k: v for k, v in r.items() if k not in ("node", "gpu_index")} for r in case.rows]
    path = _write(rows, tmp_path / f"steps{suffix}")
    out = _chamber("perf", "replay", "--steps", str(path), "--gpus-per-node", "8", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    v = doc["verdicts"][0]
    assert (
        v["pattern"] == "slow_worker" and v["node"] == case.target_node and v["gpu_indices"] == list(case.target_gpus)
    )
    assert {i["gpu"] for i in doc["isolations"]} == set(case.target_gpus)
    text = _chamber("perf", "replay", "--steps", str(path), "--job", case.rows[0]["job"])  # type: ignore[arg-type]
    assert text.returncode == 0 and "SLOW_WORKER" in text.stdout and "isolations: 4" in text.stdout


def test_a_bad_step_table_is_refused_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "steps.csv"
    bad.write_text("job,rank,step,step_start_s\nj,0,0,1.0\n")
    out = _chamber("perf", "replay", "--steps", str(bad))
    assert out.returncode != 0 and "lacks step_end_s" in out.stderr and "Traceback" not in out.stderr
    missing = _chamber("perf", "replay")
    assert missing.returncode != 0 and "needs --steps" in missing.stderr
    with pytest.raises(StepTableError, match="not a number"):
        parse_rows([{"job": "j", "rank": "x", "step": 0, "step_start_s": 0, "step_end_s": 1}])


# --- compatibility of JobSlowdownDetected ----------------------------------------------------------------


def test_a_slowdown_body_written_before_the_new_fields_still_decodes() -> None:
    line = json.loads(STORED.read_text().splitlines()[0])
    event = decode(line["headers"], line["body"].encode()).event
    assert isinstance(event, JobSlowdownDetected) and event.gpu_index == 5
    assert (event.gpu_indices, event.ranks, event.pattern) == ([], [], "")


class _OldJobSlowdownDetected(Event, frozen=True, tag=event_type("perf", "job_slowdown_detected")):
    """JobSlowdownDetected as subscribers built before gpu_indices, ranks and pattern know it."""

    job_id: str
    episode: int
    at: float
    since: float
    culprit: str
    score: float
    confidence: float
    cluster: str | None = None
    node: str | None = None
    gpu_index: int | None = None
    nic: str | None = None
    leaf: str | None = None
    evidence: dict[str, float | str] = {}
    reason: str = ""


def test_an_old_subscriber_decodes_a_new_slowdown_and_ignores_the_new_fields() -> None:
    new = JobSlowdownDetected(
        job_id="j",
        episode=1,
        at=2.0,
        since=1.0,
        culprit=CulpritKind.GPU,
        score=0.6,
        confidence=0.85,
        node="n1",
        gpu_index=4,
        gpu_indices=[4, 5, 6, 7],
        ranks=[20, 21, 22, 23],
        pattern="slow_worker",
    )
    _, body = encode(new, source="test")
    old = msgspec.json.decode(body, type=_OldJobSlowdownDetected)
    assert (old.job_id, old.gpu_index, old.culprit) == ("j", 4, "gpu")


DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_replay_examples_of_the_docs_page_print_what_the_page_shows() -> None:
    page = (DOCS / "perf-steps.md").read_text()
    for example in ("steps-slow-rank.csv", "steps-stage-imbalance.csv"):
        out = _chamber("perf", "replay", "--steps", str(DOCS / "examples" / example))
        assert out.returncode == 0, out.stderr
        for line in out.stdout.splitlines():
            shown = line if ": straggler: " not in line else line.split(": straggler: ")[0]
            assert shown in page, f"{example}: {line!r} is not on docs/perf-steps.md"


_num = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
_row = st.builds(
    RankStep,
    rank=st.integers(-2, 40),
    step=st.integers(-2, 30),
    step_start_s=_num,
    step_end_s=_num,
    compute_s=st.none() | _num,
    comm_wait_s=st.none() | _num,
    dp_rank=st.none() | st.integers(-1, 8),
    pp_stage=st.none() | st.integers(-1, 4),
    gpu_index=st.none() | st.integers(-1, 9),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["n0", "n1"]), st.lists(_row, max_size=12)), max_size=25))
def test_any_step_rows_fold_and_decide_without_raising(batches: list[tuple[str, list[RankStep]]]) -> None:
    state = perf.PerfState()
    placements = [Placement(cluster="c", node=n, gpu_indices=[0, 1, 2, 3]) for n in ("n0", "n1")]
    perf.evolve(state, JobScheduled(job_id="j", at=0.0, team="t", placements=placements, pool="default"))
    for i, (node, rows) in enumerate(batches):
        perf.evolve(state, RankStepTimings(cluster="c", node=node, job_id="j", observed_at=float(i), steps=rows))
        for event, _ in perf.decide(state, float(i)):
            perf.evolve(state, event)
    perf.verdicts(state)


def test_a_slow_worker_whose_nic_the_fabric_samples_flag_is_blamed_on_that_nic() -> None:
    from events.fabric import FabricSample, LinkState, NicSample

    state = perf.PerfState()
    nodes = [f"node-{i}" for i in range(4)]
    placements = [Placement(cluster="c", node=n, gpu_indices=list(range(8))) for n in nodes]
    perf.evolve(state, JobScheduled(job_id="j", at=0.0, team="t", placements=placements, pool="default"))
    for n in nodes:
        nics = [
            NicSample(name=f"mlx5_{g}/1", index=g, state=LinkState.UP, gpu_index=g,
                      rate_gbps=200.0 if (n, g) == ("node-2", 5) else 400.0)
            for g in range(8)
        ]  # fmt: skip
        perf.evolve(state, FabricSample(cluster="c", node=n, seq=1, observed_at=1.0, interval_s=1.0, nics=nics))
    published = []
    for step in range(6):
        for i, n in enumerate(nodes):
            rows = [
                RankStep(rank=r, step=step, step_start_s=10.0 * step, step_end_s=10.0 * step + 9.5,
                         compute_s=8.0 * (1.6 if r == 21 else 1.0) + 0.01 * (r % 3))
                for r in range(8 * i, 8 * i + 8)
            ]  # fmt: skip
            perf.evolve(state, RankStepTimings(cluster="c", node=n, job_id="j", observed_at=10.0 * step, steps=rows))
        for event, _ in perf.decide(state, 10.0 * step + 9.5):
            perf.evolve(state, event)
            published.append(event)
    (verdict,) = [e for e in published if isinstance(e, JobSlowdownDetected)]
    assert verdict.culprit is CulpritKind.NIC and (verdict.node, verdict.gpu_index, verdict.nic) == (
        "node-2",
        5,
        "mlx5_5/1",
    )
    assert verdict.pattern == "slow_worker" and verdict.ranks == [21] and "trained at 200" in verdict.reason
