"""Request authorization: ``Authorization: Bearer <user_name>:<password>``.

The token names a control-plane account (addAccount); the password is checked against
the account's salted scrypt hash. ``ROLE_ADMIN`` may call every service, ``ROLE_USER``
only ``meta``. Missing or invalid credentials → UnauthorizedError (HTTP 401); a valid
account without the role → ForbiddenError (HTTP 403).

Because scrypt is slow by design, a verified token is remembered per container for
``ttl_s`` (default 10 s): a deleted account or changed password stops working in every
container within that time. The cache keys are keyed hashes of the token (HMAC with a
per-process random key), so no password is kept in memory longer than the request.
Credentials are never logged: error messages name at most the user.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import threading
from dataclasses import dataclass
from typing import Mapping, Optional

from ..clock import Clock
from ..control import ControlPlane
from ..protocol.codes import Role
from ..protocol.errors import ForbiddenError, UnauthorizedError

_SCHEME = "bearer"


@dataclass(frozen=True)
class Principal:
    """Who made the call."""

    user_name: str
    role: Role


def _header(headers: Mapping[str, str], name: str) -> Optional[str]:
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lowered), None)


def parse_bearer(headers: Mapping[str, str]) -> tuple[str, str]:
    """(user_name, password) from the Authorization header, or UnauthorizedError."""
    value = _header(headers, "Authorization")
    if not value:
        raise UnauthorizedError("missing 'Authorization: Bearer <user_name>:<password>' header")
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != _SCHEME or not token.strip():
        raise UnauthorizedError("the Authorization header must be 'Bearer <user_name>:<password>'")
    user_name, colon, password = token.strip().partition(":")
    if not colon or not user_name or not password:
        raise UnauthorizedError("the bearer token must be '<user_name>:<password>'")
    return user_name, password


def allowed(role: Role, service: str) -> bool:
    """Whether ``role`` may call ``service`` ("meta", "admin", "debug")."""
    return role == Role.ROLE_ADMIN or (role == Role.ROLE_USER and service == "meta")


class Authorizer:
    """Checks a request's credentials and role. Thread-safe; one per container."""

    def __init__(self, control: ControlPlane, clock: Optional[Clock] = None, ttl_s: float = 10.0,
                 max_entries: int = 1024) -> None:
        self._control = control
        self._clock = clock or control.clock
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._key = os.urandom(32)
        self._lock = threading.Lock()
        self._verified: dict[bytes, tuple[Principal, float]] = {}

    def authorize(self, headers: Mapping[str, str], service: str) -> Principal:
        """The caller, if it may call ``service``; else UnauthorizedError / ForbiddenError."""
        user_name, password = parse_bearer(headers)
        principal = self._authenticate(user_name, password)
        if not allowed(principal.role, service):
            raise ForbiddenError(f"account '{principal.user_name}' ({principal.role.name}) "
                                 f"may not call the {service} service")
        return principal

    def _authenticate(self, user_name: str, password: str) -> Principal:
        cache_key = hmac.new(self._key, f"{user_name}:{password}".encode(), hashlib.sha256).digest()
        now = self._clock.now()
        with self._lock:
            cached = self._verified.get(cache_key)
        if cached is not None and cached[1] > now:
            return cached[0]
        role = self._control.verify_account(user_name, password)
        if role is None:
            raise UnauthorizedError(f"invalid credentials for user '{user_name}'")
        principal = Principal(user_name, role)
        with self._lock:
            if len(self._verified) >= self._max_entries:
                self._verified = {k: v for k, v in self._verified.items() if v[1] > now}
                if len(self._verified) >= self._max_entries:
                    self._verified.clear()
            self._verified[cache_key] = (principal, now + self._ttl_s)
        return principal
