"""Per-NIC series on the gateway's /metrics, from FabricSamples folded into its read model."""

from __future__ import annotations

from prometheus_client import generate_latest

from events.fabric import FabricSample, LinkState, NicSample
from services.gateway import core
from services.gateway.metrics import registry_for


def a_fabric(t: float, **nic: object) -> FabricSample:
    fields: dict = {"name": "mlx5_0/1", "index": 0, "state": LinkState.UP, "rate_gbps": 400.0, **nic}
    return FabricSample(
        cluster="c1", node="n1", seq=int(t), observed_at=t, interval_s=1.0, nics=[NicSample(**fields)],
        labels={"leaf": "leaf-0"},
    )  # fmt: skip


def test_nic_gauges_show_the_latest_sample_and_counters_sum_the_deltas_once() -> None:
    state = core.GatewayState()
    core.evolve(state, a_fabric(1.0, errors=2, pause=10, flaps=0, tx_bytes_per_s=5e9))
    second = a_fabric(2.0, state=LinkState.DOWN, rate_gbps=None, errors=3, pause=0, flaps=1)
    core.evolve(state, second)
    core.evolve(state, second)  # replayed: not counted twice
    text = generate_latest(registry_for(lambda: state)).decode()
    labels = 'cluster="c1",leaf="leaf-0",nic="mlx5_0/1",node="n1"'
    assert f"chamber_nic_up{{{labels}}} 0.0" in text
    assert f"chamber_nic_errors_total{{{labels}}} 5.0" in text
    assert f"chamber_nic_pause_frames_total{{{labels}}} 10.0" in text
    assert f"chamber_nic_flaps_total{{{labels}}} 1.0" in text
    assert "chamber_nic_rate_gbps{" not in text  # unknown while down: no sample rather than a fake 0
