"""The committed schemas/ are what the code generates, and real payloads validate against them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import msgspec
from hypothesis import given, settings

from events import ALL_EVENTS, Event
from events.schema_gen import generate
from tests.strategies import any_event

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_committed_schemas_match_the_code() -> None:
    generated = generate()
    committed = {str(p.relative_to(SCHEMAS)): p.read_text() for p in SCHEMAS.rglob("*.json")}
    stale = sorted(set(committed) - set(generated))
    missing = sorted(set(generated) - set(committed))
    differ = sorted(k for k in generated if k in committed and committed[k] != generated[k])
    assert not (stale or missing or differ), (
        f"schemas/ is out of date (run `make schemas`): stale={stale} missing={missing} differ={differ}"
    )


def test_there_is_one_schema_per_event_type_and_an_asyncapi_document() -> None:
    names = {p.stem for p in (SCHEMAS / "events").glob("*.json")}
    assert names == {cls.ce_type() for cls in ALL_EVENTS}
    doc = json.loads((SCHEMAS / "asyncapi.json").read_text())
    assert doc["asyncapi"].startswith("3.")
    for cls in ALL_EVENTS:
        assert cls.__name__ in doc["components"]["messages"]


_validators = {
    cls.ce_type(): jsonschema.Draft202012Validator(
        json.loads((SCHEMAS / "events" / f"{cls.ce_type()}.json").read_text())
    )
    for cls in ALL_EVENTS
}


@settings(max_examples=300, deadline=None)
@given(any_event(ALL_EVENTS))
def test_json_payloads_validate_against_the_committed_schema(event: Event) -> None:
    payload = json.loads(msgspec.json.encode(event))
    _validators[type(event).ce_type()].validate(payload)


def test_the_schema_rejects_a_wrong_typed_payload() -> None:
    validator = _validators["io.chamber.jobs.submitted.v1"]
    bad = {
        "type": "io.chamber.jobs.submitted.v1",
        "job_id": 5,
        "at": 1.0,
        "spec": {"team": "t", "gpus_per_replica": 1},
    }
    assert list(validator.iter_errors(bad))
