"""The AsyncAPI document covers what is on the wire (issue 16, finding 15): every command subject the
code serves, the KV buckets, and operations that say what Chamber does (it sends events)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from events.channels import CHANNELS, COMMANDS, KV_BUCKETS

ROOT = Path(__file__).resolve().parents[2]
DOC = json.loads((ROOT / "schemas" / "asyncapi.json").read_text())


def served_commands() -> set[tuple[str, str]]:
    """(service, verb) of every command registered in the code, found in the service modules."""
    found = set()
    for path in [*ROOT.glob("services/*/service.py"), ROOT / "node_agent" / "agent.py"]:
        text = path.read_text()
        name = re.search(r'^(?:NAME|SIM_SERVICE) = "([a-z_]+)"', text, re.M)
        if name is None:
            continue
        for verb in re.findall(r'(?:ctx\.command|\.register|Command)\(\s*"([a-z_]+)"', text):
            found.add((name.group(1), verb))
    return found


def test_every_command_the_code_serves_is_in_the_document_with_a_reply() -> None:
    served = served_commands()
    assert ("scheduler", "submit") in served and ("sim", "inject") in served  # the scan finds them
    documented = {(c.service, c.verb) for c in COMMANDS}
    assert served <= documented, f"undocumented commands: {sorted(served - documented)}"
    for cmd in COMMANDS:
        channel = DOC["channels"][cmd.id]
        assert channel["address"] == f"chamber.cmd.{cmd.service}.{cmd.verb}"
        op = DOC["operations"][f"receive_{cmd.id}"]
        assert op["action"] == "receive" and op["reply"]["channel"] == {"$ref": "#/channels/commandReply"}
    submit = DOC["components"]["messages"]["SchedulerSubmitRequest"]["payload"]
    assert submit == {"$ref": "#/components/schemas/SubmitJob"}
    assert DOC["components"]["schemas"]["SubmitJob"]["additionalProperties"] is False


def test_events_are_sent_by_chamber_and_kv_buckets_are_listed() -> None:
    for ch in CHANNELS:
        assert DOC["operations"][f"send_{ch.id}"]["action"] == "send"
    assert not any(k.startswith("receive_") and not k.startswith("receive_cmd") for k in DOC["operations"])
    buckets = {c.get("x-nats-kv-bucket") for c in DOC["channels"].values()}
    assert {"chamber_fleet", "chamber_quota", "chamber_snapshots_{service}"} <= buckets
    assert {kv.bucket for kv in KV_BUCKETS} <= buckets
