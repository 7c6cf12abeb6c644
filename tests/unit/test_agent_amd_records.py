"""What an AMD node publishes, record by record, over a scripted run on a recorded MI300X tree (SPX and
CPX): every sample body decodes to what the tree said at that tick, and each fault comes once, in the
sample it happened in, for the right GPUs. The agent's sample path is tuned for CPU (cached health
JSON, the slow fields left out, quiet GPUs skipped): this is what those shortcuts must not change."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.codec import decode
from events.faults import FaultKind, GpuFaultDetected
from events.telemetry import NodeSample
from node_agent.agent import Agent, AgentOptions
from node_agent.spool import Kind
from tests.amd_sysfs_tree import write_amd_node

T0 = 1.8e9
PARTS = {"SPX": 1, "CPX": 8}


@pytest.mark.parametrize("mode", ["SPX", "CPX"])
def test_a_scripted_run_publishes_what_the_tree_says_and_each_fault_once(tmp_path: Path, mode: str) -> None:
    cards = write_amd_node(
        tmp_path / "root", 8, compute_partition=mode, memory_partition="NPS4" if mode == "CPX" else "NPS1"
    )
    opts = AgentOptions(nats="nats://127.0.0.1:1", cluster="c", node="mi", spool_dir=tmp_path / "spool", vendor="amd",
                        sysfs_root=tmp_path / "root")  # fmt: skip
    runner = Agent(opts).runners[0]
    n = PARTS[mode]
    script = {
        5: lambda: cards[1].set_ras("umc", ue=1, ce=3),
        9: lambda: cards[2].set_ras("gfx", ue=2),
        12: lambda: cards[3].set_ras("sdma", ue=1, ce=5),
        15: lambda: cards[4].set_metrics(replays=90, hotspot=101, gfx=12, power=500),  # over temp2_crit (100 C)
        18: lambda: cards[5].set_bad_pages(reserved=2000),
        22: lambda: cards[7].remove(),
    }
    slow: dict[int, dict[str, object]] = {}
    faults: list[tuple[int, FaultKind, int | None, str | None]] = []
    for t in range(30):
        if t in script:
            script[t]()
        for rec in runner.tick(T0 + t, 1.0):
            event = decode(rec.headers, rec.body).event
            if rec.kind == Kind.FAULT:
                assert isinstance(event, GpuFaultDetected)
                faults.append((t, event.kind, event.gpu_index, event.ras_block))
                continue
            if not isinstance(event, NodeSample):
                continue
            assert event.seq == t and len(event.gpus) == 8 * n
            for g in event.gpus:
                card = g.index // n
                if not event.slow_omitted:  # the health is a slow field: as in the last sample carrying it
                    slow[g.index] = {"ecc": g.ecc_sbe_volatile, "replays": g.pcie_replay_count, "amd": g.amd}
                else:
                    assert g.amd is None
                if card == 7 and t >= 22:
                    assert g.utilization_pct is None  # lost: nothing read
                    continue
                hot = card == 4 and t >= 15
                assert (g.utilization_pct, g.power_w, g.temperature_c) == (
                    (12.0, 500.0, 101.0) if hot else (87.0, 312.0, 54.0)
                )
                assert g.memory_used_mib == (60 + card) * 1024 / n
                amd = slow[g.index]["amd"]
                assert amd is not None
                ue = {b.block: b.ue for b in amd.ras}
                assert ue["umc"] == (1 if card == 1 and t >= 5 else 0)
                assert ue["gfx"] == (2 if card == 2 and t >= 9 else 0)
                assert ue["sdma"] == (1 if card == 3 and t >= 12 else 0)
                assert amd.bad_pages == (2000 if card == 5 and t >= 18 else 0)
                assert slow[g.index]["ecc"] == (3 if card == 1 and t >= 5 else 5 if card == 3 and t >= 12 else 0)
                assert slow[g.index]["replays"] == (90 if hot else 0)
    expected = []
    for t, kind, card, block in [(5, FaultKind.AMD_RAS_UE, 1, "umc"), (9, FaultKind.AMD_RAS_UE, 2, "gfx"),
                                 (12, FaultKind.AMD_RAS_UE, 3, "sdma"), (15, FaultKind.THERMAL, 4, None),
                                 (15, FaultKind.PCIE, 4, None), (18, FaultKind.AMD_BAD_PAGES, 5, None),
                                 (22, FaultKind.GPU_LOST, 7, None)]:  # fmt: skip
        expected += [(t, kind, card * n + p, block) for p in range(n)]
    assert sorted(faults, key=str) == sorted(expected, key=str)
