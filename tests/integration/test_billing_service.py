"""The billing service on a real nats-server: prices by command, costs published and recorded."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import (
    BudgetExceeded,
    BudgetSet,
    CostAccrued,
    JobCancelled,
    NodeDiscovered,
    PoolDefined,
    ServingTokensReported,
    decode,
)
from services.billing import service as billing_service
from services.runtime import Publisher
from services.runtime.commands import CommandRefused, CommandUnavailable, request
from services.runtime.nats_server import free_port
from services.warehouse import migrate
from services.warehouse.chdb_backend import ChdbWarehouse
from tests.integration.test_recorder_pipeline import start_recorder
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer
from tests.warehouse_builders import T0, a_serving_replica, an_inventory, completed, scheduled, submitted

pytestmark = pytest.mark.integration
CHAMBER = str(Path(sys.executable).parent / "chamber")


async def billing_events(js: JetStreamContext) -> list[object]:
    info = await js.stream_info("BILLING")
    out: list[object] = []
    if info.state.messages == 0:
        return out
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg("BILLING", seq)
        out.append(decode(msg.headers, msg.data).event)
    return out


def in_one_month(t0: float, span_s: float = 2 * 3600) -> float:
    """`t0`, or an earlier hour when [t0, t0 + span_s] would straddle a calendar month: budgets are
    monthly, so a scenario across midnight on the 1st splits its spending (the test failed in the
    first hours of every month)."""
    month_start = datetime.fromtimestamp(t0 + span_s, tz=UTC).replace(day=1, hour=0, minute=0, second=0)
    start = month_start.timestamp()
    return t0 if start <= t0 else start - 6 * 3600


async def test_billing_accrues_published_costs_that_the_recorder_records_and_the_report_shows(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    t0 = in_one_month(T0)
    warehouse = ChdbWarehouse(tmp_path)
    migrate(warehouse)
    rec_stop, rec_task, writer = await start_recorder(nats_server.url_for("recorder"), warehouse)
    stop = asyncio.Event()
    args = argparse.Namespace(
        nats=nats_server.url_for("billing"), period=3600.0, settle=0.0, tick=0.2, price=["H100-80GB=2.0"]
    )
    task = asyncio.create_task(billing_service.run(args, stop))
    try:
        pub = Publisher(js, source="test")
        inv = an_inventory("n1", gpus=2, at=t0)
        await pub.publish(PoolDefined(pool="train", at=t0, gpu_model="H100-80GB"))
        await pub.publish(BudgetSet(team="vision", at=t0, amount=1.0))
        await pub.publish(NodeDiscovered(cluster="c1", node="n1", at=t0, gpus=inv.gpus))
        await pub.publish(submitted("j1", "vision", 1, t0))
        await pub.publish(scheduled("j1", "vision", "n1", [0], t0))
        await pub.publish(completed("j1", t0 + 1800))  # 1800 GPU-s at $2/h = $1.00 (budget not passed)
        await pub.publish(scheduled("j2", "vision", "n1", [1], t0 + 3600))
        await pub.publish(completed("j2", t0 + 3600 + 360))  # 360 GPU-s = $0.20: vision spent $1.20 > $1.00

        async def exceeded() -> bool:
            return any(isinstance(e, BudgetExceeded) for e in await billing_events(js))

        await eventually(exceeded, within=20)
        events = await billing_events(js)
        job_costs = {e.job_id: e.cost for e in events if isinstance(e, CostAccrued) and not e.idle}
        assert job_costs == pytest.approx({"j1": 1.0, "j2": 0.2})
        # First hour idle: 2 GPUs x 3600 s - 1800 s held = 5400 s = $3.00 in pool train.
        first_idle = next(e for e in events if isinstance(e, CostAccrued) and e.idle and e.period_start == t0)
        assert (first_idle.pool, first_idle.gpu_seconds, first_idle.cost) == ("train", 5400, pytest.approx(3.0))

        reply = await request(nc, "billing", "price", {"gpu_model": "A100-40GB", "price_per_gpu_hour": 1.5})
        assert reply["price_per_gpu_hour"] == 1.5
        with pytest.raises(CommandRefused) as refused:
            await request(nc, "billing", "price", {"gpu_model": "A100-40GB", "price_per_gpu_hour": -1})
        assert refused.value.field == "price_per_gpu_hour"

        await eventually(
            lambda: (
                warehouse.count("prices") == 2
                and warehouse.count("cost_ledger") == len([e for e in events if isinstance(e, CostAccrued)])
            ),
            within=20,
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        rec_stop.set()
        await asyncio.wait_for(rec_task, 15)
        writer.close()
        warehouse.close()

    report = json.loads(await asyncio.to_thread(billing_report, tmp_path))
    vision = next(t for t in report["teams"] if t["team"] == "vision")
    assert vision["cost"] == pytest.approx(1.2) and vision["jobs"] == 2 and vision["budget"] == 1.0
    assert vision["gpu_hours"] == pytest.approx((1800 + 360) / 3600)
    assert {i["pool"] for i in report["idle"]} == {"train"}


def billing_report(data_dir: Path) -> str:
    chamber = str(Path(sys.executable).parent / "chamber")
    nats = f"nats://127.0.0.1:{free_port()}"  # nothing there: the CLI opens the data dir itself
    args = ["billing", "report", "--since", "1d", "--json", "--data-dir", str(data_dir), "--nats", nats]
    return subprocess.run([chamber, *args], capture_output=True, text=True, check=True).stdout


async def test_cost_per_serving_workload_and_per_million_tokens_by_command(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    t0 = in_one_month(T0)
    stop = asyncio.Event()
    args = argparse.Namespace(
        nats=nats_server.url_for("billing"), period=3600.0, settle=0.0, tick=0.2, price=["H100-80GB=2.0"]
    )
    task = asyncio.create_task(billing_service.run(args, stop))
    try:
        pub = Publisher(js, source="test")
        inv = an_inventory("n1", gpus=2, at=t0)
        await pub.publish(NodeDiscovered(cluster="c1", node="n1", at=t0, gpus=inv.gpus))
        await pub.publish(a_serving_replica("k8s-c1-ml-deployment-llm-r0", 0, t0))
        await pub.publish(scheduled("k8s-c1-ml-deployment-llm-r0", "vision", "n1", [0, 1], t0))
        await pub.publish(JobCancelled(job_id="k8s-c1-ml-deployment-llm-r0", at=t0 + 3600, by="kubernetes"))

        async def accrued() -> bool:
            try:
                answer = await request(nc, "billing", "serving", {})
            except CommandUnavailable:  # not subscribed yet
                return False
            return bool(answer["workloads"]) and answer["workloads"][0]["cost"] == pytest.approx(4.0)

        await eventually(accrued, within=20)  # 2 GPUs x 1 h at 2.0 a GPU-hour
        with pytest.raises(CommandRefused, match="no serving workload deployment/web in namespace ml"):
            await request(nc, "billing", "tokens", {"namespace": "ml", "workload": "deployment/web", "tokens": 1})
        cli = [CHAMBER, "billing", "tokens", "deployment/llm", "2000000", "-n", "ml", "--report-id", "r1"]
        done = await asyncio.to_thread(
            subprocess.run, [*cli, "--nats", nats_server.url], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == "c1/ml/deployment/llm: 2000000 tokens recorded\n"
        report = {"namespace": "ml", "workload": "deployment/llm", "tokens": 2_000_000, "report_id": "r1"}
        await request(nc, "billing", "tokens", report)  # a retry with the same report id counts once
        [row] = (await request(nc, "billing", "serving", {}))["workloads"]
        assert (row["tokens"], row["cost_per_million_tokens"]) == (2_000_000, pytest.approx(2.0))
        reported = [e for e in await billing_events(js) if isinstance(e, ServingTokensReported)]
        assert [(e.team, e.workload, e.tokens) for e in reported] == [("vision", "deployment/llm", 2_000_000)]
    finally:
        stop.set()
        await task
