"""Generate the published contract: one JSON Schema per event type and one AsyncAPI 3.0 document.

External tools (any language) validate payloads against these; a test fails when the committed
files drift from what this code generates. Run `make schemas` after changing an event type.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from events.catalog import ALL_EVENTS
from events.channels import CHANNELS, COMMANDS, DEAD_LETTER, KV_BUCKETS, Channel
from events.codec import CONTENT_TYPE
from events.commands import REQUESTS

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def event_schema(cls: type[msgspec.Struct]) -> dict[str, Any]:
    """A self-contained JSON Schema for one event type (its nested types under $defs)."""
    _, defs = msgspec.json.schema_components([cls], ref_template="#/$defs/{name}")
    root = defs.pop(cls.__name__)
    doc: dict[str, Any] = {"$schema": JSON_SCHEMA_DIALECT, "$id": f"urn:chamber:schema:{cls.ce_type()}"}  # type: ignore[attr-defined]
    doc.update(root)
    if defs:
        doc["$defs"] = defs
    return doc


def _ce_headers_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "CloudEvents 1.0 attributes in binary content mode; ce-id is also Nats-Msg-Id. As the "
        "CloudEvents NATS binding asks, ce- values holding a space, '\"', '%' or anything outside printable ASCII "
        "are percent-encoded (UTF-8), and header names are case-insensitive.",
        "required": ["ce-specversion", "ce-id", "ce-source", "ce-type", "ce-time", "content-type"],
        "properties": {
            "ce-specversion": {"type": "string", "const": "1.0"},
            "ce-id": {"type": "string"},
            "ce-source": {"type": "string"},
            "ce-type": {"type": "string", "pattern": r"^io\.chamber\.[a-z]+\.[a-z_]+\.v[1-9][0-9]*$"},
            "ce-time": {"type": "string", "format": "date-time"},
            "content-type": {"type": "string", "const": CONTENT_TYPE},
            "traceparent": {"type": "string", "description": "W3C trace context"},
            "Nats-Msg-Id": {"type": "string"},
        },
    }


def _channel_doc(ch: Channel) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "address": ch.address,
        "description": ch.description,
        "parameters": {name: {"description": desc} for name, desc in ch.parameters},
        "messages": {cls.__name__: {"$ref": f"#/components/messages/{cls.__name__}"} for cls in ch.events},
        "x-chamber-stream": ch.stream.name,
        "x-nats-subject": ch.pattern(),
    }
    if not ch.events:
        doc["messages"] = {"DeadLetter": {"$ref": "#/components/messages/DeadLetter"}}
    return doc


def asyncapi_document() -> dict[str, Any]:
    _, schemas = msgspec.json.schema_components(ALL_EVENTS, ref_template="#/components/schemas/{name}")
    messages: dict[str, Any] = {
        cls.__name__: {
            "name": cls.ce_type(),
            "title": cls.__name__,
            "summary": (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else cls.__name__,
            "contentType": CONTENT_TYPE,
            "headers": {"$ref": "#/components/schemas/CloudEventsHeaders"},
            "payload": {"$ref": f"#/components/schemas/{cls.__name__}"},
        }
        for cls in ALL_EVENTS
    }
    messages["DeadLetter"] = {
        "name": "dead-letter",
        "title": "DeadLetter",
        "summary": "The original bytes and headers of a message that could not be handled.",
        "headers": {
            "type": "object",
            "required": ["chamber-dead-reason"],
            "properties": {
                "chamber-dead-reason": {"type": "string"},
                "chamber-dead-detail": {"type": "string"},
                "chamber-dead-subject": {"type": "string"},
                "chamber-dead-stream-seq": {"type": "string"},
            },
        },
        "payload": {},
    }
    schemas["CloudEventsHeaders"] = _ce_headers_schema()
    channels = {ch.id: _channel_doc(ch) for ch in (*CHANNELS, DEAD_LETTER)}
    # Operations say what Chamber does: it sends every event (external tools subscribe to receive
    # them), receives commands and replies to them, and writes its KV buckets.
    operations: dict[str, Any] = {
        f"send_{ch.id}": {
            "action": "send",
            "channel": {"$ref": f"#/channels/{ch.id}"},
            "summary": f"Chamber publishes on {ch.pattern()} (stream {ch.stream.name}); subscribe to receive.",
        }
        for ch in (*CHANNELS, DEAD_LETTER)
    }
    _add_commands(channels, operations, messages, schemas)
    _add_kv_buckets(channels, operations, messages)
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Chamber events",
            "version": "1",  # the contract's version; bump with a breaking event change
            "description": "Every event Chamber publishes on NATS JetStream. Bodies are JSON; "
            "CloudEvents attributes travel in NATS headers.",
        },
        "defaultContentType": CONTENT_TYPE,
        "servers": {
            "local": {"host": "127.0.0.1:4222", "protocol": "nats", "description": "chamber up"},
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }


def _add_commands(
    channels: dict[str, Any], operations: dict[str, Any], messages: dict[str, Any], schemas: dict[str, Any]
) -> None:
    typed = [t for verbs in REQUESTS.values() for t in verbs.values()]
    _, request_schemas = msgspec.json.schema_components(typed, ref_template="#/components/schemas/{name}")
    for t in typed:
        if t.__struct_config__.forbid_unknown_fields:
            request_schemas[t.__name__]["additionalProperties"] = False
    schemas.update(request_schemas)
    schemas["CommandReply"] = {
        "type": "object",
        "required": ["ok"],
        "properties": {
            "ok": {"type": "boolean"},
            "result": {"description": "the answer, when ok"},
            "error": {"type": "string", "description": "why it was refused, when not ok"},
            "field": {"type": "string", "description": "the request field to fix, when one is to blame"},
        },
    }
    messages["CommandReply"] = {
        "name": "command-reply",
        "title": "CommandReply",
        "summary": "Every command's answer: ok and a result, or an error naming the field to fix.",
        "contentType": CONTENT_TYPE,
        "payload": {"$ref": "#/components/schemas/CommandReply"},
    }
    channels["commandReply"] = {
        "address": None,  # the requester's inbox, chosen per request (NATS request/reply)
        "description": "The reply to a command, on the requester's inbox.",
        "messages": {"CommandReply": {"$ref": "#/components/messages/CommandReply"}},
    }
    for cmd in COMMANDS:
        request = REQUESTS.get(cmd.service, {}).get(cmd.verb)
        name = f"{cmd.id[3:]}Request"
        messages[name] = {
            "name": cmd.address,
            "title": name,
            "summary": cmd.description,
            "contentType": CONTENT_TYPE,
            "headers": {
                "type": "object",
                "properties": {"traceparent": {"type": "string", "description": "W3C trace context"}},
            },
            "payload": {"$ref": f"#/components/schemas/{request.__name__}"} if request else {"type": "object"},
        }
        channels[cmd.id] = {
            "address": cmd.address,
            "description": f"{cmd.description} Core NATS request/reply, no stream.",
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
            "x-nats-queue-group": f"chamber-{cmd.service}",
        }
        operations[f"receive_{cmd.id}"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{cmd.id}"},
            "summary": f"The {cmd.service} service answers {cmd.address}.",
            "reply": {"channel": {"$ref": "#/channels/commandReply"}},
        }


def _add_kv_buckets(channels: dict[str, Any], operations: dict[str, Any], messages: dict[str, Any]) -> None:
    messages["KvEntry"] = {
        "name": "kv-entry",
        "title": "KvEntry",
        "summary": "A JetStream KV entry (JSON); a delete or purge is an empty body with a KV-Operation header.",
        "payload": {},
    }
    for kv in KV_BUCKETS:
        params = sorted({p.split("}")[0] for p in kv.address.split("{")[1:]})
        channels[kv.id] = {
            "address": kv.address,
            "description": f"KV bucket `{kv.bucket}`, key `{kv.key}`: {kv.description}",
            "parameters": {p: {"description": f"{p} token"} for p in params},
            "messages": {"KvEntry": {"$ref": "#/components/messages/KvEntry"}},
            "x-nats-kv-bucket": kv.bucket,
        }
        operations[f"send_{kv.id}"] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{kv.id}"},
            "summary": f"Written by {kv.writer}; read with any NATS KV client (watch the bucket).",
        }


def generate() -> dict[str, str]:
    """Relative path -> file content, for everything under schemas/ that this module owns."""
    files = {f"events/{cls.ce_type()}.json": _dumps(event_schema(cls)) for cls in ALL_EVENTS}
    files["asyncapi.json"] = _dumps(asyncapi_document())
    return files


def write(out: Path) -> list[Path]:
    written = []
    (out / "events").mkdir(parents=True, exist_ok=True)
    for stale in (out / "events").glob("*.json"):
        stale.unlink()
    for rel, content in generate().items():
        path = out / rel
        path.write_text(content)
        written.append(path)
    return written
