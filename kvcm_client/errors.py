"""What a call can fail with: the service's answer (``KvcmError``) or the way there."""

from __future__ import annotations

from typing import Any

from chalicelib.protocol.codes import ErrorCode


class ClientError(Exception):
    """Base of every error the client raises."""


class KvcmError(ClientError):
    """The service answered with ``header.status.code`` other than OK."""

    def __init__(
        self, api_name: str, code: ErrorCode, message: str, http_status: int = 200, response: Any | None = None
    ) -> None:
        super().__init__(f"{api_name}: {code.name}: {message}" if message else f"{api_name}: {code.name}")
        self.api_name = api_name
        self.code = code
        self.message = message
        self.http_status = http_status
        #: The response model (the method's fields at their defaults), or None for HTTP 401/403.
        self.response = response


class AuthError(KvcmError):
    """HTTP 401 (no or unknown bearer), 403 (the account may not call this) or 429 (locked out
    after failed attempts)."""


class TransportError(ClientError):
    """No answer: connection refused or reset, timeout, or an HTTP error from a proxy."""


class ProtocolError(ClientError):
    """An answer that is not the protocol's JSON envelope (wrong URL, old server...)."""
