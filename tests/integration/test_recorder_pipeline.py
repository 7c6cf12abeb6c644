"""The recorder from a real nats-server into real chDB: rows, rollups, audit log, exactly-once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from events import BudgetSet, CostAccrued, PriceSet, encode
from services.recorder.samples import SampleConsumer
from services.recorder.service import setup_recorder
from services.recorder.writer import Writer
from services.runtime import Publisher
from services.runtime.commands import CommandRefused, request
from services.runtime.host import ServiceContext, serve
from services.warehouse import QueryResult, Warehouse, WarehouseUnavailable, migrate
from services.warehouse.chdb_backend import ChdbWarehouse
from tests.integration.test_runtime import eventually
from tests.secured_bus import SecuredNatsServer
from tests.warehouse_builders import T0, a_sample, an_inventory, completed, scheduled, submitted

pytestmark = pytest.mark.integration


class Outage(Warehouse):
    """The real chDB warehouse behind a switch: while `down`, every insert fails as an unreachable
    server would. The first `lost_replies` inserts of the outage do land but fail all the same, as
    when the connection drops after the server stored the rows and before it answered."""

    kind = "chdb"

    def __init__(self, inner: Warehouse, *, lost_replies: int = 0) -> None:
        self.inner = inner
        self.down = False
        self.failures = 0
        self.lost_replies = lost_replies
        self._landed_in_outage = 0

    def command(self, sql: str) -> None:
        self.inner.command(sql)

    def query(self, sql: str, *, readonly: bool = False, settings: dict[str, Any] | None = None) -> QueryResult:
        return self.inner.query(sql, readonly=readonly, settings=settings)

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        if self.down:
            self.failures += 1
            if self._landed_in_outage < self.lost_replies:
                self._landed_in_outage += 1
                self.inner.insert(table, data, dedup_token=dedup_token)
                raise WarehouseUnavailable("connection reset (outage): the insert landed, its reply did not")
            raise WarehouseUnavailable("connection refused (outage)")
        self.inner.insert(table, data, dedup_token=dedup_token)

    def open_analytics(self, limits: Any) -> Any:
        return self.inner.open_analytics(limits)  # analytics SQL has its own session: no outage there

    def close(self) -> None:
        self.inner.close()


async def start_recorder(url: str, warehouse: Warehouse) -> tuple[asyncio.Event, asyncio.Task[ServiceContext], Writer]:
    writer = Writer(warehouse)
    stop = asyncio.Event()

    async def setup(ctx: ServiceContext) -> None:
        await setup_recorder(ctx, writer, batch_size=100, flush_interval=0.2)

    return stop, asyncio.create_task(serve("recorder", url, setup, stop)), writer


def counts(w: Warehouse) -> dict[str, int]:
    return {
        "samples": w.count("gpu_samples"),
        "minute_samples": int(w.query("SELECT sum(samples) FROM gpu_minute").scalar() or 0),
        "events": w.count("events"),
        "job_events": w.count("job_events"),
        "inventory": w.count("gpu_inventory FINAL"),
    }


async def publish_scenario(js: JetStreamContext, *, samples: int = 30) -> None:
    pub = Publisher(js, source="test")
    await pub.publish(an_inventory("n1", gpus=4), id="inv-n1")
    await pub.publish_many(
        (a_sample("n1", T0 + 10 * i, [50.0, 100.0, 0.0, 25.0], seq=i), f"s-{i}", None) for i in range(samples)
    )
    await pub.publish(submitted("j1", "vision", 2, T0), id="j1-sub")
    await pub.publish(scheduled("j1", "vision", "n1", [0, 1], T0 + 60), id="j1-sched")
    await pub.publish(completed("j1", T0 + 240), id="j1-done")
    await pub.publish(PriceSet(gpu_model="H100-80GB", at=T0, price_per_gpu_hour=3.6), id="price-1")
    await pub.publish(BudgetSet(team="vision", at=T0, amount=100.0), id="budget-1")
    await pub.publish(
        CostAccrued(
            period_start=T0, period_end=T0 + 3600, gpu_model="H100-80GB", gpu_seconds=360, cost=0.36, team="vision"
        ),
        id="cost-1",
    )


EXPECTED = {"samples": 120, "minute_samples": 120, "events": 6, "job_events": 3, "inventory": 4}


async def test_the_recorder_stores_samples_rollups_audit_log_and_answers_sql(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    warehouse = ChdbWarehouse(tmp_path)
    migrate(warehouse)
    stop, task, writer = await start_recorder(nats_server.url_for("recorder"), warehouse)
    try:
        await publish_scenario(js)
        await eventually(lambda: counts(warehouse) == EXPECTED, within=20)
        # per-GPU rollup of the first minute: 6 samples of 10 s at 50 % on GPU 0
        row = warehouse.query(
            "SELECT sum(samples), sum(seconds), sum(util_seconds), avgMerge(util_avg) FROM gpu_minute "
            f"WHERE node = 'n1' AND gpu_index = 0 AND minute = toDateTime({int(T0)}, 'UTC')"
        ).rows[0]
        assert row == [6, 60, 30, 50]
        assert warehouse.query("SELECT job_id, team, gpus FROM job_intervals").rows == [
            ["j1", "vision", [{"cluster": "c1", "node": "n1", "gpu_index": i} for i in (0, 1)]]
        ]
        assert warehouse.query("SELECT sum(cost) FROM cost_ledger").scalar() == 0.36

        SQL_S = 20.0  # the door answers in well under a second; a loaded machine (parallel tests) may not
        reply = await request(nc, "recorder", "sql", {"sql": "SELECT count() AS n FROM gpu_samples"}, timeout=SQL_S)
        assert reply["columns"] == ["n"] and reply["rows"] == [[120]]
        big = await request(
            nc, "recorder", "sql", {"sql": "SELECT repeat('x', 1000) FROM numbers(5000)"}, timeout=SQL_S
        )
        assert big["truncated"] and 0 < len(big["rows"]) < 5000  # what fits in one NATS reply
        with pytest.raises(CommandRefused, match="read-only"):
            await request(nc, "recorder", "sql", {"sql": "DROP TABLE gpu_samples"}, timeout=SQL_S)
        with pytest.raises(CommandRefused, match="one statement"):
            await request(
                nc, "recorder", "sql", {"sql": "SELECT 1; INSERT INTO events SELECT * FROM events"}, timeout=SQL_S
            )
    finally:
        stop.set()
        ctx = await asyncio.wait_for(task, 15)
        writer.close()
        warehouse.close()
    assert bulk_refused(ctx) == 0  # well-formed samples took the bulk decode


async def test_a_warehouse_outage_backs_off_then_stores_everything_exactly_once(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    real = ChdbWarehouse(tmp_path)
    migrate(real)
    warehouse = Outage(real, lost_replies=1)  # the first insert of the outage lands unconfirmed
    warehouse.down = True
    stop, task, writer = await start_recorder(nats_server.url_for("recorder"), warehouse)
    try:
        await publish_scenario(js)
        await eventually(lambda: warehouse.failures >= 3, within=20)
        assert counts(real)["samples"] <= EXPECTED["samples"]  # nothing acked, at most one batch stored
        info = await js.consumer_info("TELEMETRY", "recorder")
        assert info.num_ack_pending > 0 and info.num_redelivered == 0  # held in process, not redelivered
        warehouse.down = False
        await eventually(lambda: counts(real) == EXPECTED, within=30)
        await eventually(lambda: _all_acked(js), within=10)
        assert counts(real) == EXPECTED
        assert writer.duplicates_dropped > 0  # the unconfirmed insert was not stored twice
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        writer.close()
        real.close()


async def _all_acked(js: JetStreamContext) -> bool:
    for stream in ("TELEMETRY", "JOBS", "BILLING", "QUOTA"):
        info = await js.consumer_info(stream, "recorder")
        if info.num_pending or info.num_ack_pending:
            return False
    return True


def _recorder_process(url: str, data_dir: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "chamber"),
            "service",
            "recorder",
            "--nats",
            url,
            "--data-dir",
            str(data_dir),
            "--batch-size",
            "20",
            "--flush-interval",
            "0.2",
            "--ack-wait",
            "2",
            "--log-level",
            "warning",
        ],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def test_a_recorder_killed_between_insert_and_ack_restarts_without_duplicates(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    await publish_scenario(js, samples=60)
    crashing = _recorder_process(
        nats_server.url_for("recorder"), tmp_path, CHAMBER_RECORDER_CRASH_AFTER_INSERT="gpu_samples"
    )
    code = await asyncio.to_thread(crashing.wait, 60)
    assert code == 137, crashing.stderr.read().decode() if crashing.stderr else ""

    recorder = _recorder_process(nats_server.url_for("recorder"), tmp_path)
    try:
        await eventually(lambda: _all_acked(js), within=60)

        async def sql(query: str) -> int:
            reply = await request(nc, "recorder", "sql", {"sql": query}, timeout=10)
            return int(reply["rows"][0][0] or 0)

        # The crashed process stored a batch of samples without acking it; stored twice it would be 400.
        assert await sql("SELECT count() FROM gpu_samples") == 240

        # the minutes are recomputed from the de-duplicated samples within a rollup round (5 s)
        async def rolled_up() -> bool:
            return await sql("SELECT sum(samples) FROM gpu_minute") == 240

        await eventually(rolled_up, within=30)
        assert await sql("SELECT count() FROM events") == EXPECTED["events"]
        assert await sql("SELECT uniqExact(event_id, gpu_index) FROM gpu_samples") == 240

        # The CLI cannot open the directory the recorder holds: it asks the recorder.
        out = await asyncio.to_thread(cli_sql, nats_server.url, tmp_path, "SELECT count() AS n FROM gpu_samples")
        assert json.loads(out) == {"columns": ["n"], "rows": [[240]]}
    finally:
        recorder.terminate()
        await asyncio.to_thread(recorder.wait, 30)


async def test_a_broken_sample_is_dead_lettered_and_the_rest_of_its_batch_is_stored(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    warehouse = ChdbWarehouse(tmp_path)
    migrate(warehouse)
    good_headers, good_body = encode(a_sample("n1", T0, [10.0, 20.0]), source="test", id="good")
    bad_headers = {**good_headers, "ce-id": "bad", "Nats-Msg-Id": "bad"}
    await js.publish("chamber.telemetry.sample.c1.n1", b'{"cluster": "c1", "gpus": "not a list"}', headers=bad_headers)
    await js.publish("chamber.telemetry.sample.c1.n1", good_body, headers=good_headers)
    stop, task, writer = await start_recorder(nats_server.url_for("recorder"), warehouse)
    try:
        await eventually(lambda: warehouse.count("gpu_samples") == 2, within=20)
        dead = await js.stream_info("DEAD")
        assert dead.state.messages == 1
        msg = await js.get_msg("DEAD", dead.state.first_seq)
        assert msg.headers is not None and msg.headers["chamber-dead-reason"] in ("invalid", "malformed")
    finally:
        stop.set()
        ctx = await asyncio.wait_for(task, 15)
        writer.close()
        warehouse.close()
    assert bulk_refused(ctx) == 1  # the bulk decode refused the batch; the per-message path sorted it


def bulk_refused(ctx: ServiceContext) -> int:
    return sum(c.bulk_refused for c in ctx.consumers if isinstance(c, SampleConsumer))


def cli_sql(url: str, data_dir: Path, query: str) -> str:
    chamber = str(Path(sys.executable).parent / "chamber")
    args = ["sql", query, "--format", "json", "--nats", url, "--data-dir", str(data_dir)]
    return subprocess.run([chamber, *args], capture_output=True, text=True, check=True).stdout
