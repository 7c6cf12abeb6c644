"""The OpenAPI 3.1 document, built from the route table and the response Structs (so it cannot drift)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.gateway.views import Problem

REF = "#/components/schemas/{name}"


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # path | query
    schema: dict[str, Any]
    description: str = ""
    required: bool = False


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    operation_id: str
    summary: str
    response: Any = None  # a Struct type (or list[...]) for JSON answers; None for non-JSON ones
    content_type: str = "application/json"
    params: tuple[Param, ...] = ()
    command: str | None = None  # "service.verb" the request is forwarded to; needs the bearer token
    body: bool = False  # a JSON object body is required
    errors: tuple[int, ...] = field(default=())
    request: Any = None  # the Struct type of the JSON body (events/commands.py), also when optional
    description: str = ""


def build(operations: list[Operation], *, title: str, version: str, protect_reads: bool = False) -> dict[str, Any]:
    """`protect_reads`: the reads under /api/ and /metrics need the bearer token too."""
    responses_types = [op.response for op in operations if op.response is not None]
    request_types = [op.request for op in operations if op.request is not None]
    schemas_list, components = msgspec.json.schema_components(
        [*responses_types, *request_types, Problem], ref_template=REF
    )
    for t in request_types:  # msgspec's schema does not say that unknown fields are refused
        if t.__struct_config__.forbid_unknown_fields:
            components[t.__name__]["additionalProperties"] = False
    problem = schemas_list[-1]
    answers = iter(schemas_list[: len(responses_types)])
    bodies = iter(schemas_list[len(responses_types) : -1])
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        schema = next(answers) if op.response is not None else None
        entry: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
        if op.description:
            entry["description"] = op.description
        if op.params:
            entry["parameters"] = [
                {
                    "name": p.name,
                    "in": p.where,
                    "required": p.required or p.where == "path",
                    "schema": p.schema,
                    **({"description": p.description} if p.description else {}),
                }
                for p in op.params
            ]
        ok: dict[str, Any] = {"description": "OK"}
        if schema is not None:
            ok["content"] = {op.content_type: {"schema": schema}}
        elif op.content_type != "application/json":
            ok["content"] = {op.content_type: {"schema": {"type": "string"}}}
        responses: dict[str, Any] = {"200": ok}
        if op.command is not None:
            entry["security"] = [{"bearer": []}]
            forwarded = (
                f"Forwarded to `{op.command}` over NATS request/reply. The body is checked first against the "
                "same type the owning service decodes (unknown fields are refused)."
            )
            entry["description"] = f"{op.description}\n\n{forwarded}" if op.description else forwarded
            responses["401"] = {
                "description": "missing or wrong bearer token; nothing changed",
                "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
            }
            responses["404"] = {"description": "the job (or other entity) named is not known; nothing changed"}
            responses["409"] = {
                "description": "what the command changes changed since it was read (another change won); "
                "re-read and retry; nothing changed"
            }
            responses["422"] = {"description": "refused (`field` names the part to fix); nothing changed"}
            responses["503"] = {
                "description": "the owning service is not answering, or is still catching up with its log "
                "(then with `Retry-After`)"
            }
        elif protect_reads and (op.path.startswith("/api/") or op.path == "/metrics"):
            entry["security"] = [{"bearer": []}]
            responses["401"] = {
                "description": "missing or wrong bearer token",
                "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
            }
        if op.path.startswith("/api/"):
            catching_up = "the gateway is still folding the log at start (`catching up`); retry after `Retry-After` s"
            owner = responses.get("503", {}).get("description")
            responses["503"] = {
                "description": f"{owner}, or {catching_up}" if owner else catching_up,
                "headers": {"Retry-After": {"schema": {"type": "integer"}}},
            }
        if op.request is not None:
            # A field the path already gives (`team` in /api/teams/{team}/quota) may be left out of the
            # body: the gateway fills it in from the path, so the body schema does not require it.
            in_path = {p.name for p in op.params if p.where == "path"}
            component = components.get(op.request.__name__, {})
            if in_path & set(component.get("required", ())):
                component["required"] = [r for r in component["required"] if r not in in_path]
            entry["requestBody"] = {
                "required": op.body,
                "content": {"application/json": {"schema": next(bodies)}},
            }
        elif op.body:
            entry["requestBody"] = {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
        for code in (*op.errors, *((400,) if op.body or op.params or op.request is not None else ())):
            responses.setdefault(str(code), {"description": "bad request"})
        for code, resp in responses.items():
            if code != "200" and "content" not in resp:
                resp["content"] = {"application/json": {"schema": problem}}
        entry["responses"] = responses
        paths.setdefault(_openapi_path(op.path), {})[op.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _openapi_path(path: str) -> str:
    return path  # aiohttp's {name} placeholders are already OpenAPI's
