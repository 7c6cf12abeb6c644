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
    body: bool = False  # takes a JSON object body
    errors: tuple[int, ...] = field(default=())


def build(operations: list[Operation], *, title: str, version: str) -> dict[str, Any]:
    types = [op.response for op in operations if op.response is not None] + [Problem]
    schemas_list, components = msgspec.json.schema_components(types, ref_template=REF)
    problem = schemas_list[-1]
    answers = iter(schemas_list)
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        schema = next(answers) if op.response is not None else None
        entry: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
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
            entry["description"] = (
                f"Forwarded to `{op.command}` over NATS request/reply; the owning service validates the payload."
            )
            responses["401"] = {"description": "missing or wrong bearer token; nothing changed"}
            responses["422"] = {"description": "refused by the owning service (`field` names the part to fix)"}
            responses["503"] = {"description": "the owning service is not answering"}
        if op.body:
            entry["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        for code in (*op.errors, *((400,) if op.body or op.params else ())):
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
