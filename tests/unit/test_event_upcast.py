"""Old majors of an event type keep decoding: the codec upcasts them (events/upcast.py), so the cores
fold one shape only. Fed with bodies stored as older builds wrote them (tests/data/events_v1/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from events import JobResumed, JobScheduled, PoolDefined
from events.codec import DecodeError, decode, encode
from events.upcast import lineage
from services.quota import core as quota
from services.scheduler.core import SchedulerState, evolve
from tests.scheduler_builders import a_job, a_node, a_quota

STORED = Path(__file__).resolve().parents[1] / "data" / "events_v1" / "jobs.jsonl"


def stored() -> dict[str, tuple[dict[str, str], bytes]]:
    lines = [json.loads(line) for line in STORED.read_text().splitlines() if line.strip()]
    return {d["name"]: (d["headers"], d["body"].encode()) for d in lines}


def test_a_v1_scheduled_without_a_pool_is_upcast_to_v2_in_the_default_pool() -> None:
    headers, body = stored()["scheduled before the pool field"]
    envelope = decode(headers, body)
    assert isinstance(envelope.event, JobScheduled) and JobScheduled.ce_type().endswith(".v2")
    assert envelope.event.pool == "default"
    assert (envelope.event.job_id, envelope.event.team, envelope.event.reason) == (
        "train-7",
        "vision",
        "fits on one node",
    )
    assert envelope.type == "io.chamber.jobs.scheduled.v1"  # the envelope still says what was on the wire


def test_a_v1_resumed_without_a_pool_is_upcast_too() -> None:
    event = decode(*stored()["resumed before the pool field"]).event
    assert isinstance(event, JobResumed) and event.pool == "default"
    assert event.placements[0].node == "n2" and event.placements[0].gpu_indices == [4, 5]


def test_a_v1_body_that_named_its_pool_keeps_it() -> None:
    event = decode(*stored()["scheduled with the pool field (v1, first release carrying it)"]).event
    assert isinstance(event, JobScheduled) and event.pool == "h100"


def test_a_current_event_round_trips_without_upcasting() -> None:
    event = JobScheduled(job_id="j", at=1.0, team="vision", placements=[], pool="h100")
    assert decode(*encode(event, source="test")).event == event


def test_a_v1_body_with_wrong_types_is_still_refused_with_the_reason() -> None:
    headers, body = stored()["scheduled before the pool field"]
    broken = json.loads(body)
    broken["at"] = "yesterday"
    with pytest.raises(DecodeError) as err:
        decode(headers, json.dumps(broken).encode())
    assert err.value.reason == "invalid" and "$.at" in err.value.detail


def test_an_unknown_major_names_the_known_ones() -> None:
    headers, body = stored()["scheduled before the pool field"]
    with pytest.raises(DecodeError) as err:
        decode({**headers, "ce-type": "io.chamber.jobs.scheduled.v3"}, body)
    assert err.value.reason == "unknown_version" and "io.chamber.jobs.scheduled.v2" in err.value.detail


def test_the_lineage_of_a_type_names_its_older_majors_for_warehouse_queries() -> None:
    assert lineage(JobScheduled.ce_type()) == {"io.chamber.jobs.scheduled.v1", "io.chamber.jobs.scheduled.v2"}


def _old_jobs_log() -> list[Any]:
    """JOBS as an old build wrote it: a submit, then a v1 `scheduled` without a pool (decoded now)."""
    headers, body = stored()["scheduled before the pool field"]
    submitted = a_job("train-7", team="vision", gpus=2, at=1780308000.0)
    return [submitted, decode(headers, body).event]


@pytest.mark.parametrize("quota_first", [True, False])
def test_an_old_log_folds_to_the_same_pool_whichever_stream_ran_ahead(quota_first: bool) -> None:
    """Before the upcaster, the fold guessed a pool-less job's pool from the quota state of the
    moment: a replay in which JOBS ran ahead of QUOTA counted it elsewhere (issue 14)."""
    fleet = [a_node("n1", gpus=8, model="H100")]
    quotas = [PoolDefined(pool="h100", at=1780300000.0, gpu_model="h100"), a_quota("vision", 8, pool="h100")]
    jobs = _old_jobs_log()
    log = [*fleet, *(quotas + jobs if quota_first else jobs + quotas)]
    state = SchedulerState()
    q = quota.QuotaState(half_life_s=600.0)
    for e in log:
        evolve(state, e)
        quota.evolve(q, e)
    assert state.jobs["train-7"].pool == "default"
    assert q.running["train-7"][0] == "default"
