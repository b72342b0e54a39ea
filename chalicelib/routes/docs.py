"""The API's own description: ``GET /openapi.json`` (OpenAPI 3.1, generated from the route
tables and the pydantic models) and ``GET /docs`` (Swagger UI over it).

Both hold no data and are served to anyone, auth on or off, like the definitions API
Gateway exports. Swagger UI's files come from the swagger-ui-bundle-v2 wheel: browsers
that use this service may reach no CDN.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from chalice import Blueprint, NotFoundError, Response

from . import admin, console, debug, meta
from .openapi import PlainRoute, openapi_document

blueprint = Blueprint(__name__)

SWAGGER_ASSETS = {"swagger-ui-bundle.js": "application/javascript", "swagger-ui.css": "text/css"}
DOCS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>KVCM API</title>
<link rel="stylesheet" href="docs/swagger-ui.css"></head>
<body><div id="swagger-ui"></div><script src="docs/swagger-ui-bundle.js"></script>
<script>window.ui = SwaggerUIBundle({url: "openapi.json", dom_id: "#swagger-ui", deepLinking: true});</script>
</body></html>
"""

#: Every GET route of the app, with what it answers (``routes.ops``, this module, ``routes.console``).
PLAIN_ROUTES = [
    PlainRoute("/metrics", "The service metrics in the Prometheus text format", ("text/plain",), admin=True),
    PlainRoute(
        "/api/healthy",
        '200 {"status":"OK"} when checkHealth is healthy, else 503 with its answer',
        ("application/json",),
        admin=True,
    ),
    PlainRoute("/openapi.json", "This document", ("application/json",)),
    PlainRoute("/docs", "Swagger UI over this document", ("text/html",)),
    PlainRoute(
        "/docs/{asset}",
        "Swagger UI's files",
        tuple(dict.fromkeys(SWAGGER_ASSETS.values())),
        assets=tuple(SWAGGER_ASSETS),
    ),
    *console.ROUTES,
]


@functools.cache
def openapi_json() -> str:
    """The document of every route of the API (built once per container)."""
    operations = meta.OPERATIONS + admin.OPERATIONS + debug.OPERATIONS
    return json.dumps(openapi_document(operations, PLAIN_ROUTES), separators=(",", ":"))


@functools.cache
def _swagger_asset(name: str) -> str:
    from swagger_ui_bundle import swagger_ui_path

    return (Path(swagger_ui_path) / name).read_text(encoding="utf-8")


@blueprint.route("/openapi.json", methods=["GET"])
def openapi() -> Response:
    return Response(body=openapi_json(), status_code=200, headers={"Content-Type": "application/json"})


@blueprint.route("/docs", methods=["GET"])
def docs() -> Response:
    return Response(body=DOCS_PAGE, status_code=200, headers={"Content-Type": "text/html; charset=utf-8"})


@blueprint.route("/docs/{asset}", methods=["GET"])
def docs_asset(asset: str) -> Response:
    content_type = SWAGGER_ASSETS.get(asset)
    if content_type is None:
        raise NotFoundError(asset)
    return Response(
        body=_swagger_asset(asset),
        status_code=200,
        headers={"Content-Type": f"{content_type}; charset=utf-8", "Cache-Control": "max-age=86400"},
    )
