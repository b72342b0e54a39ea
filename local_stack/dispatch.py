"""Lambda invocations inside moto, routed to the app's own handlers.

With ``lambda.use_docker`` off, moto's ``LambdaSimpleBackend.invoke`` echoes the payload.
``LambdaDispatch`` replaces it for as long as it is installed: the function name (or
ARN) selects a handler from an injectable map (the stack passes the app's
``@app.lambda_function`` handlers), which is called like Lambda would call it. A handler
that raises becomes an ``Unhandled`` function error with Lambda's error payload, so the
state machines' ``Retry`` / ``Catch`` on ``errorType`` behave as deployed.
"""

from __future__ import annotations

import json
import threading
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chalicelib.clock import Clock, SystemClock
from chalicelib.observability.logging import logger
from chalicelib.protocol.errors import ServiceNotReadyError

Handler = Callable[[Any, Any], Any]

#: Lambda's default timeout; what ``get_remaining_time_in_millis`` counts down from.
DEFAULT_TIMEOUT_MS = 60_000


def function_name_of(name_or_arn: str) -> str:
    """``arn:aws:lambda:r:a:function:name[:qualifier]`` or ``name`` → ``name``."""
    if name_or_arn.startswith("arn:"):
        parts = name_or_arn.split(":")
        return parts[6] if len(parts) > 6 else parts[-1]
    return name_or_arn.split(":")[0]


@dataclass
class LambdaContext:
    """The attributes of Lambda's context object that handlers and Powertools read."""

    function_name: str
    invoked_function_arn: str
    clock: Clock = field(default_factory=SystemClock, repr=False)
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_limit_in_mb: int = 128
    function_version: str = "$LATEST"
    log_group_name: str = ""
    log_stream_name: str = "local"
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    def __post_init__(self) -> None:
        self._deadline = self.clock.now() + self.timeout_ms / 1000
        self.log_group_name = self.log_group_name or f"/aws/lambda/{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - self.clock.now()) * 1000))


class LambdaDispatch:
    """Installs itself as moto's Lambda invoke while used as a context manager."""

    _lock = threading.Lock()

    def __init__(self, handlers: Mapping[str, Handler], clock: Clock | None = None) -> None:
        self.handlers = handlers
        self.clock = clock or SystemClock()
        self._original: Callable[..., Any] | None = None

    def invoke(self, function_name: str, body: Any, response_headers: dict[str, str]) -> bytes | None:
        """Run the named handler on the JSON ``body``; None (→ HTTP 404) for an unknown function."""
        name = function_name_of(function_name)
        handler = self.handlers.get(name)
        if handler is None:
            logger.warning("local lambda: no handler for %s", function_name)
            return None
        if isinstance(body, bytes):
            body = body.decode("utf-8")
        event = json.loads(body) if body else {}
        arn = function_name if function_name.startswith("arn:") else name
        try:
            result = handler(event, LambdaContext(name, arn, clock=self.clock))
        except Exception as exc:  # noqa: BLE001 - Lambda reports every failure as a function error
            if isinstance(exc, ServiceNotReadyError):  # a dependency is down: its name says it all
                logger.warning("local lambda %s failed: %s", name, exc)
            else:
                logger.exception("local lambda %s failed", name)
            response_headers["x-amz-function-error"] = "Unhandled"
            result = {
                "errorType": type(exc).__name__,
                "errorMessage": str(exc),
                "stackTrace": traceback.format_exception(exc),
            }
        return json.dumps(result).encode("utf-8")

    def __enter__(self) -> LambdaDispatch:
        from moto.awslambda_simple.models import LambdaSimpleBackend

        dispatch = self

        def invoke(
            backend: Any,
            function_name: str,
            qualifier: str | None,
            body: Any,
            headers: Any,
            response_headers: dict[str, str],
        ) -> bytes | None:
            return dispatch.invoke(function_name, body, response_headers)

        with self._lock:
            if self._original is not None:
                raise RuntimeError("LambdaDispatch is already installed")
            self._original = LambdaSimpleBackend.invoke
            setattr(LambdaSimpleBackend, "invoke", invoke)  # noqa: B010 - patching moto's method
        return self

    def __exit__(self, *exc_info: Any) -> None:
        from moto.awslambda_simple.models import LambdaSimpleBackend

        with self._lock:
            if self._original is not None:
                setattr(LambdaSimpleBackend, "invoke", self._original)  # noqa: B010 - restoring moto's method
                self._original = None
