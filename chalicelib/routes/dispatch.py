"""The one path every API call takes: body → model → handler → model → JSON.

This is also the single place where exceptions become wire status codes (through
``protocol.errors.status_of``): Chalice would turn a stray exception into an HTTP 500
before any middleware saw it, so nothing escapes ``Dispatcher.handle``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, get_type_hints

from ..observability.logging import access_log, logger
from ..protocol.codes import ErrorCode
from ..protocol.errors import MalformedBodyError, http_status_of, status_of
from ..protocol.models import Request, Response, ResponseHeader, Status
from ..protocol.wire import decode_body, parse_model, render
from ..runtime import Runtime

Handler = Callable[[Runtime, Any], Response]


@dataclass(frozen=True)
class Operation:
    """One API method."""

    api_name: str
    request_model: type[Request]
    handler: Handler
    service: str  # "meta", "admin" or "debug"
    #: Hook called after every call of a meta method (event log, debug faults...).
    observer: Optional[Callable[[Runtime, "Operation", Request, Optional[Response], ErrorCode], None]] = None

    #: What the handler answers (its return annotation); errors render it too.
    response_model: type[Response] = field(init=False)

    def __post_init__(self) -> None:
        # Resolved at import, so a handler without a resolvable return annotation fails
        # the app's import, not its first error response.
        object.__setattr__(self, "response_model", get_type_hints(self.handler)["return"])


def _error_body(model: type[Response], code: ErrorCode, message: str, request_id: str) -> str:
    """The response with its defaults (API.md: defaults are printed) and the error's header."""
    # A message quoting the client's input must not fail the error response itself.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return render(model(header=ResponseHeader(status=Status(code=code, message=message), request_id=request_id)))


class Dispatcher:
    """Routes ``api_name`` to its operation and runs the call end to end."""

    def __init__(self, operations: list[Operation]) -> None:
        self.operations = {op.api_name: op for op in operations}

    def handle(self, runtime: Runtime, api_name: str, raw_body: Any,
               headers: Mapping[str, str]) -> tuple[int, str]:
        """Run one call; returns (HTTP status, JSON text). Never raises."""
        start = time.perf_counter()
        op = self.operations[api_name]
        trace_id = ""
        request: Optional[Request] = None
        response: Optional[Response] = None
        try:
            data = decode_body(raw_body)
            request = parse_model(op.request_model, data)
            trace_id = request.effective_trace_id
            logger.set_correlation_id(trace_id or None)
            if runtime.settings.auth_enabled:
                runtime.auth.authorize(headers, op.service)
            if op.service == "meta" and runtime.settings.debug_service:
                runtime.faults.check(api_name, trace_id)
            response = op.handler(runtime, request)
            code = ErrorCode.OK
            request_id = f"{trace_id}_{int(runtime.clock.now() * 1e6)}"
            response.header.request_id = request_id
            status, body = 200, render(response)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a wire status
            code, message = status_of(exc)
            if code == ErrorCode.INTERNAL_ERROR and not isinstance(exc, MalformedBodyError):
                logger.exception("unexpected error in %s", api_name)
            status = http_status_of(exc)
            request_id = f"{trace_id}_{int(runtime.clock.now() * 1e6)}"
            if isinstance(exc, MalformedBodyError):
                body = "{}"
            else:
                # API.md spells the body of an auth refusal (HTTP 401/403) as the header alone.
                model = op.response_model if status == 200 else Response
                body = _error_body(model, code, message, request_id)
        latency_us = int((time.perf_counter() - start) * 1e6)
        runtime.metrics.record_call(api_name, code.name, latency_us)
        runtime.metrics_publisher.publish(force=False)
        if op.observer is not None and request is not None:
            try:
                op.observer(runtime, op, request, response, code)
            except Exception:  # noqa: BLE001 - observers never fail a call
                logger.exception("observer of %s failed", api_name)
        access_log(api_name, trace_id, code.name, latency_us)
        return status, body
