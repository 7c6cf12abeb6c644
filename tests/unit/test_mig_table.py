"""The MIG device model: NVIDIA's profile table, legal placements, and the check against NVML's answers
(pynvml's real ctypes structs, filled with what `nvidia-smi mig -lgipp` prints on an H100)."""

from __future__ import annotations

import ctypes
import types
from typing import Any

import pynvml
import pytest

from services.scheduler.core.mig import (
    MIG_MODELS,
    MigError,
    fits,
    free_starts,
    mig_model,
    most_instances,
    nvml_mismatches,
    place,
    profile_of,
    used_mask,
)

H100 = MIG_MODELS["H100-80GB"]


def test_a_4g_at_slice_0_leaves_only_a_3g_at_slice_4() -> None:
    layout = place(H100, (), "4g.40gb", 0)
    assert free_starts(H100, layout, "3g.40gb") == [4]
    assert not fits(H100, layout, "4g.40gb")
    assert not fits(H100, layout, "7g.80gb")
    assert free_starts(H100, layout, "2g.20gb") == [4]
    assert free_starts(H100, layout, "1g.10gb") == [4, 5, 6]
    full = place(H100, layout, "3g.40gb", 4)
    assert used_mask(H100, full) == 0xFF
    assert all(not fits(H100, full, p) for p in H100.profiles)


def test_a_1g_at_slice_6_blocks_the_3g_at_4_but_not_the_4g() -> None:
    layout = place(H100, (), "1g.10gb", 6)
    assert free_starts(H100, layout, "3g.40gb") == [0]
    assert free_starts(H100, layout, "4g.40gb") == [0]
    assert free_starts(H100, layout, "1g.20gb") == [0, 2, 4]  # 6 takes slices 6-7


def test_placements_follow_the_user_guide() -> None:
    for model in ("A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H200-141GB"):
        table = MIG_MODELS[model]
        by_id = {p.profile_id: (p.starts, p.memory, p.compute) for p in table.profiles.values()}
        assert by_id == {
            19: ((0, 1, 2, 3, 4, 5, 6), 1, 1),
            20: ((0, 1, 2, 3, 4, 5, 6), 1, 1),
            15: ((0, 2, 4, 6), 2, 1),
            14: ((0, 2, 4), 2, 2),
            9: ((0, 4), 4, 3),
            5: ((0,), 4, 4),
            0: ((0,), 8, 7),
        }
    assert "1g.18gb" in MIG_MODELS["H200-141GB"].profiles and "7g.141gb" in MIG_MODELS["H200-141GB"].profiles
    assert set(MIG_MODELS["A100-40GB"].profiles) >= {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}
    a30 = MIG_MODELS["A30-24GB"]
    assert (a30.compute_slices, a30.memory_slices) == (4, 4)
    assert most_instances(a30, 0, "1g.6gb") == 4 and most_instances(a30, 0, "2g.12gb") == 2


def test_instance_counts_match_the_guide() -> None:
    expected = {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
    assert {name: most_instances(H100, 0, name) for name in H100.profiles} == expected


def test_shares_of_one_gpu_never_exceed_it() -> None:
    assert H100.share_milli("4g.40gb") + H100.share_milli("3g.40gb") == 1000
    assert H100.share_milli("7g.80gb") == 1000
    assert 7 * H100.share_milli("1g.10gb") <= 1000
    assert H100.share_milli("1g.10gb") == 134  # (1/7 + 1/8) / 2


def test_bad_requests_are_refused_with_a_reason() -> None:
    with pytest.raises(MigError, match="slice 2"):
        place(H100, (), "3g.40gb", 2)
    with pytest.raises(MigError, match="no MIG profile"):
        profile_of("H100", "5g.50gb")
    with pytest.raises(MigError, match="no MIG table"):
        profile_of("L40S", "1g.10gb")
    one_me = place(H100, (), "1g.10gb+me", 0)
    assert not fits(H100, one_me, "1g.10gb+me")  # media engines: one per GPU
    assert mig_model("H100") is H100


# --- NVML: recorded answers in pynvml's own structs -------------------------------------------------

# `nvidia-smi mig -lgipp` on an H100 80GB (NVIDIA's H100 NVL post prints the same rows):
# NVML_GPU_INSTANCE_PROFILE_* constant -> (profile id, slice count, starts, size)
RECORDED_H100 = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, 1, range(7), 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: (20, 1, range(7), 1),
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (15, 1, (0, 2, 4, 6), 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (14, 2, (0, 2, 4), 2),
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, 3, (0, 4), 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (5, 4, (0,), 4),
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (0, 7, (0,), 8),
}


def fake_nvml(recorded: dict[int, tuple[int, int, Any, int]]) -> Any:
    """pynvml's two calls with its real argument lists and structs (the constants and errors are
    pynvml's own); nothing else is defined, so the checker cannot call anything unrecorded."""
    by_id = {pid: (starts, size) for pid, _, starts, size in recorded.values()}

    def profile_info(handle: object, profile: int, version: int = 2) -> Any:
        if profile not in recorded:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pid, slices, _, _ = recorded[profile]
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount = pid, slices
        return info

    def possible_placements(handle: object, profile_id: int, placements: Any, count: Any) -> int:
        starts, size = by_id[profile_id]
        out = ctypes.cast(count, ctypes.POINTER(ctypes.c_uint)).contents
        assert out.value >= len(starts), "the caller's array must hold every placement"
        for i, s in enumerate(starts):
            placements[i] = pynvml.c_nvmlGpuInstancePlacement_t(start=s, size=size)
        out.value = len(starts)
        return pynvml.NVML_SUCCESS

    constants = {k: v for k, v in vars(pynvml).items() if k.startswith("NVML_")}
    return types.SimpleNamespace(
        **constants,
        NVMLError=pynvml.NVMLError,
        c_nvmlGpuInstancePlacement_t=pynvml.c_nvmlGpuInstancePlacement_t,
        nvmlDeviceGetGpuInstanceProfileInfo=profile_info,
        nvmlDeviceGetGpuInstancePossiblePlacements=possible_placements,
    )


def test_the_table_agrees_with_nvml_on_an_h100() -> None:
    assert nvml_mismatches(fake_nvml(RECORDED_H100), object(), "H100-80GB") == []


def test_the_checker_names_a_disagreement() -> None:
    wrong = dict(RECORDED_H100)
    wrong[pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE] = (9, 3, (0, 2, 4), 4)
    del wrong[pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1]
    found = nvml_mismatches(fake_nvml(wrong), object(), "H100-80GB")
    assert any("3g.40gb: NVML placements [(0, 4), (2, 4), (4, 4)]" in m for m in found)
    assert any("1g.10gb+me: NVML has no profile" in m for m in found)
    assert nvml_mismatches(fake_nvml(RECORDED_H100), object(), "T4") == ["no MIG table for 'T4'"]


def test_the_check_without_a_driver_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    from services.scheduler.core.mig import main

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        assert main() == 2
        assert "NVML unavailable" in capsys.readouterr().err
    else:  # a GPU node: the table must agree with its driver
        pynvml.nvmlShutdown()
        assert main() == 0


def test_a_refused_question_is_reported_as_refused() -> None:
    nvml = fake_nvml(RECORDED_H100)

    def refuse(*args: Any) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    nvml.nvmlDeviceGetGpuInstancePossiblePlacements = refuse
    found = nvml_mismatches(nvml, object(), "H100-80GB")
    assert len(found) == len(H100.profiles) and all("NVML refused" in line for line in found)
