"""The API's own description: ``GET /openapi.json`` (OpenAPI 3.1, generated from the route
tables and the pydantic models) and ``GET /docs`` (Swagger UI over it).

Both hold no data and are served to anyone, auth on or off, like the definitions API
Gateway exports. Swagger UI's files are the copy Powertools ships (its own OpenAPI UI),
served from the package: browsers that use this service may reach no CDN, and the Lambda zip
carries one copy of them (a Swagger UI wheel of its own added 3 MB).
"""

from __future__ import annotations

import functools
import json
from importlib import resources

from chalice import Blueprint, NotFoundError, Response

from . import admin, console, debug, meta
from .openapi import PlainRoute, openapi_document

blueprint = Blueprint(__name__)

#: Served name → (content type, Powertools' file).
SWAGGER_ASSETS = {
    "swagger-ui-bundle.js": ("application/javascript", "swagger-ui-bundle.min.js"),
    "swagger-ui.css": ("text/css", "swagger-ui.min.css"),
}
SWAGGER_PACKAGE = "aws_lambda_powertools.event_handler.openapi.swagger_ui"
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
        tuple(dict.fromkeys(content_type for content_type, _ in SWAGGER_ASSETS.values())),
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
    return resources.files(SWAGGER_PACKAGE).joinpath(SWAGGER_ASSETS[name][1]).read_text(encoding="utf-8")


@blueprint.route("/openapi.json", methods=["GET"])
def openapi() -> Response:
    return Response(body=openapi_json(), status_code=200, headers={"Content-Type": "application/json"})


@blueprint.route("/docs", methods=["GET"])
def docs() -> Response:
    return Response(body=DOCS_PAGE, status_code=200, headers={"Content-Type": "text/html; charset=utf-8"})


@blueprint.route("/docs/{asset}", methods=["GET"])
def docs_asset(asset: str) -> Response:
    if asset not in SWAGGER_ASSETS:
        raise NotFoundError(asset)
    content_type = SWAGGER_ASSETS[asset][0]
    return Response(
        body=_swagger_asset(asset),
        status_code=200,
        headers={"Content-Type": f"{content_type}; charset=utf-8", "Cache-Control": "max-age=86400"},
    )
