"""What-if on recorded history: a scripted job history goes through a real nats-server into the real
recorder and chDB; `chamber sim --from-warehouse` replays it under the recorded and a proposed quota set."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from events import JobFailed, JobPreempted, JobSpec, JobSubmitted, PreemptionReason, TeamQuotaSet
from services.runtime import Publisher
from services.runtime.nats_server import free_port
from services.tracesim import history
from services.tracesim.history import load_history
from services.warehouse import migrate
from services.warehouse.chdb_backend import ChdbWarehouse
from tests.integration.test_recorder_pipeline import start_recorder
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer
from tests.warehouse_builders import T0, an_inventory, completed, resumed, scheduled, submitted

pytestmark = pytest.mark.integration

CHAMBER = str(Path(sys.executable).parent / "chamber")

# vision keeps most of the fleet and nlp may not borrow: under the recorded quotas nlp never runs.
PROPOSED = """
[pools.default]
gpus = 8
[teams.vision]
guaranteed = 4
[teams.nlp]
guaranteed = 4
"""


def quota(team: str, guaranteed: int, at: float, borrow_limit: int | None = None) -> TeamQuotaSet:
    return TeamQuotaSet(team=team, pool="default", at=at, guaranteed_gpus=guaranteed, borrow_limit=borrow_limit)


async def publish_history(js: JetStreamContext) -> int:
    """One 8-GPU node; a week-old job outside the window; five jobs inside it. Returns events published."""
    pub = Publisher(js, source="test")
    script = [
        (an_inventory("n1", gpus=8, model="B200", at=T0 - 3600), "inv"),
        (quota("vision", 8, T0 - 900), "q-v1"),
        (quota("vision", 6, T0 - 600), "q-v2"),  # the latest quota of a team is the one in force
        (quota("nlp", 0, T0 - 600, borrow_limit=0), "q-n1"),
        (submitted("old", "vision", 8, T0 - 7 * 86400), "old-sub"),
        (scheduled("old", "vision", "n1", list(range(8)), T0 - 7 * 86400 + 1), "old-sched"),
        (completed("old", T0 - 7 * 86400 + 3600), "old-done"),
        # v1: ran one hour on 4 GPUs
        (submitted("v1", "vision", 4, T0, model="B200"), "v1-sub"),
        (scheduled("v1", "vision", "n1", [0, 1, 2, 3], T0 + 10), "v1-sched"),
        (completed("v1", T0 + 3610), "v1-done"),
        # v2: 290 s of progress (100 s thrown away by a preemption), then 590 s after resuming
        (submitted("v2", "vision", 2, T0 + 120), "v2-sub"),
        (scheduled("v2", "vision", "n1", [4, 5], T0 + 3610), "v2-sched"),
        (
            JobPreempted(
                job_id="v2", at=T0 + 4000, team="vision", reason=PreemptionReason.PRIORITY, lost_work_gpu_s=200
            ),
            "v2-pre",
        ),
        (resumed("v2", "n1", [4, 5], T0 + 5410), "v2-res"),
        (completed("v2", T0 + 6000), "v2-done"),
        # n1: ran 30 minutes, then failed (it held its GPUs that long)
        (submitted("n1", "nlp", 4, T0 + 60, model="A100-40GB"), "n1-sub"),
        (scheduled("n1", "nlp", "n1", [4, 5, 6, 7], T0 + 6000), "n1-sched"),
        (JobFailed(job_id="n1", at=T0 + 7800, reason="OOM"), "n1-fail"),
        # n2: never started, with the user's estimate; n3: never started, no estimate (left out)
        (
            JobSubmitted(
                job_id="n2",
                at=T0 + 130,
                spec=JobSpec(team="nlp", gpus_per_replica=2, replicas=2, expected_duration_s=600),
            ),
            "n2-sub",
        ),
        (submitted("n3", "nlp", 1, T0 + 140), "n3-sub"),
        # r1: still running now
        (submitted("r1", "nlp", 2, T0 + 7900), "r1-sub"),
        (scheduled("r1", "nlp", "n1", [6, 7], T0 + 8000), "r1-sched"),
    ]
    for event, id_ in script:
        await pub.publish(event, id=id_)
    return len(script) - 1  # the inventory is not an audit fact


async def chamber(*argv: str, nats: str, data_dir: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CHAMBER, "sim", *argv, "--nats", nats, "--data-dir", str(data_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "CHAMBER_CLICKHOUSE_URL": ""},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_recorded_jobs_replay_under_current_and_proposed_quotas(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warehouse = ChdbWarehouse(tmp_path)
    migrate(warehouse)
    stop, task, writer = await start_recorder(nats_server.url_for("recorder"), warehouse)
    try:
        audit = await publish_history(js)
        await eventually(lambda: warehouse.count("events") == audit and warehouse.count("gpu_inventory") == 8, 20)

        # The loader on the warehouse itself, a few rows a page (as the recorder would page a big answer).
        monkeypatch.setattr(history, "PAGE", 3)

        def direct(sql: str) -> tuple[list[list[object]], bool]:
            return warehouse.query(sql, readonly=True).rows, False

        end = T0 + 9000
        h = load_history(direct, end - 86400, end)
        jobs = {j.id: j for j in h.loaded.jobs}
        assert sorted(jobs) == ["n1", "n2", "r1", "v1", "v2"]
        assert [(j.id, j.submit_s) for j in h.loaded.jobs][:3] == [("v1", 0.0), ("n1", 60.0), ("v2", 120.0)]
        assert {k: (j.duration_s, j.gpus, j.team) for k, j in jobs.items()} == {
            "v1": (3600.0, 4, "vision"),
            "v2": (290.0 + 590.0, 2, "vision"),
            "n1": (1800.0, 4, "nlp"),
            "n2": (600.0, 4, "nlp"),
            "r1": (1000.0, 2, "nlp"),  # running at the window's end: its run so far
        }
        assert h.loaded.summary() == {
            "jobs": 5,
            "completed": 2,
            "failed_or_cancelled": 1,
            "running_at_end": 1,
            "pending_estimated": 1,
            "pending_skipped": 1,
            "finished_without_running": 0,
        }
        assert {t: (q.guaranteed, q.borrow_limit) for t, q in h.quotas.items()} == {"vision": (6, None), "nlp": (0, 0)}
        assert (h.fleet_gpus, h.gpus_per_node, h.gpu_model) == (8, 8, "B200")
        assert (jobs["v1"].gpu_model, jobs["n1"].gpu_model) == ("B200", "A100-40GB")

        # The command, while the recorder holds chDB: it asks the recorder over NATS.
        proposed = tmp_path / "proposed.toml"
        proposed.write_text(PROPOSED)
        rc, out, err = await chamber(
            "--from-warehouse", "--since", "2d", "--quotas", str(proposed), "--json",
            nats=nats_server.url, data_dir=tmp_path,
        )  # fmt: skip
        assert rc == 0, err
        result = json.loads(out)
        assert result["fleet"] == {"gpus": 8, "gpus_per_node": 8, "nodes": 1, "gpu_model": "B200"}
        assert result["trace"]["jobs"] == 5 and result["trace"]["running_at_end"] == 1
        assert result["quotas"]["current"]["vision"]["guaranteed"] == 6
        current, new = result["policies"]["current"], result["policies"]["proposed"]
        assert set(current) == set(new) and {"utilization", "by_team", "jain_fairness"} <= set(current)
        # Recorded quotas: nlp has no guarantee and may not borrow, so its three jobs never run.
        assert (current["jobs_completed"], current["jobs_unfinished"]) == (2, 3)
        assert current["by_team"]["nlp"]["entitlement"] == 0 and current["by_team"]["nlp"]["received_gpu_hours"] == 0
        # Proposed: nlp is guaranteed half the node; everything runs.
        assert (new["jobs_completed"], new["jobs_unfinished"]) == (5, 0)
        assert new["by_team"]["nlp"]["entitlement"] > 0 and new["by_team"]["nlp"]["received_gpu_hours"] > 0
        assert "still running" in err and "left out" in err and "1 job(s) asked for a GPU model other than B200" in err

        rc, out, _ = await chamber(
            "--from-warehouse", "--since", "2d", "--quotas", str(proposed), nats=nats_server.url, data_dir=tmp_path
        )
        assert rc == 0 and "current" in out.splitlines()[1] and "proposed" in out.splitlines()[1]
        assert "5 recorded jobs of the last 2d on 8 GPUs" in out

        rc, _, err = await chamber(
            "--from-warehouse", "--since", "1m", "--quotas", str(proposed), nats=nats_server.url, data_dir=tmp_path
        )
        assert rc != 0 and "no jobs were submitted in the window" in err and "Traceback" not in err
        rc, _, err = await chamber(
            "--from-warehouse", "--since", "7x", "--quotas", str(proposed), nats=nats_server.url, data_dir=tmp_path
        )
        assert rc != 0 and "--since '7x'" in err and "Traceback" not in err
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        writer.close()
        warehouse.close()


async def test_an_empty_warehouse_is_a_clear_error(tmp_path: Path) -> None:
    """No recorder anywhere: the command opens the (empty, never migrated) warehouse itself."""
    (tmp_path / "warehouse").mkdir()
    (tmp_path / "q.toml").write_text(PROPOSED)
    nowhere = f"nats://127.0.0.1:{free_port()}"
    rc, _, err = await chamber(
        "--from-warehouse", "--quotas", str(tmp_path / "q.toml"), nats=nowhere, data_dir=tmp_path
    )
    assert rc != 0 and "holds no recorded events" in err and "Traceback" not in err
