"""The OpenAPI 3.1 document of the API, generated from the route tables and the pydantic models.

Every ``Operation`` of the meta, admin and debug tables becomes ``POST /api/<method>``: its
request model (validation schema: what the service accepts) is the body, its handler's
return annotation (serialization schema: what the service prints) the 200 answer. The GET
endpoints beside the API (``/metrics``, ``/openapi.json``, ``/docs``, ``/console``) are
described by ``PlainRoute`` entries kept next to their views in ``ops``. Nothing here is
written by hand twice: a field added to a model shows up in the document.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from ..protocol.models import Response
from .dispatch import Operation
from .summaries import SUMMARIES

COMPONENTS = "#/components/schemas/{model}"
SERVICES = {
    "meta": "MetaService: what inference engines call (instances, cache locations, two-phase writes)",
    "admin": "AdminService: storages, instance groups, accounts, metrics, health (admin role with auth on)",
    "debug": "DebugService: fault injection (served when the stage turns the debug service on)",
    "ops": "Operations endpoints beside the API: metrics scrape, this document, the console",
}


@dataclass(frozen=True)
class PlainRoute:
    """A GET endpoint that is not a protocol method (its body is not a wire model)."""

    path: str
    summary: str
    content_types: tuple[str, ...]
    admin: bool = False  # takes an admin account's bearer when auth is on
    #: The names a ``{asset}`` path parameter may take.
    assets: tuple[str, ...] = ()


#: reStructuredText roles (``:class:`X```) and literals (````x````), as docstrings write them.
_RST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_RST_LITERAL = re.compile(r"``([^`]+)``")


def markdown(docstring: str) -> str:
    """A docstring as Markdown: literals and roles as code spans, each paragraph's wrapped
    lines joined (Swagger UI renders Markdown; RST would show as typed)."""
    text = _RST_LITERAL.sub(r"`\1`", _RST_ROLE.sub(r"`\1`", inspect.cleandoc(docstring)))
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n") if p.strip())


def _protocol_operation(
    op: Operation, request_ref: dict[str, Any], response_ref: dict[str, Any], error_ref: dict[str, Any]
) -> dict[str, Any]:
    summary = SUMMARIES.get(op.api_name)
    if summary is None:
        raise LookupError(f"API method {op.api_name} has no summary in chalicelib/routes/summaries.py")
    operation: dict[str, Any] = {
        "operationId": op.api_name,
        "tags": [op.service],
        "summary": summary,
        "requestBody": {"required": False, "content": {"application/json": {"schema": request_ref}}},
        "responses": {
            "200": {
                "description": "The result; failures too, with `header.status.code` set and the "
                "other fields at their defaults",
                "content": {"application/json": {"schema": response_ref}},
            },
            "400": {
                "description": "The body is not a JSON object",
                "content": {"application/json": {"schema": {"type": "object", "maxProperties": 0}}},
            },
            "401": {
                "description": "Auth on: no or unknown bearer",
                "content": {"application/json": {"schema": error_ref}},
            },
            "403": {
                "description": "Auth on: the account's role may not call this service",
                "content": {"application/json": {"schema": error_ref}},
            },
        },
        # Anonymous with auth off, an account's bearer with it on.
        "security": [{}, {"bearer": []}],
    }
    if op.handler.__doc__:
        operation["description"] = markdown(op.handler.__doc__)
    return operation


def _plain_operation(route: PlainRoute) -> dict[str, Any]:
    body = {"type": "object"} if route.content_types == ("application/json",) else {"type": "string"}
    responses: dict[str, Any] = {
        "200": {"description": route.summary, "content": {t: {"schema": body} for t in route.content_types}}
    }
    operation: dict[str, Any] = {
        "operationId": "get" + route.path.replace("{asset}", "asset"),
        "tags": ["ops"],
        "summary": route.summary,
        "responses": responses,
    }
    if route.assets:
        operation["parameters"] = [
            {"name": "asset", "in": "path", "required": True, "schema": {"type": "string", "enum": list(route.assets)}}
        ]
        responses["404"] = {
            "description": "No such file",
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    if route.admin:
        text = {"text/plain": {"schema": {"type": "string"}}}
        responses["401"] = {"description": "Auth on: no or unknown bearer", "content": text}
        responses["403"] = {"description": "Auth on: not an admin account", "content": text}
        # /api/healthy answers an unhealthy service with checkHealth's JSON.
        responses["503"] = {
            "description": "The index or the control plane does not answer",
            "content": {**text, **{t: {"schema": body} for t in route.content_types}},
        }
        operation["security"] = [{}, {"bearer": []}]
    return operation


def openapi_document(
    operations: Iterable[Operation], plain_routes: Iterable[PlainRoute], version: str = "1"
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations`` (POST) and ``plain_routes`` (GET)."""
    operations = list(operations)
    keys: list[tuple[type[BaseModel], JsonSchemaMode]] = [(op.request_model, "validation") for op in operations]
    keys += [(op.response_model, "serialization") for op in operations]
    keys.append((Response, "serialization"))
    refs, definitions = models_json_schema(keys, by_alias=False, ref_template=COMPONENTS)
    paths: dict[str, Any] = {}
    error_ref = refs[(Response, "serialization")]
    for op in operations:
        paths[f"/api/{op.api_name}"] = {
            "post": _protocol_operation(
                op, refs[(op.request_model, "validation")], refs[(op.response_model, "serialization")], error_ref
            )
        }
    for route in plain_routes:
        paths[route.path] = {"get": _plain_operation(route)}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "KVCM",
            "version": version,
            "description": "KV-cache metadata manager speaking Tair KVCache Manager's HTTP/JSON protocol. "
            "Requests are proto3 JSON (snake_case or lowerCamelCase names, enums by name or "
            "number, int64 as a number or a decimal string, unknown fields ignored); responses "
            "print snake_case names, defaults, enum names and int64 values as strings.",
        },
        "tags": [{"name": name, "description": text} for name, text in SERVICES.items()],
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "`<user_name>:<password>` of an account (auth on)",
                }
            },
        },
    }
