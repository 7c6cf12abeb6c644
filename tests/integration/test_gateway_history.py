"""The gateway's history from the warehouse: a real nats-server, the real recorder on chDB in a temp
dir, and the gateway asking the recorder over `chamber.cmd.recorder.sql`.

Five whole minutes [B, B + 300), ten minutes ago. n1 has 4 H100s at 80, 80, 20, 0 % utilization.
  j1 vision holds GPUs 0, 1 the whole window:   allocated 2, busy 1.6   (minutes 0 and 1)
  j2 nlp, submitted B + 60, holds GPU 2 from B + 120:  allocated 3, busy 1.8   (minutes 2 to 4)
  j3 research waits for 8 GPUs the whole window: queue depth 1, and 2 at minute 1 (j2 waits too)
efficiency = busy / 4: 0.4 then 0.45;  idle share = unallocated / 4: 0.5 then 0.25.
Billing accrued [B, B + 300): vision 2.00, nlp 0.50, idle 1.00.
When the recorder stops, the same endpoints answer from the gateway's live series instead.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client

from events import CostAccrued, Event
from services.runtime.commands import CommandUnavailable, request
from services.warehouse import migrate
from services.warehouse.chdb_backend import ChdbWarehouse
from tests.integration.test_gateway_api import Gateway, _up, publish, start_gateway
from tests.integration.test_recorder_pipeline import start_recorder
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer
from tests.warehouse_builders import a_sample, an_inventory, scheduled, submitted

pytestmark = pytest.mark.integration

B = float(math.floor(time.time() / 60) * 60 - 600)


def a_cost(team: str | None, cost: float, gpu_seconds: float) -> CostAccrued:
    return CostAccrued(
        period_start=B, period_end=B + 300, gpu_model="H100-80GB", gpu_seconds=gpu_seconds, cost=cost, team=team,
        job_id=None, pool="default", idle=team is None,
    )  # fmt: skip


def five_minutes() -> list[Event]:
    events: list[Event] = [
        an_inventory("n1", gpus=4, at=B),
        submitted("j1", "vision", 2, B),
        scheduled("j1", "vision", "n1", [0, 1], B),
        submitted("j3", "research", 8, B),
        submitted("j2", "nlp", 1, B + 60),
        scheduled("j2", "nlp", "n1", [2], B + 120),
        a_cost("vision", 2.0, 600.0),
        a_cost("nlp", 0.5, 180.0),
        a_cost(None, 1.0, 420.0),
    ]
    events += [a_sample("n1", B + 10 * k, [80, 80, 20, 0], seq=k) for k in range(30)]
    return events


async def recorded(nc: Client) -> bool:
    tables = ("gpu_samples", "job_events", "cost_ledger")
    sql = "SELECT " + ", ".join(f"(SELECT count() FROM {t})" for t in tables)
    try:
        answer = await request(nc, "recorder", "sql", {"sql": sql})
    except CommandUnavailable:  # still starting
        return False
    return list(answer["rows"][0]) == [120, 5, 3]


async def test_history_comes_from_the_warehouse_and_falls_back_to_the_live_series(
    nats_server: SecuredNatsServer, nc: Client, js: object, tmp_path: Path
) -> None:
    warehouse = ChdbWarehouse(tmp_path / "warehouse")
    migrate(warehouse)
    rec_stop, rec_task, _ = await start_recorder(nats_server.url_for("recorder"), warehouse)
    # the recorder's first queries on a loaded machine (tests run in parallel) may take seconds
    gw_stop, gw_task, url = await start_gateway(nats_server.url_for("gateway"), command_timeout=15.0)
    try:
        await publish(nc, five_minutes())
        await eventually(lambda: recorded(nc), within=30)
        async with aiohttp.ClientSession() as http:
            gw = Gateway(url, http)
            await eventually(lambda: _up(gw))

            # On a loaded machine the recorder's first answer can take longer than the gateway
            # waits, and the gateway then rightly serves the live series: ask until it answers.
            async def from_warehouse() -> bool:
                status, body = await gw.get(f"/api/history?since={B}")
                return status == 200 and body["source"] == "warehouse"

            await eventually(from_warehouse, within=60)
            status, history = await gw.get(f"/api/history?since={B}")
            assert status == 200 and history["source"] == "warehouse"
            assert history["step_s"] == 60 and history["since"] == B
            got = [
                (p["at"] - B, p["capacity"], p["allocated"], p["busy"], p["efficiency_score"], p["idle_ratio"])
                for p in history["points"]
            ]
            assert got == [
                (0, 4, 2, 1.6, 0.4, 0.5),
                (60, 4, 2, 1.6, 0.4, 0.5),
                (120, 4, 3, 1.8, 0.45, 0.25),
                (180, 4, 3, 1.8, 0.45, 0.25),
                (240, 4, 3, 1.8, 0.45, 0.25),
            ]
            assert [p["queue_depth"] for p in history["points"]] == [1, 2, 1, 1, 1]
            assert history["points"][-1]["cost_total"] == pytest.approx(3.5)  # the period ends with the window
            assert history["cost_by_team"] == [
                {"team": "vision", "cost": 2.0, "gpu_hours": pytest.approx(600 / 3600, abs=1e-4)},
                {"team": "idle", "cost": 1.0, "gpu_hours": pytest.approx(420 / 3600, abs=1e-4)},
                {"team": "nlp", "cost": 0.5, "gpu_hours": 0.05},
            ]
            assert {(c["at"] - B, c["team"], c["cost"]) for c in history["cost"]} == {
                (300, "vision", 2.0),
                (300, "nlp", 0.5),
                (300, "idle", 1.0),
            }

            # /api/efficiency?since= serves the same series
            status, efficiency = await gw.get(f"/api/efficiency?since={B}")
            assert efficiency["source"] == "warehouse"
            assert [p["efficiency_score"] for p in efficiency["history"]] == [0.4, 0.4, 0.45, 0.45, 0.45]

            # the recorder stops: the gateway serves its own live series, and says so
            rec_stop.set()
            await asyncio.wait_for(rec_task, 15)
            # (another window than before: the gateway keeps the warehouse's answer for a few seconds)
            status, live = await gw.get(f"/api/history?since={B + 60}")
            assert status == 200 and live["source"] == "live"
            assert all(p["at"] >= B + 60 for p in live["points"]) and len(live["points"]) >= 1
            totals = [(c["team"], c["cost"]) for c in live["cost_by_team"]]
            assert totals == [("vision", 2.0), ("idle", 1.0), ("nlp", 0.5)]  # so far, from the read model
            status, efficiency = await gw.get(f"/api/efficiency?since={B + 120}")
            assert efficiency["source"] == "live"

            status, problem = await gw.get(f"/api/history?since={time.time() + 60}")
            assert status == 400 and problem["field"] == "since"
    finally:
        rec_stop.set()
        gw_stop.set()
        await asyncio.wait_for(gw_task, 15)
        await asyncio.wait_for(rec_task, 15)
        warehouse.close()
