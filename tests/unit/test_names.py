"""One definition of names and limits (issue 16, findings 4 and 5), used by events and commands alike."""

from __future__ import annotations

import pytest

from events import JobSpec, JobSubmitted, TeamQuotaSet
from events.commands import SetTeamQuota, SubmitJob
from events.names import InvalidName, check_event, decode_request, normalize_team
from events.subjects import quota


@pytest.mark.parametrize(("given", "team"), [("vision", "vision"), ("Vision", "vision"), (" vision ", "vision")])
def test_one_rule_makes_spellings_of_a_team_the_same_team_and_the_same_subject(given: str, team: str) -> None:
    assert normalize_team(given) == team
    assert quota(normalize_team(given)) == "chamber.quota.vision"


@pytest.mark.parametrize("bad", ["", "   ", "../..", "*", "$SYS", "a\x00b", "-vision", "vision-", "vi sion", "x" * 64])
def test_names_that_are_no_team_are_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(InvalidName) as caught:
        normalize_team(bad)
    assert caught.value.field == "team"


def test_an_event_built_in_code_is_checked_with_its_consumers_decoder() -> None:
    ok = JobSubmitted(job_id="j1", at=1.0, spec=JobSpec(team="vision", gpus_per_replica=8))
    check_event(ok)
    for bad, field in [
        (JobSubmitted(job_id="j" * 300, at=1.0, spec=JobSpec(team="vision", gpus_per_replica=8)), "job_id"),
        (JobSubmitted(job_id="j1", at=1.0, spec=JobSpec(team="Vision", gpus_per_replica=8)), "spec.team"),
        (
            JobSubmitted(job_id="j1", at=1.0, spec=JobSpec(team="vision", gpus_per_replica=2**70)),
            "spec.gpus_per_replica",
        ),
        (TeamQuotaSet(team="vision", pool="default", at=1.0, guaranteed_gpus=-1), "guaranteed_gpus"),
    ]:
        with pytest.raises(InvalidName) as caught:
            check_event(bad)
        assert caught.value.field == field, bad


def test_requests_refuse_unknown_fields_and_normalise_the_team() -> None:
    assert decode_request(b'{"team": " NLP ", "gpus": 2}', SubmitJob).team == "nlp"
    with pytest.raises(InvalidName) as caught:
        decode_request({"team": "nlp", "gpus": 2, "borrow": 1}, SetTeamQuota)
    assert caught.value.field == "borrow"
    with pytest.raises(InvalidName) as caught:
        decode_request(b'{"team": "nlp", "gpus": 1180591620717411303424}', SubmitJob)
    assert caught.value.field == "gpus"
