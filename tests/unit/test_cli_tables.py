"""What the CLI prints as tables: one helper aligns every column; the queue lists apart the jobs that
cannot run as specified; the price list names what each price covers."""

from __future__ import annotations

from services.cli.billing import price_text
from services.cli.jobs import human_times, queue_text
from services.cli.sim_fault import fault_text
from services.cli.tables import table


def test_columns_are_as_wide_as_their_widest_cell_and_numbers_align_right() -> None:
    text = table(("TEAM", "GPUS", "WHY"), [("vision", "8", "a"), ("nlp-research", "128", "b")], align="lrl")
    assert text.splitlines() == ["TEAM          GPUS  WHY", "vision           8  a", "nlp-research   128  b"]


def _job(job_id: str, reason: str, cannot_run: list[str], position: int | None) -> dict[str, object]:
    return {
        "id": job_id,
        "team": "vision",
        "priority": "normal",
        "gpus": 8,
        "replicas": 1,
        "state": "pending",
        "reason": reason,
        "cannot_run": cannot_run,
        "placement": {},
        "position": position,
        "priority_score": 1000.0,
        "age_s": 65.0,
    }


def test_jobs_that_cannot_run_as_specified_are_listed_apart_from_the_waiting_queue() -> None:
    why = "the job asks for 999 GPUs and pool default has 128 installed"
    text = queue_text(
        [
            _job("train-a", "waiting for capacity: needs 1x8 GPUs", [], 1),
            _job("huge", "cannot run until this changes: " + why, [why], 2),
        ]
    )
    waiting, apart = text.split("\n\ncannot run as specified")
    assert "train-a" in waiting and "huge" not in waiting
    assert apart.startswith(" (1; kept with --allow-wait until the fleet or quota changes):")
    assert apart.splitlines()[1].split() == ["ID", "TEAM", "GPUS", "WHY"]
    assert apart.splitlines()[2].startswith("huge") and apart.endswith(why)
    header, row = waiting.splitlines()
    assert header.index("REASON") == row.index("waiting for")  # aligned however wide the cells


def test_the_price_list_is_a_table_and_names_models_without_a_price() -> None:
    text = price_text(
        {
            "currency": "USD",
            "gpu_model": {"H100-80GB": 3.5},
            "instance_type": {"p5.48xlarge": 4.1},
            "cluster": {},
            "unpriced_models": ["A100-40GB"],
        }
    )
    lines = text.splitlines()
    assert lines[0].split() == ["PRICES", "NAME", "USD/GPU-HOUR"]
    assert lines[1].split() == ["GPU", "model", "H100-80GB", "3.5000"]
    assert lines[2].split() == ["instance", "type", "p5.48xlarge", "4.1000"]
    assert "without a price" in lines[3] and "A100-40GB" in lines[3]


def test_sim_fault_says_in_words_what_it_did() -> None:
    assert fault_text({"node": "sim-003", "kind": "xid", "gpu": None, "xid": 79}).startswith(
        "injected XID 79 on sim-003; the agent reports it at its next sample: `chamber fleet` shows"
    )
    assert fault_text({"node": "sim-003", "kind": "nic_down", "nic": 1}).startswith(
        "injected nic down on sim-003 NIC 1;"
    )
    assert fault_text({"node": "sim-003", "kind": "clear", "gpu": 2}) == "cleared the simulated faults of sim-003 GPU 2"


def test_perf_lines_in_explain_read_iso_times_not_epochs() -> None:
    line = "1796239017: slow (episode 1, 61% of its best since 1796239000), culprit gpu sim-001 GPU 2: 3.1x"
    assert human_times(line, 1796239077.0) == (
        "2026-12-02 19:16:57 UTC (1 min ago): slow (episode 1, 61% of its best since 2026-12-02 19:16:40 UTC "
        "(1 min 17 s ago)), culprit gpu sim-001 GPU 2: 3.1x"
    )


def test_fleet_counts_a_lost_node_as_lost_not_in_service() -> None:
    from services.cli.fleet import fleet_text

    gpus = [{"index": i, "model": "H100-80GB", "util": 50.0, "isolated": False} for i in range(8)]
    nodes = [
        {"cluster": "sim", "node": "sim-000", "status": "healthy", "reason": "reporting", "gpus": gpus},
        {"cluster": "sim", "node": "sim-001", "status": "lost", "reason": "no heartbeat for 60s", "gpus": gpus},
    ]
    text = fleet_text(nodes)
    assert "sim/sim-001  LOST  0/8 GPUs in service  no heartbeat for 60s" in text
    assert "sim/sim-000  HEALTHY  8/8 GPUs in service" in text
    lost_gpu = text.splitlines()[-3]
    assert lost_gpu.split() == ["gpu", "7", "H100-80GB", "util", "-", "node", "lost"]
    assert text.splitlines()[-2:] == [
        "2 nodes (1 lost), 16 GPUs, 8 in service",
        "(a lost node that left for good: `chamber fleet forget NODE`, or `chamber fleet forget-lost`)",
    ]
    assert fleet_text(nodes[:1]).endswith("1 nodes, 8 GPUs, 8 in service")  # no hint without lost nodes
