"""`chamber scheduler replay`: a cycle the scheduler logged (positions, time, the mark it started
from), re-run from the log, decides the events the scheduler published, with the same ids."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from asyncio.subprocess import PIPE
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from structlog.testing import capture_logs

from events import JobPreempted, JobResumed, JobScheduled, decode
from services.cli.scheduler import service_settings
from services.runtime import Publisher
from services.runtime.commands import request
from services.runtime.logs import configure_logging
from services.scheduler import service as scheduler_service
from services.scheduler.replay import fold_to, mark_from_record, rerun
from tests.integration.test_runtime import eventually
from tests.integration.test_scheduler_service import Running, answers
from tests.scheduler_builders import a_node, a_quota
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration
DECISIONS = (JobScheduled, JobResumed, JobPreempted)
# the settings of ARGS (tests/integration/test_scheduler_service.py), as `chamber service scheduler` options
ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ["--topology-key", "rack", "--preemption-searches", "4", "--interval", "0.1"]


async def published_by_time(js: JetStreamContext) -> dict[float, set[str]]:
    """The decision ids in JOBS, by the cycle time their events carry (`at`: the cycle's `now`)."""
    last = (await js.stream_info("JOBS")).state.last_seq or 0
    out: dict[float, set[str]] = defaultdict(set)
    for seq in range(1, last + 1):
        msg = await js.get_msg("JOBS", seq)
        envelope = decode(msg.headers, msg.data or b"")
        if isinstance(envelope.event, DECISIONS):
            out[envelope.event.at].add(envelope.id)
    return out


@pytest.fixture
def info_logs() -> Iterator[None]:
    """Info lines reach `capture_logs`: a CLI run in-process by an earlier test may have left structlog
    filtering at "error" (capture_logs swaps the processors, not the level filter)."""
    saved = structlog.get_config()
    configure_logging("info")
    try:
        yield
    finally:
        structlog.configure(**saved)


async def test_each_logged_cycle_replays_to_the_ids_the_scheduler_published(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext, tmp_path: Path, info_logs: None
) -> None:
    publisher = Publisher(js, source="test/discovery")
    for node in ("n1", "n2"):
        await publisher.publish(a_node(node, gpus=4, rack="r1"))
    await publisher.publish(a_quota("vision", 4))
    await publisher.publish(a_quota("nlp", 4))
    with capture_logs() as logs:
        sched = Running(scheduler_service, nats_server.url_for("scheduler"))
        await eventually(lambda: answers(nc, "scheduler", "queue", {}))
        for i, team in enumerate(["vision", "nlp", "vision"]):
            await request(nc, "scheduler", "submit", {"team": team, "gpus": 2, "id": f"first-{i}"})
        await eventually(lambda: len(_cycles(logs)) >= 1)
        await request(nc, "scheduler", "submit", {"team": "nlp", "gpus": 2, "id": "later"})  # an incremental cycle
        await eventually(lambda: len(_cycles(logs)) >= 2)
        await request(nc, "scheduler", "cancel", {"job": "first-0"})  # capacity frees: a full cycle
        await request(nc, "scheduler", "submit", {"team": "vision", "gpus": 2, "id": "third"})
        await eventually(lambda: len(_cycles(logs)) >= 3)
        await sched.close()
    published = await published_by_time(js)
    cycles = _cycles(logs)
    assert any(c["since"] is not None for c in cycles), "an incremental cycle was logged with its mark"

    scheduler = scheduler_service.Scheduler(service_settings(["--", *SETTINGS]))
    for logged in cycles:
        record = json.loads(json.dumps(logged))  # as the JSON log line reads back
        state, folded = await fold_to(nc, scheduler.manifest(), record["positions"])
        again = rerun(state, record["at"], mark_from_record(record["since"]), scheduler.policy)
        assert folded > 0 and len(again["decisions"]) == record["decisions"]
        assert {d["id"] for d in again["decisions"]} == published[record["at"]]

    # the command, on the last cycle's log line
    line = tmp_path / "cycle.json"
    line.write_text("not json\n" + json.dumps(cycles[-1]) + "\n")
    argv = ["scheduler", "replay", "--positions", str(line), "--nats", nats_server.url, "--", *SETTINGS]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", *argv, stdout=PIPE, stderr=PIPE, env=env
    )
    out, err = await done.communicate()
    assert done.returncode == 0, err.decode()
    printed = json.loads(out)
    assert {d["id"] for d in printed["decisions"]} == published[cycles[-1]["at"]]


def _cycles(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in logs if r.get("event") == "cycle" and "since" in r]
