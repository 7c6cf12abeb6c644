"""On-node detectors, driven by scripted sample sequences: each fault once per occurrence."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from events import GpuFaultDetected, GpuSample, NodeSample, NvLinkCounters, RowRemapState, Severity
from node_agent.detectors import (
    DetectorState,
    GpuLimits,
    Reading,
    XidEvent,
    detect,
    pcie_replay_limit,
)
from node_agent.xid_catalog import classify

HEALTHY: dict[str, Any] = dict(
    utilization_pct=90.0,
    temperature_c=60.0,
    ecc_sbe_volatile=0,
    ecc_dbe_volatile=0,
    retired_pages_pending=False,
    row_remap=RowRemapState(correctable=0, uncorrectable=0, pending=False, failure=False),
    pcie_replay_count=0,
    nvlink=[NvLinkCounters(link=i, crc_flit_errors=0, crc_data_errors=0, replay_errors=0, recovery_errors=0)
            for i in range(2)],
)  # fmt: skip


def a_gpu(index: int = 0, **changes: Any) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index}", **{**HEALTHY, **changes})


def a_sample(seq: int, *gpus: GpuSample) -> NodeSample:
    return NodeSample(
        cluster="c1", node="n1", seq=seq, observed_at=1000.0 + seq, interval_s=1.0, gpus=list(gpus) or [a_gpu()]
    )


def run(steps: list[Reading | NodeSample], limits: dict[int, GpuLimits] | None = None) -> list[list[GpuFaultDetected]]:
    """Faults found at each step of a scripted sequence."""
    state = DetectorState()
    out = []
    for step in steps:
        reading = step if isinstance(step, Reading) else Reading(step)
        state, faults = detect(state, reading, limits)
        out.append(faults)
    return out


def kinds(per_step: list[list[GpuFaultDetected]]) -> list[list[str]]:
    return [[f"{f.kind}:{f.severity}" for f in step] for step in per_step]


def test_a_healthy_gpu_raises_nothing() -> None:
    assert kinds(run([a_sample(s) for s in range(120)])) == [[]] * 120


def test_each_xid_event_is_one_fault_classified_by_the_catalog() -> None:
    steps = run(
        [
            a_sample(0),
            Reading(a_sample(1), xids=(XidEvent(0, 79, at=1000.5),)),
            a_sample(2),
            Reading(a_sample(3), xids=(XidEvent(0, 13, at=1002.5), XidEvent(0, 13, at=1002.7))),
        ]
    )
    assert kinds(steps) == [[], ["xid:critical"], [], ["xid:warning", "xid:warning"]]
    fault = steps[1][0]
    assert fault.xid == 79 and fault.gpu_uuid == "GPU-0" and fault.observed_at == 1000.5
    assert "GPU_HAS_FALLEN_OFF_THE_BUS" in fault.detail and "RESTART_BM" in fault.detail
    assert fault.fault_id == "c1/n1/1/fault/0"
    assert len({f.fault_id for f in steps[3]}) == 2


@pytest.mark.parametrize(
    ("xid", "severity", "action"),
    [
        (48, Severity.CRITICAL, "WORKFLOW_XID_48"),
        (79, Severity.CRITICAL, "RESTART_BM"),
        (95, Severity.CRITICAL, "RESET_GPU"),
        (74, Severity.CRITICAL, "WORKFLOW_NVLINK_ERR"),
        (13, Severity.WARNING, "RESTART_APP"),
        (31, Severity.WARNING, "RESTART_APP"),
        (94, Severity.WARNING, "RESTART_APP"),
        (63, Severity.INFO, "IGNORE"),
        (92, Severity.INFO, "IGNORE"),
        (45, Severity.INFO, "WORKFLOW_XID_45"),
        (150, Severity.CRITICAL, "WORKFLOW_NVLINK5_ERR"),
        (149, Severity.WARNING, "WORKFLOW_NVLINK5_ERR"),
        (3, Severity.CRITICAL, "CONTACT_SUPPORT"),  # unused on Ampere+: unexpected
        (97, Severity.WARNING, "RESTART_APP"),  # copy engine exception
    ],
)
def test_the_xid_table_follows_nvidias_catalog(xid: int, severity: Severity, action: str) -> None:
    info = classify(xid)
    assert (info.severity, info.action, info.known) == (severity, action, True)


def test_an_xid_the_catalog_does_not_list_is_a_warning_marked_unknown() -> None:
    info = classify(9999)
    assert (info.severity, info.known) == (Severity.WARNING, False)


def test_a_dbe_increase_is_a_critical_fault_each_time_it_happens() -> None:
    steps = run(
        [a_sample(0), a_sample(1, a_gpu(ecc_dbe_volatile=1)), a_sample(2, a_gpu(ecc_dbe_volatile=1)),
         a_sample(3, a_gpu(ecc_dbe_volatile=3))]
    )  # fmt: skip
    assert kinds(steps) == [[], ["ecc_dbe:critical"], [], ["ecc_dbe:critical"]]
    assert "1 -> 3" in steps[3][0].detail


def test_a_dbe_count_already_there_at_start_is_reported_once_and_a_reset_is_not_a_fault() -> None:
    steps = run([a_sample(0, a_gpu(ecc_dbe_volatile=2)), a_sample(1, a_gpu(ecc_dbe_volatile=2)), a_sample(2)])
    assert kinds(steps) == [["ecc_dbe:critical"], [], []]


def test_an_sbe_storm_is_a_fault_once_until_it_calms_down_for_a_window() -> None:
    # 5 corrected errors per second: 100 within the window after 20 s.
    storm = [a_sample(s, a_gpu(ecc_sbe_volatile=5 * s)) for s in range(0, 40)]
    quiet = [a_sample(s, a_gpu(ecc_sbe_volatile=5 * 39)) for s in range(40, 110)]
    again = [a_sample(s, a_gpu(ecc_sbe_volatile=5 * 39 + 10 * (s - 109))) for s in range(110, 130)]
    steps = kinds(run(storm + quiet + again))
    fired = [i for i, s in enumerate(steps) if s]
    assert fired == [20, 119] and steps[20] == ["ecc_sbe_storm:warning"]


def test_a_few_sbes_are_not_a_storm() -> None:
    steps = run([a_sample(s, a_gpu(ecc_sbe_volatile=s)) for s in range(0, 300, 1)])  # 1/s: 60 per window
    assert all(s == [] for s in steps)


def test_remap_pending_and_remap_failure_are_faults_when_they_appear() -> None:
    pending = RowRemapState(correctable=0, uncorrectable=1, pending=True, failure=False)
    failed = RowRemapState(correctable=0, uncorrectable=1, pending=True, failure=True)
    steps = run(
        [a_sample(0), a_sample(1, a_gpu(row_remap=pending)), a_sample(2, a_gpu(row_remap=pending)),
         a_sample(3, a_gpu(row_remap=failed)), a_sample(4, a_gpu(row_remap=failed))]
    )  # fmt: skip
    assert kinds(steps) == [[], ["row_remap_pending:warning"], [], ["row_remap_failure:critical"], []]


def test_retired_pages_pending_is_a_warning_once_and_rearms_after_it_clears() -> None:
    steps = run(
        [a_sample(0, a_gpu(retired_pages_pending=True)), a_sample(1, a_gpu(retired_pages_pending=True)),
         a_sample(2), a_sample(3, a_gpu(retired_pages_pending=True))]
    )  # fmt: skip
    assert kinds(steps) == [["retired_pages:warning"], [], [], ["retired_pages:warning"]]


def test_thermal_is_the_slowdown_temperature_or_a_thermal_throttle_reason() -> None:
    limits = {0: GpuLimits(slowdown_temp_c=87.0)}
    steps = run(
        [a_sample(0, a_gpu(temperature_c=86.0)), a_sample(1, a_gpu(temperature_c=87.0)),
         a_sample(2, a_gpu(temperature_c=91.0, throttle_reasons=["sw_thermal_slowdown"])),
         a_sample(3, a_gpu(temperature_c=70.0)),
         a_sample(4, a_gpu(temperature_c=70.0, throttle_reasons=["hw_thermal_slowdown"]))],
        limits,
    )  # fmt: skip
    assert kinds(steps) == [[], ["thermal:warning"], [], [], ["thermal:warning"]]
    assert "87 C >= slowdown 87 C" in steps[1][0].detail


def test_the_slowdown_temperature_defaults_to_85_c_when_the_gpu_does_not_report_it() -> None:
    assert kinds(run([a_sample(0, a_gpu(temperature_c=84.0)), a_sample(1, a_gpu(temperature_c=85.0))])) == [
        [],
        ["thermal:warning"],
    ]


def test_a_power_brake_is_a_power_fault_and_explains_the_hw_slowdown() -> None:
    braked = a_gpu(throttle_reasons=["hw_slowdown", "hw_power_brake_slowdown"])
    steps = run([a_sample(0), a_sample(1, braked), a_sample(2, braked), a_sample(3)])
    assert kinds(steps) == [[], ["power:warning"], [], []]


def test_a_sw_power_cap_is_normal_operation_not_a_fault() -> None:
    assert kinds(run([a_sample(0, a_gpu(throttle_reasons=["sw_power_cap", "gpu_idle"]))])) == [[]]


def nvlink(crc: int = 0, replay: int = 0, recovery: int = 0) -> list[NvLinkCounters]:
    return [
        NvLinkCounters(link=0, crc_flit_errors=crc, crc_data_errors=0, replay_errors=replay, recovery_errors=recovery),
        NvLinkCounters(link=1, crc_flit_errors=None, crc_data_errors=None, replay_errors=None, recovery_errors=None),
    ]


def test_nvlink_crc_errors_warn_then_escalate_to_critical_at_100_per_second() -> None:
    steps = run(
        [a_sample(0), a_sample(1, a_gpu(nvlink=nvlink(crc=3))), a_sample(2, a_gpu(nvlink=nvlink(crc=5))),
         a_sample(3, a_gpu(nvlink=nvlink(crc=500))), a_sample(4, a_gpu(nvlink=nvlink(crc=900)))]
    )  # fmt: skip
    assert kinds(steps) == [[], ["nvlink:warning"], [], ["nvlink:critical"], []]


def test_an_nvlink_recovery_is_critical_and_quiet_links_rearm_after_the_window() -> None:
    steps = run(
        [a_sample(0), a_sample(1, a_gpu(nvlink=nvlink(recovery=1)))]
        + [a_sample(s, a_gpu(nvlink=nvlink(recovery=1))) for s in range(2, 70)]
        + [a_sample(70, a_gpu(nvlink=nvlink(recovery=2)))]
    )
    fired = [(i, s) for i, s in enumerate(kinds(steps)) if s]
    assert fired == [(1, ["nvlink:critical"]), (70, ["nvlink:critical"])]


def test_pcie_replays_above_the_dcgm_rate_for_the_link_are_a_warning() -> None:
    assert pcie_replay_limit(4, 16) == 16 and pcie_replay_limit(5, 16) == 31 and pcie_replay_limit(None, None) == 31
    limits = {0: GpuLimits(pcie_replays_per_window=pcie_replay_limit(4, 16))}
    ok = run([a_sample(s, a_gpu(pcie_replay_count=s // 4)) for s in range(120)], limits)  # 15 per minute
    assert all(s == [] for s in ok)
    steps = run([a_sample(s, a_gpu(pcie_replay_count=s)) for s in range(30)], limits)  # 60 per minute
    assert [i for i, s in enumerate(kinds(steps)) if s] == [17]


def test_a_lost_gpu_is_one_critical_fault_and_its_other_gpus_carry_on() -> None:
    lost = GpuSample(index=1, uuid="GPU-1")
    steps = run(
        [a_sample(0, a_gpu(0), a_gpu(1)),
         Reading(a_sample(1, a_gpu(0), lost), lost_gpus=frozenset({1})),
         Reading(a_sample(2, a_gpu(0, ecc_dbe_volatile=1), lost), lost_gpus=frozenset({1})),
         a_sample(3, a_gpu(0, ecc_dbe_volatile=1), a_gpu(1))]
    )  # fmt: skip
    assert kinds(steps) == [[], ["gpu_lost:critical"], ["ecc_dbe:critical"], []]
    assert steps[1][0].gpu_index == 1 and steps[1][0].gpu_uuid == "GPU-1"


def test_unsupported_fields_are_never_faults() -> None:
    blank = GpuSample(index=0, uuid="GPU-0")
    assert kinds(run([a_sample(s, blank) for s in range(5)])) == [[]] * 5


def test_detect_does_not_change_the_state_it_is_given() -> None:
    state = DetectorState()
    s1, _ = detect(state, Reading(a_sample(0, a_gpu(retired_pages_pending=True))))
    frozen = msgspec.json.encode(repr(s1))
    detect(s1, Reading(a_sample(1)))
    assert msgspec.json.encode(repr(s1)) == frozen and state == DetectorState()


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=60))
def test_a_condition_is_published_once_per_occurrence(steps: list[tuple[bool, bool, bool]]) -> None:
    """Whatever the sequence, each condition yields exactly one fault per time it starts."""
    samples = [
        a_sample(
            s,
            a_gpu(
                row_remap=RowRemapState(correctable=0, uncorrectable=0, pending=pending, failure=False),
                retired_pages_pending=retired,
                throttle_reasons=["hw_power_brake_slowdown"] if brake else [],
            ),
        )
        for s, (pending, retired, brake) in enumerate(steps)
    ]
    found = [f.kind.value for step in run(samples) for f in step]

    def starts(i: int) -> int:
        flags = [False] + [step[i] for step in steps]
        return sum(1 for a, b in itertools.pairwise(flags) if b and not a)

    assert found.count("row_remap_pending") == starts(0)
    assert found.count("retired_pages") == starts(1)
    assert found.count("power") == starts(2)
    assert len(found) == starts(0) + starts(1) + starts(2)
