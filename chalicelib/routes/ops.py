"""Operations endpoints beside the API: ``GET /metrics`` in the Prometheus text format.

It reports the service's metrics (every container's, as getMetrics does) and, with auth
on, takes the same ``Authorization: Bearer <user>:<password>`` of an admin account
(Prometheus sends it with ``authorization: {credentials: ...}``).
"""
from __future__ import annotations

from chalice import Blueprint, Response

from ..auth.policy import SERVICE, Action
from ..control import admin
from ..observability.logging import logger
from ..observability.prometheus import CONTENT_TYPE, exposition
from ..protocol.codes import ErrorCode
from ..protocol.errors import http_status_of, status_of
from ..runtime import Runtime, get_runtime

blueprint = Blueprint(__name__)


def metrics_text(runtime: Runtime, headers) -> tuple[int, str]:
    """(HTTP status, body) of a scrape. Never raises."""
    try:
        if runtime.settings.auth_enabled:
            runtime.auth.authorize(headers, Action.SERVICE_READ, "/metrics", SERVICE)
        return 200, exposition(admin.service_metrics(runtime), prefix=runtime.settings.key_prefix)
    except Exception as exc:  # noqa: BLE001 - a scrape gets a status, never a 500 traceback
        code, message = status_of(exc)
        status = http_status_of(exc)
        if status == 200:  # the JSON API reports these in the body; a scrape needs a failing status
            status = 503
            if code == ErrorCode.INTERNAL_ERROR:
                logger.exception("metrics scrape failed")
        return status, f"{code.name}: {message}\n"


@blueprint.route("/metrics", methods=["GET"])
def metrics() -> Response:
    status, body = metrics_text(get_runtime(), blueprint.current_request.headers)
    return Response(body=body, status_code=status, headers={"Content-Type": CONTENT_TYPE})
