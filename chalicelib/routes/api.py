"""Builds a Chalice blueprint that serves a list of operations as ``POST /api/<name>``."""

from __future__ import annotations

from collections.abc import Callable

from chalice import Blueprint, Response

from ..runtime import get_runtime
from . import gateway
from .dispatch import Dispatcher, Operation

JSON_HEADERS: dict[str, str | list[str]] = {"Content-Type": "application/json"}


def api_blueprint(import_name: str, operations: list[Operation]) -> Blueprint:
    """One route per operation; any content type is accepted and parsed as JSON. Deployed
    with ``KVCM_GATEWAY_AUTHORIZER``, every route sits behind the gateway's authorizer."""
    blueprint = Blueprint(import_name)
    dispatcher = Dispatcher(operations)

    def make_view(api_name: str) -> Callable[[], Response]:
        def view() -> Response:
            request = blueprint.current_request
            source = (request.context or {}).get("identity", {}).get("sourceIp", "")
            status, body = dispatcher.handle(get_runtime(), api_name, request.raw_body, request.headers, source)
            return Response(body=body, status_code=status, headers=JSON_HEADERS)

        view.__name__ = api_name
        return view

    for api_name in dispatcher.operations:
        blueprint.route(
            f"/api/{api_name}",
            methods=["POST"],
            content_types=["*/*"],
            authorizer=gateway.api_key_authorizer if gateway.ENABLED else None,
        )(make_view(api_name))
    return blueprint
