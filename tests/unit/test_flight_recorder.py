"""PyTorch Flight Recorder dumps (one pickle per rank, in the dump's own shape: version, pg_config,
pg_status, entries with Flight Recorder's keys) become the step table, and the replay names the slow
rank from them."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from services.perf.flight_recorder import DumpError, convert, main, read_dump
from services.perf.replay import parse_rows, replay

T0_NS = 1_764_633_600_000_000_000  # wall clock, as c10::getTime() gives
COMPUTE_S = {0: 1.0, 1: 1.02, 2: 1.5, 3: 0.99}  # rank 2 computes 1.5x its data-parallel peers
ALLREDUCE_S = 0.2


def _entry(record_id: int, pg: int, seq: int, name: str, created: float, duration: float, **extra: Any) -> dict:
    created_ns = int(T0_NS + created * 1e9)
    return {
        "record_id": record_id,
        "pg_id": pg,
        "process_group": [str(pg), "default_pg" if pg == 0 else "tp_group"],
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": name,
        "time_created_ns": created_ns,
        "duration_ms": duration * 1e3,
        "input_sizes": [[1048576]],
        "input_dtypes": ["Float"],
        "output_sizes": [[1048576]],
        "output_dtypes": ["Float"],
        "state": "completed",
        "time_discovered_started_ns": created_ns + 1000,
        "time_discovered_completed_ns": int(created_ns + duration * 1e9 + 2e6),  # the watchdog polls
        "retired": True,
        "timeout_ms": 600000,
        "is_p2p": False,
        "frames": [{"name": "all_reduce", "filename": "distributed_c10d.py", "line": 2501}],
        **extra,
    }


def a_dump(rank: int, steps: int = 10) -> dict[str, Any]:
    """Rank `rank`'s dump: per step an all-gather (data-parallel group), a tensor-parallel all-reduce
    (another group), its compute, then the gradient all-reduce that waits for the slowest rank."""
    entries, t, rid = [], 0.0, 0
    for s in range(steps):
        entries.append(_entry(rid, 0, 2 * s + 1, "nccl:all_gather", t, 0.01))
        entries.append(_entry(rid + 1, 1, s + 1, "nccl:all_reduce", t + 0.02, 0.005))
        arrive = t + COMPUTE_S[rank]
        end = t + max(COMPUTE_S.values()) + ALLREDUCE_S
        entries.append(_entry(rid + 2, 0, 2 * s + 2, "nccl:all_reduce", arrive, end - arrive))
        rid, t = rid + 3, end + 0.001
    return {
        "version": "2.9",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
        "pg_status": {"0": {"last_enqueued_collective": 2 * steps, "last_completed_collective": 2 * steps}},
        "entries": entries,
    }


@pytest.fixture
def dumps(tmp_path: Path) -> list[Path]:
    paths = []
    for rank in COMPUTE_S:
        path = tmp_path / f"nccl_trace_rank_{rank}"
        path.write_bytes(pickle.dumps(a_dump(rank)))
        paths.append(path)
    return paths


def test_each_step_is_cut_at_the_data_parallel_all_reduce(dumps: list[Path]) -> None:
    rows = convert(dumps, job="train-1", pg="default_pg")
    assert {r["step"] for r in rows} == {2 * s + 2 for s in range(1, 10)}  # the first closes no full step
    by_rank = {r["rank"]: r for r in rows if r["step"] == 4}
    assert by_rank[0]["step_end_s"] - by_rank[0]["step_start_s"] == pytest.approx(1.701, abs=0.01)
    # the slow rank waits little at the all-reduce, its peers about 0.5 s more (and the all-gather)
    assert by_rank[2]["comm_wait_s"] == pytest.approx(0.2 + 0.01, abs=1e-6)
    assert by_rank[0]["comm_wait_s"] == pytest.approx(0.7 + 0.01, abs=1e-6)


def test_the_replay_names_the_slow_rank_from_the_dumps(dumps: list[Path]) -> None:
    rows = convert(dumps, job="train-1", pg="0")
    result = replay(parse_rows(rows), gpus_per_node=4)
    assert result.verdicts and result.verdicts[-1].pattern == "slow_worker"
    assert result.verdicts[-1].ranks == [2] and result.verdicts[-1].gpu_indices == [2]


def test_a_json_dump_reads_the_same(dumps: list[Path], tmp_path: Path) -> None:
    as_json = tmp_path / "json" / "nccl_trace_rank_2.json"
    as_json.parent.mkdir()
    as_json.write_text(json.dumps(a_dump(2)))
    assert read_dump(as_json) == read_dump(dumps[2])


def test_a_pickle_that_names_a_class_is_refused(tmp_path: Path) -> None:
    class Hostile:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("true",))

    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps({"entries": [Hostile()]}))
    with pytest.raises(DumpError, match=r"names no class, but this one names posix\.system"):
        read_dump(path)


def test_the_command_writes_jsonl_and_refuses_bad_input(
    dumps: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--job", "train-1", "--pg", "0", *map(str, dumps)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 9 * 4 and json.loads(lines[0])["job"] == "train-1"
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["--job", "j", str(tmp_path / "notes.txt")]) == 2
    assert "does not end in the rank" in capsys.readouterr().err
