"""Operations endpoints beside the API: ``GET /metrics`` in the Prometheus text format and
``GET /api/healthy`` (upstream's load-balancer probe, UPSTREAM_V2 §1.4).

It reports the service's metrics (every container's, as getMetrics does) and, with auth
on, takes the same ``Authorization: Bearer <user>:<password>`` of an admin account
(Prometheus sends it with ``authorization: {credentials: ...}``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from chalice import Blueprint, Response

from ..auth.policy import SERVICE, Action
from ..observability.logging import logger
from ..observability.prometheus import CONTENT_TYPE, exposition
from ..protocol.codes import ErrorCode
from ..protocol.errors import http_status_of, status_of
from ..protocol.models import ListRequest
from ..protocol.wire import render
from ..runtime import Runtime, get_runtime
from . import gateway

blueprint = Blueprint(__name__)


def _probe(
    runtime: Runtime, headers: Mapping[str, str], path: str, answer: Callable[[], tuple[int, str]]
) -> tuple[int, str]:
    """(HTTP status, body) of a GET probe answered by ``answer()``, with auth as an admin
    read. Never raises: failures are a failing status, never a 500 traceback."""
    try:
        if runtime.settings.auth_enabled:
            runtime.auth.authorize(headers, Action.SERVICE_READ, path, SERVICE)
        return answer()
    except Exception as exc:  # noqa: BLE001
        code, message = status_of(exc)
        status = http_status_of(exc)
        if status == 200:  # the JSON API reports these in the body; a probe needs a failing status
            status = 503
            if code == ErrorCode.INTERNAL_ERROR:
                logger.exception("%s failed", path)
        return status, f"{code.name}: {message}\n"


def metrics_text(runtime: Runtime, headers: Mapping[str, str]) -> tuple[int, str]:
    """(HTTP status, body) of a scrape. Never raises."""
    return _probe(
        runtime,
        headers,
        "/metrics",
        lambda: (200, exposition(runtime.service_admin.service_metrics(), prefix=runtime.settings.key_prefix)),
    )


def healthy(runtime: Runtime, headers: Mapping[str, str]) -> tuple[int, str]:
    """``200 {"status":"OK"}`` when checkHealth finds the service healthy, else 503 with
    checkHealth's whole answer (as upstream). Never raises."""

    def answer() -> tuple[int, str]:
        trace_id = f"kvcm-healthy-{int(runtime.clock.now() * 1000)}"
        health = runtime.service_admin.check_health(ListRequest(trace_id=trace_id))
        return (200, '{"status":"OK"}') if health.is_health else (503, render(health))

    return _probe(runtime, headers, HEALTHY_PATH, answer)


@blueprint.route("/metrics", methods=["GET"])
def metrics() -> Response:
    status, body = metrics_text(get_runtime(), blueprint.current_request.headers)
    return Response(body=body, status_code=status, headers={"Content-Type": CONTENT_TYPE})


HEALTHY_PATH = "/api/healthy"


# Behind the gateway's authorizer like every /api route: it answers with the same bearer.
@blueprint.route(HEALTHY_PATH, methods=["GET"], authorizer=gateway.api_key_authorizer if gateway.ENABLED else None)
def healthy_probe() -> Response:
    status, body = healthy(get_runtime(), blueprint.current_request.headers)
    content_type = "application/json" if status in (200, 503) and body.startswith("{") else "text/plain"
    return Response(body=body, status_code=status, headers={"Content-Type": content_type})
