"""On-node NIC fault detectors: pure functions over successive FabricSamples of one node.

`detect_nic(state, sample)` returns the next state and the faults found, as GpuFaultDetected on the
FAULTS stream like every other node fault; `gpu_index` names the GPU the NIC serves (its rail), so the
health policy can isolate just that GPU. Thresholds (our choices; sources in shared/reference/fabric.md):

- nic_down: a port that was up goes down. critical (Meta GCM: an IB link down/flap is critical).
- nic_flap: the port's link_downed / carrier-change count rose and the link is up again: one fault per
  interval with flaps; the policy escalates a flap storm (3 within 5 min) to isolation.
- nic_downshift: the port trains below its own best rate or below the node's other ports. warning.
- nic_errors: >= ERRORS_PER_WINDOW symbol/receive errors within 60 s. warning.

Conditions (down, downshift, errors) are faults when they start, and re-arm once they have cleared.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from events.fabric import FabricSample, LinkState, NicSample
from events.faults import FaultKind, GpuFaultDetected, Severity

WINDOW_S = 60.0
ERRORS_PER_WINDOW = 100
DOWNSHIFT_RATIO = 0.75  # below 3/4 of the port's best (400 -> 200 Gb/s is a downshift; 400 -> 380 is not)


@dataclass
class PortState:
    was_up: bool = False
    best_rate: float = 0.0
    errors: deque[tuple[float, int]] = field(default_factory=deque)
    errors_in_window: int = 0
    down_raised: bool = False
    downshift_raised: bool = False
    errors_raised: bool = False


@dataclass
class FabricDetectorState:
    ports: dict[str, PortState] = field(default_factory=dict)


def detect_nic(state: FabricDetectorState, sample: FabricSample) -> list[GpuFaultDetected]:
    """Faults in this sample (mutates `state`: it is the agent's private, per-node detector memory)."""
    out: list[GpuFaultDetected] = []
    rates = sorted(n.rate_gbps for n in sample.nics if n.rate_gbps and n.state is LinkState.UP)
    peer_rate = rates[len(rates) // 2] if rates else 0.0
    for nic in sample.nics:
        st = state.ports.setdefault(nic.name, PortState())
        for kind, severity, detail in _check(st, nic, sample.observed_at, peer_rate):
            out.append(_fault(sample, nic, kind, severity, detail))
    return out


def _check(st: PortState, nic: NicSample, t: float, peer_rate: float) -> list[tuple[FaultKind, Severity, str]]:
    found: list[tuple[FaultKind, Severity, str]] = []
    up = nic.state is LinkState.UP
    if nic.state is LinkState.DOWN and st.was_up and not st.down_raised:
        found.append((FaultKind.NIC_DOWN, Severity.CRITICAL, f"NIC {nic.name} link down"))
        st.down_raised = True
    if up:
        st.down_raised = False
        st.was_up = True
        if nic.flaps:
            found.append((FaultKind.NIC_FLAP, Severity.WARNING, f"NIC {nic.name} flapped {nic.flaps}x"))
        rate = nic.rate_gbps
        if rate:
            best = max(st.best_rate, peer_rate)
            low = rate < DOWNSHIFT_RATIO * best
            if low and not st.downshift_raised:
                found.append(
                    (FaultKind.NIC_DOWNSHIFT, Severity.WARNING, f"NIC {nic.name} at {rate:g} Gb/s, expected {best:g}")
                )
            st.downshift_raised = low
            st.best_rate = max(st.best_rate, rate)
    if nic.errors:
        st.errors.append((t, nic.errors))
        st.errors_in_window += nic.errors
    while st.errors and st.errors[0][0] <= t - WINDOW_S:
        st.errors_in_window -= st.errors.popleft()[1]
    total = st.errors_in_window
    if total >= ERRORS_PER_WINDOW and not st.errors_raised:
        found.append((FaultKind.NIC_ERRORS, Severity.WARNING, f"NIC {nic.name}: {total} errors in {WINDOW_S:g}s"))
        st.errors_raised = True
    elif total < ERRORS_PER_WINDOW // 2:
        st.errors_raised = False
    return found


def _fault(sample: FabricSample, nic: NicSample, kind: FaultKind, severity: Severity, detail: str) -> GpuFaultDetected:
    return GpuFaultDetected(
        fault_id=f"{sample.cluster}/{sample.node}/{sample.seq}/nic{nic.index}/{kind.value}",
        cluster=sample.cluster,
        node=sample.node,
        kind=kind,
        severity=severity,
        observed_at=sample.observed_at,
        gpu_index=nic.gpu_index,
        detail=detail,
    )
