"""Commands over NATS refuse what the events would refuse (issue 16, findings 4, 5 and 6): nothing is
acknowledged and then dead-lettered, teams follow one rule, and long answers come in pages."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from services.quota import service as quota_service
from services.runtime import Publisher
from services.runtime.commands import MAX_REPLY_BYTES, CommandRefused, page_of_rows, request
from services.scheduler import service as scheduler_service
from tests.integration.test_runtime import eventually
from tests.integration.test_scheduler_service import Running, answers
from tests.scheduler_builders import a_node, a_quota
from tests.secured_bus import SecuredNatsServer

pytestmark = pytest.mark.integration


async def refused(nc: Client, service: str, verb: str, payload: dict[str, Any]) -> CommandRefused:
    with pytest.raises(CommandRefused) as caught:
        await request(nc, service, verb, payload)
    return caught.value


async def stream_messages(js: JetStreamContext, stream: str) -> int:
    return (await js.stream_info(stream)).state.messages


async def test_bad_submits_are_refused_naming_the_field_and_nothing_reaches_the_log(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    publisher = Publisher(js, source="test/setup")
    await publisher.publish(a_node("n1", gpus=8))
    await publisher.publish(a_quota("vision", 4))
    sched = Running(scheduler_service, nats_server.url_for("scheduler"))
    try:
        await eventually(lambda: answers(nc, "scheduler", "queue", {}))
        cases = [
            ({"team": "t" * 5000, "gpus": 1}, "team"),
            ({"team": "vision", "gpus": 1, "id": "j" * 300}, "id"),
            ({"team": "vision", "gpus": 1, "name": "n" * 900_000}, "name"),
            ({"team": "vision", "gpus": 2**70}, "gpus"),
            ({"team": "../..", "gpus": 1}, "team"),
            ({"team": "$SYS", "gpus": 1}, "team"),
            ({"team": "*", "gpus": 1}, "team"),
            ({"team": "a\x00b", "gpus": 1}, "team"),
            ({"team": "vision", "gpus": 1, "borrow": 2}, "borrow"),
            ({"team": "nobody", "gpus": 1}, "team"),  # no quota: not a team of this fleet
        ]
        for payload, field in cases:
            assert (await refused(nc, "scheduler", "submit", payload)).field == field, payload
        assert await stream_messages(js, "JOBS") == 0
        assert await stream_messages(js, "DEAD") == 0

        # a job larger than the fleet is refused with the numbers, or kept waiting with allow_wait
        too_big = await refused(nc, "scheduler", "submit", {"team": "vision", "gpus": 2, "replicas": 8})
        assert too_big.field == "gpus" and "asks for 16 GPUs and pool default has 8 installed" in str(too_big)
        assert "--allow-wait" in str(too_big)
        model = await refused(nc, "scheduler", "submit", {"team": "vision", "gpus": 1, "gpu_model": "H100-8GB"})
        assert model.field == "gpu_model" and "did you mean" in str(model)
        assert await stream_messages(js, "JOBS") == 0
        # `Vision ` is the team vision
        big = {"team": " Vision ", "gpus": 2, "replicas": 8, "id": "big", "allow_wait": True}
        ok = await request(nc, "scheduler", "submit", big)
        assert "it cannot run until this changes: the job asks for 16 GPUs" in ok["warnings"][0]
        [row] = (await request(nc, "scheduler", "queue", {}))["jobs"]
        assert row["team"] == "vision"
    finally:
        await sched.close()


async def test_quota_commands_normalise_the_team_and_refuse_unknown_fields(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    await Publisher(js, source="test/setup").publish(a_node("n1", gpus=8))
    quota = Running(quota_service, nats_server.url_for("quota"))
    try:
        await eventually(lambda: answers(nc, "quota", "list", {}))
        assert (await refused(nc, "quota", "set", {"team": "vision", "gpus": 4, "borrow": 0})).field == "borrow"
        assert (await refused(nc, "quota", "set", {"team": "Vi sion", "gpus": 4})).field == "team"
        assert (await refused(nc, "quota", "set", {"team": "vision", "gpus": 2**70})).field == "gpus"
        answer = await request(nc, "quota", "set", {"team": "VISION ", "gpus": 4})
        assert answer["team"] == "vision"
        assert await stream_messages(js, "DEAD") == 0
    finally:
        await quota.close()


def test_a_page_of_rows_stays_under_the_budget_and_says_where_the_rest_starts() -> None:
    rows = [{"id": f"j{i}", "name": "n" * 256} for i in range(10_000)]
    page = page_of_rows(rows)
    assert 0 < len(page["jobs"]) < len(rows) and page["total"] == 10_000
    assert page["next_offset"] == len(page["jobs"])
    assert len(str(page)) < MAX_REPLY_BYTES
    rest = page_of_rows(rows, offset=page["next_offset"], limit=5)
    assert [r["id"] for r in rest["jobs"]] == [f"j{i}" for i in range(page["next_offset"], page["next_offset"] + 5)]
    last = page_of_rows(rows, offset=9_998)
    assert len(last["jobs"]) == 2 and "next_offset" not in last


async def test_an_answer_or_a_request_over_the_max_payload_is_refused_with_the_truth(
    nats_server: SecuredNatsServer, nc: Client
) -> None:
    import asyncio

    import msgspec

    from services.runtime.host import ServiceContext, serve

    class Ask(msgspec.Struct):
        rows: int

    async def rows(ask: Ask) -> list[str]:
        return ["r" * 1000] * ask.rows

    async def setup(ctx: ServiceContext) -> None:
        ctx.command("rows", Ask, rows)

    stop = asyncio.Event()
    task = asyncio.create_task(serve("bulky", nats_server.url, setup, stop))
    try:
        await eventually(lambda: answers(nc, "bulky", "rows", {"rows": 1}))
        too_big = await refused(nc, "bulky", "rows", {"rows": 2000})  # ~2 MB: the server would drop it
        assert "over NATS's max payload" in str(too_big) and too_big.field == "limit"
        request_too_big = await refused(nc, "bulky", "rows", {"rows": 1, "pad": "x" * 2_000_000})
        assert "over the NATS server's max payload" in str(request_too_big)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_of_two_cancels_at_once_exactly_one_wins_and_the_other_is_told(
    nats_server: SecuredNatsServer, nc: Client, js: JetStreamContext
) -> None:
    """Two operators read the job (its sequence) and cancel it at once: both carry what they read, the
    scheduler takes one and refuses the other, saying the job changed since."""
    import asyncio

    await Publisher(js, source="test/setup").publish(a_quota("vision", 4))
    sched = Running(scheduler_service, nats_server.url_for("scheduler"))
    try:
        await eventually(lambda: answers(nc, "scheduler", "queue", {}))
        await request(nc, "scheduler", "submit", {"team": "vision", "gpus": 1, "id": "twice"})
        read = (await js.get_last_msg("JOBS", "chamber.jobs.twice")).seq
        cancel = {"job": "twice", "by": "alice", "reason": "test", "expected_seq": read}
        results = await asyncio.gather(
            request(nc, "scheduler", "cancel", cancel),
            request(nc, "scheduler", "cancel", cancel),
            return_exceptions=True,
        )
        won = [r for r in results if isinstance(r, dict)]
        lost = [r for r in results if isinstance(r, CommandRefused)]
        assert len(won) == 1 and len(lost) == 1, results
        assert "changed while this cancel was on its way" in str(lost[0]) and lost[0].field == "job"
        assert won[0]["seq"] == read + 1  # the job's sequence now, for a next change
        info = await js.stream_info("JOBS", subjects_filter="chamber.jobs.>")
        assert info.state.subjects == {"chamber.jobs.twice": 2}  # submitted, cancelled once
    finally:
        await sched.close()
