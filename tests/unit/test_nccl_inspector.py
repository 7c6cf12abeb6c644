"""NCCL Inspector ingestion: its Prometheus textfile and OTLP/HTTP JSON metrics become per-GPU bus
bandwidth series in the fabric sample; a rank whose busbw is an outlier in its communicator points at
its NIC (the rail serving that GPU)."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web

from events.fabric import CollectiveBandwidth, CulpritKind, FabricSample, LinkState, NicSample
from events.jobs import JobScheduled, Placement
from node_agent.inspector import InspectorDir, OtlpStore, otlp_app, parse_otlp_json, parse_prometheus
from services.perf import core as perf

# the Prometheus textfile layout of Inspector's README ("Current Metric Format Examples"), own values
PROM = """\
# HELP nccl_bus_bandwidth_gbs NCCL bus bandwidth
nccl_bus_bandwidth_gbs{version="v5.1",slurm_job_id="unknown",node="gpu-a03",gpu="GPU3",comm_name="DP Group 0",\
n_nodes="4",nranks="32",collective="AllReduce",message_size="1-2GB",algo_proto="Ring_simple"} 182.5
nccl_collective_exec_time_microseconds{version="v5.1",slurm_job_id="unknown",node="gpu-a03",gpu="GPU3",\
comm_name="DP Group 0",n_nodes="4",nranks="32",collective="AllReduce",message_size="1-2GB",\
algo_proto="Ring_simple"} 9123.4
nccl_p2p_bus_bandwidth_gbs{version="v5.1",slurm_job_id="unknown",node="gpu-a03",gpu="GPU3",comm_name="PP 1",\
n_nodes="2",nranks="2",p2p_operation="Send",message_size="512-513MB"} 390.1
"""


def _otlp(busbw: dict[int, float], node: str) -> dict[str, object]:
    def attr(k: str, v: str) -> dict[str, object]:
        return {"key": k, "value": {"stringValue": v}}

    points = [
        {
            "attributes": [
                attr("gpu", f"GPU{g}"),
                attr("comm_name", "DP Group 0"),
                attr("collective", "AllReduce"),
                attr("message_size", "1-2GB"),
                attr("nranks", "32"),
            ],
            "timeUnixNano": "1780000000000000000",
            "asDouble": bw,
        }
        for g, bw in busbw.items()
    ]
    return {
        "resourceMetrics": [
            {
                "resource": {"attributes": [attr("service.name", "nccl-inspector"), attr("node", node)]},
                "scopeMetrics": [
                    {
                        "scope": {"name": "nccl-inspector"},
                        "metrics": [{"name": "nccl_bus_bandwidth_gbs", "gauge": {"dataPoints": points}}],
                    }
                ],
            }
        ]
    }


def test_the_prometheus_textfile_gives_bandwidth_and_time_per_gpu_communicator_and_collective() -> None:
    series = parse_prometheus(PROM)
    assert series == [
        CollectiveBandwidth(
            gpu_index=3,
            comm="DP Group 0",
            collective="AllReduce",
            message_size="1-2GB",
            busbw_gbs=182.5,
            exec_time_us=9123.4,
            nranks=32,
        ),
        CollectiveBandwidth(
            gpu_index=3, comm="PP 1", collective="Send", message_size="512-513MB", busbw_gbs=390.1, nranks=2
        ),
    ]


def test_the_dump_dir_reader_parses_each_textfile_again_only_when_rewritten(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "gpu3.prom").write_text(PROM)
    (tmp_path / "notes.txt").write_text("ignored")
    reader = InspectorDir(tmp_path)
    assert len(reader.read()) == 2 and len(reader.read()) == 2
    assert InspectorDir(tmp_path / "missing").read() == []


async def test_otlp_http_json_metrics_are_received_on_v1_metrics() -> None:
    store = OtlpStore()
    runner = web.AppRunner(otlp_app(store))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/v1/metrics"
            ok = await http.post(
                url, data=json.dumps(_otlp({0: 440.0, 1: 120.0}, "n1")), headers={"Content-Type": "application/json"}
            )
            assert ok.status == 200
            proto = await http.post(url, data=b"\x0a\x00", headers={"Content-Type": "application/x-protobuf"})
            assert proto.status == 415
    finally:
        await runner.cleanup()
    assert [(s.gpu_index, s.busbw_gbs) for s in store.read()] == [(0, 440.0), (1, 120.0)]
    assert parse_otlp_json({"resourceMetrics": "nonsense"}) == []


def _job_with_busbw(busbw: dict[tuple[str, int], float]) -> tuple[perf.PerfState, perf.JobTrack]:
    state = perf.PerfState()
    nodes = sorted({n for n, _ in busbw})
    placements = [Placement(cluster="c", node=n, gpu_indices=list(range(8))) for n in nodes]
    perf.evolve(state, JobScheduled(job_id="j", at=0.0, team="t", placements=placements, pool="default"))
    for n in nodes:
        series = parse_otlp_json(_otlp({g: bw for (node, g), bw in busbw.items() if node == n}, n))
        nics = [
            NicSample(name=f"mlx5_{g}/1", index=g, state=LinkState.UP, rate_gbps=400.0, gpu_index=g) for g in range(8)
        ]
        perf.evolve(
            state,
            FabricSample(cluster="c", node=n, seq=1, observed_at=50.0, interval_s=1.0, nics=nics, collectives=series),
        )
    return state, state.jobs["j"]


def test_a_rank_with_outlier_bus_bandwidth_in_its_communicator_points_at_its_nic() -> None:
    busbw = {(f"n{i}", g): 450.0 + 3 * g for i in range(4) for g in range(8)}
    busbw[("n2", 5)] = 160.0
    state, track = _job_with_busbw(busbw)
    culprit = perf.find_culprit(state, track, 50.0)
    assert culprit is not None and culprit.kind is CulpritKind.NIC
    assert (culprit.node, culprit.gpu, culprit.nic) == (("c", "n2"), 5, "mlx5_5/1")
    assert "bus bandwidth" in culprit.reason


@pytest.mark.parametrize("low", [400.0, 300.0])
def test_ordinary_spread_in_bus_bandwidth_names_no_nic(low: float) -> None:
    busbw = {(f"n{i}", g): 450.0 for i in range(4) for g in range(8)}
    busbw[("n1", 2)] = low  # 89 % and 67 % of the median: above the 60 % cut
    state, track = _job_with_busbw(busbw)
    assert perf.inspector_outlier(state, track) is None
