"""`chamber agent --simulate` keeps every sample through a NATS crash: 16 nodes sample while the
server is killed (-9) and restarted, and afterwards the stream holds every (node, sequence) exactly once."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from events import NodeSample, decode
from services.runtime import connect
from tests.secured_bus import SecuredNatsServer

pytestmark = [pytest.mark.e2e, pytest.mark.bus_cluster("e2e")]
CHAMBER = str(Path(sys.executable).parent / "chamber")
NODES = 16
INTERVAL_S = 0.25  # 4 Hz instead of 1 Hz keeps the test short; the outage spans many intervals
OUTAGE_S = 10.0  # as in the issue


async def samples_in_stream(js: JetStreamContext) -> list[NodeSample]:
    sub = await js.pull_subscribe("chamber.telemetry.sample.e2e.*", durable=None)
    out: list[NodeSample] = []
    try:
        while True:
            try:
                msgs = await sub.fetch(2000, timeout=1.0)
            except TimeoutError:
                break
            for m in msgs:
                event = decode(m.headers, m.data).event
                assert isinstance(event, NodeSample)
                out.append(event)
            if len(msgs) < 2000:
                break
    finally:
        await sub.unsubscribe()
    return out


async def count_samples(url: str) -> int:
    nc = await connect(url, name="probe")
    try:
        info = await nc.jetstream().stream_info("TELEMETRY")
        return info.state.messages
    except Exception:
        return 0
    finally:
        await nc.close()


async def wait_until(check, within: float) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_every_sample_reaches_the_stream_exactly_once_across_a_kill_9_of_nats(
    nats_server: SecuredNatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    # `js`: the streams exist (the services made them); the simulator may not create them
    spool = tmp_path / "spool"
    log = open(tmp_path / "agent.log", "w")  # noqa: ASYNC230, SIM115 (a subprocess writes it)
    agent = subprocess.Popen(  # noqa: ASYNC220 (returns at once; the loop has nothing else to run)
        [CHAMBER, "agent", "--simulate", "--nodes", str(NODES), "--gpus-per-node", "8", "--interval", str(INTERVAL_S),
         "--cluster", "e2e", "--nats", nats_server.url_for("simulator"), "--spool", str(spool), "--log-level", "info"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        await wait_until(lambda: _more_than(nats_server.url, NODES * 8), within=30)
        nats_server.kill()
        killed_at = time.time()
        await asyncio.sleep(OUTAGE_S)
        spooled = list(spool.rglob("*.seg"))
        assert spooled, "samples taken during the outage were not spooled to disk"
        assert agent.poll() is None, "the agent died with the server"
        nats_server.start()
        restarted_at = time.time()
        await asyncio.sleep(3.0)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
        log.close()

    nc = await connect(nats_server.url, name="check")
    try:
        samples = await samples_in_stream(nc.jetstream())
    finally:
        await nc.close()
    log_text = (tmp_path / "agent.log").read_text()
    assert "Traceback" not in log_text, log_text[-3000:]
    taken = json.loads(next(spool.rglob("seq.json")).read_text())  # the agent's next sequence per node
    assert len(taken) == NODES

    seen = Counter((s.node, s.seq) for s in samples)
    duplicates = [k for k, n in seen.items() if n > 1]
    assert duplicates == []
    for node, next_seq in taken.items():
        assert {seq for (n, seq) in seen if n == node} == set(range(next_seq)), f"{node} lost samples"
    during = [s for s in samples if killed_at + 0.5 < s.observed_at < restarted_at - 0.5]
    assert len({s.node for s in during}) == NODES
    assert len(during) >= NODES * (OUTAGE_S - 1.5) / INTERVAL_S
    assert list(spool.rglob("*.seg")) == [], "the spool was not emptied after the restart"


async def _more_than(url: str, n: int) -> bool:
    return await count_samples(url) > n
