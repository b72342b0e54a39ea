"""``/api/<method>`` for a method this service does not have: HTTP 404 with an empty body,
as upstream's HTTP server answers a path it has no handler for. Without this route API
Gateway (and Chalice's local gateway) would answer 403 "Missing Authentication Token",
which sends people looking for an auth problem.

API Gateway and Chalice match a literal path (``/api/getCacheLocation``) before a path
parameter, so this only sees names no blueprint serves.
"""

from __future__ import annotations

from chalice import Blueprint, Response

from ..observability.logging import access_log

blueprint = Blueprint(__name__)
PATH = "/api/{api_name}"


@blueprint.route(PATH, methods=["POST", "GET"], content_types=["*/*"])
def unknown_method(api_name: str) -> Response:
    access_log(api_name, "", "NOT_FOUND", 0)
    return Response(body="", status_code=404, headers={"Content-Type": "text/plain"})
