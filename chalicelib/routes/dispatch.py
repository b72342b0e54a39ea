"""The one path every API call takes: limits → credentials → body → model → scope →
handler → model → JSON.

This is also the single place where exceptions become wire status codes (through
``protocol.errors.status_of``): Chalice would turn a stray exception into an HTTP 500
before any middleware saw it, so nothing escapes ``Dispatcher.handle``. And it is the one
place where, with auth on, every method's role and scope are checked (``auth.policy``)
and admin mutations and denied calls are audited.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, get_type_hints

from ..auth import Action, Authorizer, Principal, check_action, check_target, parse_bearer
from ..auth.targets import TargetOf
from ..clock import Clock
from ..control import ConfigCache
from ..control.api_keys import key_id_of
from ..control.audit import AuditEntry, AuditLog
from ..observability.events import EventRecorder
from ..observability.logging import access_log, logger, set_correlation_id
from ..observability.metrics import MetricsPublisher, MetricsRegistry
from ..protocol.codes import ErrorCode
from ..protocol.errors import MalformedBodyError, RequestTooLargeError, http_status_of, status_of
from ..protocol.models import Request, Response, ResponseHeader, Status
from ..protocol.validation import invalid, validate_key_fields
from ..protocol.wire import ParseLimits, render
from ..settings import Settings
from ..stores.faults import FaultRegistry

#: A service method, unbound: ``Handler(service, request) -> response``.
Handler = Callable[[Any, Any], Response]
S = TypeVar("S")
_DENIED = (401, 403, 429)


class CallContext(Protocol):
    """What the dispatcher uses around a handler (``runtime.Runtime`` provides it)."""

    settings: Settings
    clock: Clock

    @property
    def auth(self) -> Authorizer: ...

    @property
    def audit(self) -> AuditLog: ...

    @property
    def config(self) -> ConfigCache: ...

    @property
    def faults(self) -> FaultRegistry: ...

    @property
    def metrics(self) -> MetricsRegistry: ...

    @property
    def metrics_publisher(self) -> MetricsPublisher: ...

    @property
    def event_recorder(self) -> EventRecorder: ...

    def service(self, owner: type[S]) -> S: ...


@dataclass(frozen=True)
class Operation:
    """One API method."""

    api_name: str
    request_model: type[Request]
    #: A method of a service class; the class's container-wide instance serves the calls.
    handler: Handler
    service: str  # "meta", "admin" or "debug"
    #: What the method does (the roles allowed it) and what it acts on (the scope checked).
    action: Action
    target: TargetOf
    #: Whether calls go to the event log (the optimizer replays them).
    recorded: bool = False

    #: What the handler answers (its return annotation); errors render it too.
    response_model: type[Response] = field(init=False)
    #: The service class the handler is a method of.
    owner: type = field(init=False)

    def __post_init__(self) -> None:
        # Resolved at import, so a handler without a resolvable return annotation, or
        # that is not a method of a module-level class, fails the app's import.
        object.__setattr__(self, "response_model", get_type_hints(self.handler)["return"])
        class_name, _, _ = self.handler.__qualname__.rpartition(".")
        object.__setattr__(self, "owner", getattr(sys.modules[self.handler.__module__], class_name))


def _error_body(model: type[Response], code: ErrorCode, message: str, request_id: str) -> str:
    """The response with its defaults (API.md: defaults are printed) and the error's header."""
    # A message quoting the client's input must not fail the error response itself.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return render(model(header=ResponseHeader(status=Status(code=code, message=message), request_id=request_id)))


def _body_size(raw_body: Any) -> int:
    return len(raw_body) if isinstance(raw_body, (bytes, str)) else 0


def _target_label(request: Request | None) -> str:
    """The names a request acts on, for the audit log (names only, never a secret)."""
    if request is None:
        return ""
    parts = []
    for name in (
        "instance_id",
        "instance_group",
        "instance_group_name",
        "name",
        "storage_unique_name",
        "user_name",
        "key_id",
        "api_name",
        "operation_id",
    ):
        value = getattr(request, name, None)
        if isinstance(value, str):
            if value:
                parts.append(f"{name}={value[:128]}")
        elif value is not None and (label := getattr(value, "name", None)):
            parts.append(f"{name}={label[:128]}")  # a group or storage in the body
    storage = getattr(request, "storage", None)
    if storage is not None and storage.global_unique_name:
        parts.append(f"storage={storage.global_unique_name[:128]}")
    return " ".join(parts)


