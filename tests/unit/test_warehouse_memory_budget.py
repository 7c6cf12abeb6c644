"""One analytics query's memory budget follows the recorder's container: read from the cgroup files
in the kernel's own layouts (v2 `memory.max`, v1 `memory.limit_in_bytes`), a quarter of the limit
over the query slots, 2 GiB where nothing limits the process."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.recorder.pipeline import analytics_limits
from services.warehouse.analytics import Limits
from services.warehouse.memory_budget import (
    MAX_QUERY_BYTES,
    MIN_QUERY_BYTES,
    cgroup_memory_limit,
    query_memory_bytes,
    size_text,
)

GIB, MIB = 2**30, 2**20


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_in_a_pod_s_own_namespace_reads_the_root_memory_max(tmp_path: Path) -> None:
    write(tmp_path / "proc", "0::/\n")
    write(tmp_path / "cg" / "memory.max", f"{GIB}\n")
    assert cgroup_memory_limit(tmp_path / "proc", tmp_path / "cg") == GIB


def test_cgroup_v2_takes_the_smallest_limit_on_the_way_up(tmp_path: Path) -> None:
    """systemd slices and Kubernetes QoS cgroups nest: the tightest ancestor is what the OOM killer uses."""
    write(tmp_path / "proc", "0::/kubepods.slice/pod1/ctr\n")
    cg = tmp_path / "cg"
    write(cg / "kubepods.slice" / "memory.max", f"{8 * GIB}\n")
    write(cg / "kubepods.slice" / "pod1" / "memory.max", f"{512 * MIB}\n")
    write(cg / "kubepods.slice" / "pod1" / "ctr" / "memory.max", "max\n")
    assert cgroup_memory_limit(tmp_path / "proc", cg) == 512 * MIB


def test_cgroup_v1_memory_controller_and_its_unlimited_value(tmp_path: Path) -> None:
    write(tmp_path / "proc", "9:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n")
    cg = tmp_path / "cg"
    write(cg / "memory" / "docker" / "abc" / "memory.limit_in_bytes", "9223372036854771712\n")  # no limit
    assert cgroup_memory_limit(tmp_path / "proc", cg) is None
    write(cg / "memory" / "docker" / "abc" / "memory.limit_in_bytes", f"{3 * GIB}\n")
    assert cgroup_memory_limit(tmp_path / "proc", cg) == 3 * GIB


def test_nothing_readable_means_no_limit(tmp_path: Path) -> None:
    assert cgroup_memory_limit(tmp_path / "missing", tmp_path) is None
    write(tmp_path / "proc", "garbage\n0::/\n")
    assert cgroup_memory_limit(tmp_path / "proc", tmp_path / "cg") is None


def test_the_budget_is_a_quarter_of_the_container_over_the_slots_within_bounds() -> None:
    assert query_memory_bytes(None, 1) == MAX_QUERY_BYTES == 2 * GIB
    assert query_memory_bytes(GIB, 1) == 256 * MIB  # the chart's recorder
    assert query_memory_bytes(GIB, 2) == 128 * MIB
    assert query_memory_bytes(64 * GIB, 1) == 2 * GIB
    assert query_memory_bytes(64 * MIB, 4) == MIN_QUERY_BYTES
    assert [size_text(b) for b in (256 * MIB, 2 * GIB, int(1.5 * GIB))] == ["256 MiB", "2 GiB", "1.5 GiB"]


def test_the_memory_limit_message_names_the_budget_in_mib() -> None:
    text = Limits(max_memory_bytes=256 * MIB).explain("Code: 241. DB::Exception: Memory limit (for query) exceeded")
    assert "memory limit of 256 MiB (max_memory_usage)" in text


def recorder_args(memory_mib: int = 0, slots: int = 1) -> argparse.Namespace:
    return argparse.Namespace(sql_memory_mib=memory_mib, sql_slots=slots, sql_threads=0)


def test_the_recorder_sizes_its_door_from_its_container_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    import services.recorder.pipeline as pipeline

    monkeypatch.setattr(pipeline, "cgroup_memory_limit", lambda: GIB)
    assert analytics_limits(recorder_args(), embedded=True).max_memory_bytes == 256 * MIB
    assert analytics_limits(recorder_args(slots=2), embedded=True).max_memory_bytes == 128 * MIB
    assert analytics_limits(recorder_args(memory_mib=700), embedded=True).max_memory_bytes == 700 * MIB
    # on a ClickHouse server the query's memory is the server's, capped by its own user profile
    assert analytics_limits(recorder_args(), embedded=False).max_memory_bytes == 2 * GIB
