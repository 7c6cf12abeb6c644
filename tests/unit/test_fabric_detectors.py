"""NIC fault detectors over scripted FabricSamples: each fault once per occurrence, on the rail's GPU."""

from __future__ import annotations

from events.fabric import FabricSample, LinkState, NicSample
from events.faults import FaultKind, Severity
from node_agent.fabric_detectors import FabricDetectorState, detect_nic


def a_sample(t: float, *nics: NicSample) -> FabricSample:
    return FabricSample(cluster="c", node="n", seq=int(t), observed_at=t, interval_s=1.0, nics=list(nics))


def a_nic(index: int = 0, **kw: object) -> NicSample:
    fields: dict = {"name": f"mlx5_{index}/1", "index": index, "state": LinkState.UP, "rate_gbps": 400.0,
                    "errors": 0, "flaps": 0, "gpu_index": index, **kw}  # fmt: skip
    return NicSample(**fields)


def kinds(faults: list) -> list[tuple[FaultKind, int | None]]:
    return [(f.kind, f.gpu_index) for f in faults]


def test_a_link_that_goes_down_is_one_critical_fault_on_its_gpu() -> None:
    st = FabricDetectorState()
    assert detect_nic(st, a_sample(0, a_nic(3))) == []
    down = detect_nic(st, a_sample(1, a_nic(3, state=LinkState.DOWN, rate_gbps=None)))
    assert kinds(down) == [(FaultKind.NIC_DOWN, 3)] and down[0].severity is Severity.CRITICAL
    assert detect_nic(st, a_sample(2, a_nic(3, state=LinkState.DOWN, rate_gbps=None))) == []
    assert detect_nic(st, a_sample(3, a_nic(3))) == []


def test_a_port_never_up_is_not_a_fault() -> None:
    st = FabricDetectorState()
    assert detect_nic(st, a_sample(0, a_nic(1, state=LinkState.DOWN))) == []


def test_each_interval_with_flaps_is_a_flap_fault() -> None:
    st = FabricDetectorState()
    detect_nic(st, a_sample(0, a_nic()))
    assert kinds(detect_nic(st, a_sample(1, a_nic(flaps=1)))) == [(FaultKind.NIC_FLAP, 0)]
    assert detect_nic(st, a_sample(2, a_nic())) == []


def test_a_port_below_its_peers_rate_is_a_downshift_once() -> None:
    st = FabricDetectorState()
    peers = [a_nic(i) for i in range(1, 4)]
    found = detect_nic(st, a_sample(0, a_nic(0, rate_gbps=200.0), *peers))
    assert kinds(found) == [(FaultKind.NIC_DOWNSHIFT, 0)]
    assert detect_nic(st, a_sample(1, a_nic(0, rate_gbps=200.0), *peers)) == []


def test_errors_above_the_window_threshold_are_one_fault_and_rearm_after_quiet() -> None:
    st = FabricDetectorState()
    assert detect_nic(st, a_sample(0, a_nic(errors=60))) == []
    assert kinds(detect_nic(st, a_sample(1, a_nic(errors=60)))) == [(FaultKind.NIC_ERRORS, 0)]
    assert detect_nic(st, a_sample(2, a_nic(errors=60))) == []
    assert detect_nic(st, a_sample(200, a_nic(errors=0))) == []  # the window emptied: re-armed
    assert kinds(detect_nic(st, a_sample(201, a_nic(errors=150)))) == [(FaultKind.NIC_ERRORS, 0)]