class Dispatcher:
    """Routes ``api_name`` to its operation and runs the call end to end."""

    def __init__(self, operations: list[Operation]) -> None:
        self.operations = {op.api_name: op for op in operations}

    def handle(
        self, context: CallContext, api_name: str, raw_body: Any, headers: Mapping[str, str], source: str = ""
    ) -> tuple[int, str]:
        """Run one call; returns (HTTP status, JSON text). Never raises. ``source`` is the
        caller's address (audit log)."""
        start = time.perf_counter()
        op = self.operations[api_name]
        settings = context.settings
        trace_id = ""
        principal: Principal | None = None
        request: Request | None = None
        response: Response | None = None
        set_correlation_id("")  # not the id of the request this thread served before
        try:
            if _body_size(raw_body) > settings.max_body_bytes:
                raise RequestTooLargeError(f"request body exceeds {settings.max_body_bytes} bytes")
            # Credentials and role before the body is even decoded: an unauthenticated
            # caller costs no JSON parsing.
            if settings.auth_enabled:
                principal = context.auth.authenticate(headers, source)
                check_action(principal, op.action, api_name)
            request = op.request_model.from_body(raw_body, ParseLimits(settings.max_keys_per_request))
            if len(request.effective_trace_id) > settings.max_trace_id_length:
                raise invalid("trace_id", f"is longer than {settings.max_trace_id_length} characters")
            trace_id = request.effective_trace_id
            set_correlation_id(trace_id)
            validate_key_fields(request)
            if principal is not None:
                check_target(principal, op.target(context.config, request), api_name)
                request.sent_by(principal.user_name)
            if op.service == "meta" and settings.debug_service:
                context.faults.check(api_name, trace_id)
            response = op.handler(context.service(op.owner), request)
            code = ErrorCode.OK
            request_id = f"{trace_id}_{int(context.clock.now() * 1e6)}"
            response.header.request_id = request_id
            status, body = 200, render(response)
            message = ""
        except Exception as exc:  # noqa: BLE001 - every failure becomes a wire status
            code, message = status_of(exc)
            if code == ErrorCode.INTERNAL_ERROR and not isinstance(exc, MalformedBodyError):
                logger.exception("unexpected error in %s", api_name)
            status = http_status_of(exc)
            request_id = f"{trace_id}_{int(context.clock.now() * 1e6)}"
            if isinstance(exc, MalformedBodyError):
                body = "{}"
            else:
                # API.md spells the body of an auth refusal (HTTP 401/403) as the header alone.
                model = op.response_model if status == 200 else Response
                body = _error_body(model, code, message, request_id)
        latency_us = int((time.perf_counter() - start) * 1e6)
        context.metrics.record_call(api_name, code.name, latency_us)
        context.metrics_publisher.publish(force=False)
        if op.recorded and request is not None:
            try:
                context.event_recorder.record(api_name, request, response, code)
            except Exception:  # noqa: BLE001 - the event log never fails a call
                logger.exception("event log of %s failed", api_name)
        caller = principal.label if principal is not None else ""
        if settings.auth_enabled and (op.action.audited or status in _DENIED):
            self._audit(
                context,
                AuditEntry(
                    principal=caller or _claimed(headers),
                    source=source,
                    api_name=api_name,
                    target=_target_label(request),
                    code=code.name,
                    message=message,
                    denied=status in _DENIED,
                ),
            )
        access_log(api_name, trace_id, code.name, latency_us, principal=caller)
        return status, body

    @staticmethod
    def _audit(context: CallContext, entry: AuditEntry) -> None:
        try:
            context.audit.record(entry)
        except Exception:  # noqa: BLE001 - the call's outcome stands; the loss is logged
            logger.exception("audit record of %s not written", entry.api_name)


def _claimed(headers: Mapping[str, str]) -> str:
    """Who an unauthenticated caller claimed to be: the user of a password bearer or the
    key id of an API key (the secret part never), else "anonymous"."""
    try:
        token = parse_bearer(headers)
    except Exception:  # noqa: BLE001 - no usable header at all
        return "anonymous"
    user_name, colon, _ = token.partition(":")
    if colon:
        return f"unauthenticated:{user_name[:128]}"
    key_id = key_id_of(token)
    return f"unauthenticated:key/{key_id}" if key_id else "anonymous"
