"""NCCL Inspector's JSON output (records in the shape of its README: header, metadata, coll_perf; some
with the verbose event trace) becomes the step table, and the replay names the slow rank from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.perf.inspector_steps import InspectorError, main, read_records, steps_from_records
from services.perf.replay import parse_rows, replay

T0_US = 1_752_867_229_000_000
COMPUTE_S = {0: 1.0, 1: 1.01, 2: 1.6, 3: 0.98}  # rank 2 computes 1.6x its peers
DP, TP = "0x7f8c496ae9f661", "0xe62dedaa97644a"


def a_record(rank: int, comm: str, n_ranks: int, coll: str, sn: int, exec_s: float, end_s: float, verbose: bool):
    perf: dict[str, Any] = {
        "coll": coll,
        "coll_sn": sn,
        "coll_msg_size_bytes": 2147483648,
        "coll_exec_time_us": round(exec_s * 1e6),
        "coll_timing_source": "kernel_gpu",
        "coll_algobw_gbs": 277.2,
        "coll_busbw_gbs": 485.1,
    }
    end_us = T0_US + round(end_s * 1e6)
    if verbose:
        kernel = {"channel_id": 0, "kernel_start_ts": end_us - perf["coll_exec_time_us"], "kernel_stop_ts": end_us}
        perf["event_trace_ts"] = {"coll_start_ts": kernel["kernel_start_ts"] - 5, "kernel_events": [kernel]}
    return {
        "header": {"id": comm, "rank": rank, "n_ranks": n_ranks, "nnodes": 1},
        "metadata": {
            "inspector_output_format_version": "v4.0",
            "git_rev": "",
            "rec_mechanism": "nccl_profiler_interface",
            "dump_timestamp_us": end_us + 400,  # written at the next dump interval
            "hostname": "node-0",
            "pid": 4000 + rank,
        },
        "coll_perf": perf,
    }


def rank_file(tmp_path: Path, rank: int, steps: int = 10, verbose: bool = True, pretty: bool = False) -> Path:
    t, out = 0.0, []
    for s in range(steps):
        out.append(a_record(rank, DP, 4, "ReduceScatter", 2 * s + 1, 0.01, t + 0.01, verbose))
        out.append(a_record(rank, TP, 2, "AllReduce", s + 1, 0.005, t + 0.02, verbose))
        end = t + max(COMPUTE_S.values()) + 0.2
        out.append(a_record(rank, DP, 4, "AllReduce", 2 * s + 2, end - t - COMPUTE_S[rank], end, verbose))
        t = end + 0.001
    path = tmp_path / f"nccl-inspector-rank{rank}.log"
    path.write_text("".join(json.dumps(r, indent=2 if pretty else None) + "\n" for r in out))
    return path


def test_steps_are_cut_at_the_widest_communicators_all_reduce(tmp_path: Path) -> None:
    records = [r for rank in COMPUTE_S for r in read_records(rank_file(tmp_path, rank, pretty=rank == 1))]
    rows = steps_from_records(records, job="train-1")
    assert {r["step"] for r in rows} == {2 * s + 2 for s in range(1, 10)}
    at = {r["rank"]: r for r in rows if r["step"] == 4}
    assert at[0]["step_end_s"] - at[0]["step_start_s"] == pytest.approx(1.801, abs=1e-6)
    assert at[2]["comm_wait_s"] == pytest.approx(0.21, abs=1e-6)  # the slow rank hardly waits
    assert at[0]["comm_wait_s"] == pytest.approx(0.81, abs=1e-6)
    result = replay(parse_rows(rows), gpus_per_node=4)
    assert result.verdicts and result.verdicts[-1].pattern == "slow_worker" and result.verdicts[-1].ranks == [2]


def test_without_the_verbose_trace_the_dump_time_ends_the_step(tmp_path: Path) -> None:
    records = list(read_records(rank_file(tmp_path, 0, verbose=False)))
    [first, *_] = steps_from_records(records, job="j", comm=DP)
    assert first["step_end_s"] == pytest.approx((T0_US + 3_601_000 + 400) / 1e6, abs=1e-6)  # 2nd all-reduce + 400 µs


def test_the_command_writes_jsonl_and_refuses_other_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(rank_file(tmp_path, rank)) for rank in COMPUTE_S]
    assert main(["--job", "train-1", "--comm", DP, *files]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 9 * 4
    (tmp_path / "other.json").write_text('{"entries": []}')
    assert main(["--job", "j", str(tmp_path / "other.json")]) == 2
    assert "not Inspector output" in capsys.readouterr().err
    with pytest.raises(InspectorError, match="not NCCL Inspector JSON"):
        (tmp_path / "broken.log").write_text('{"header": ')
        list(read_records(tmp_path / "broken.log"))
