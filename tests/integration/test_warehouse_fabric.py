"""NIC samples and slowdown episodes in the warehouse (real chDB): the recorder's rows, the DDL, the
`slowdown_episodes` view and the README's example query (GPU-hours lost to slow links)."""

from __future__ import annotations

from pathlib import Path

from events import Event
from events.fabric import CulpritKind, FabricSample, JobSlowdownCleared, JobSlowdownDetected, LinkState, NicSample
from services.recorder.rows import Recorded, build_tables
from services.warehouse import migrate
from services.warehouse.chdb_backend import ChdbWarehouse
from tests.warehouse_builders import T0

GPU_HOURS_LOST_TO_SLOW_LINKS = """
SELECT toStartOfWeek(detected_at) AS week, culprit,
       round(sum(dateDiff('second', since, coalesce(cleared_at, now64(3))) * (1 - score)) * 64 / 3600, 2)
         AS gpu_hours_lost
FROM slowdown_episodes WHERE culprit IN ('nic', 'fabric') GROUP BY week, culprit ORDER BY week, culprit
"""


def record(w: ChdbWarehouse, events: list[Event]) -> None:
    items = [Recorded(e, f"e{i}", "test", "", "TEST", "test", i + 1) for i, e in enumerate(events)]
    for name, table in build_tables(items).items():
        w.insert(name, table)


def test_fabric_samples_become_nic_rows_and_verdicts_become_episodes(tmp_path: Path) -> None:
    w = ChdbWarehouse(tmp_path)
    migrate(w)
    nics = [
        NicSample(
            name="mlx5_0/1", index=0, state=LinkState.UP, rate_gbps=400.0, tx_bytes_per_s=1e9, pause=3, gpu_index=0
        ),
        NicSample(name="mlx5_1/1", index=1, state=LinkState.DOWN, gpu_index=1),
    ]
    fabric = FabricSample(
        cluster="c1", node="n1", seq=1, observed_at=T0, interval_s=1.0, nics=nics, labels={"leaf": "l1"}
    )
    detected = JobSlowdownDetected(
        job_id="j1", episode=1, at=T0 + 10, since=T0, culprit=CulpritKind.NIC, score=0.5, confidence=0.9,
        cluster="c1", node="n1", gpu_index=1, nic="mlx5_1/1", reason="down",
    )  # fmt: skip
    cleared = JobSlowdownCleared(job_id="j1", episode=1, at=T0 + 3600, since=T0, reason="recovered")
    record(w, [fabric, detected, cleared])
    rows = w.query("SELECT nic, state, rate_gbps, tx_bytes_per_s, pause, gpu_index, leaf FROM nic_samples ORDER BY nic")
    assert rows.rows == [["mlx5_0/1", "up", 400.0, 1e9, 3, 0, "l1"], ["mlx5_1/1", "down", None, None, None, 1, "l1"]]
    assert w.query("SELECT count() FROM events WHERE type LIKE '%fabric_sample%'").rows == [[0]]  # not audited
    ep = w.query("SELECT job_id, episode, culprit, node, gpu_index, nic, cleared_reason FROM slowdown_episodes")
    assert ep.rows == [["j1", 1, "nic", "n1", 1, "mlx5_1/1", "recovered"]]
    lost = w.query(GPU_HOURS_LOST_TO_SLOW_LINKS)
    assert [r[1:] for r in lost.rows] == [["nic", 32.0]]  # 3600 s x (1 - 0.5) x 64 GPUs
