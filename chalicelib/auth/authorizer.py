"""Request authentication: ``Authorization: Bearer <api key>`` (or an admin's password).

Two bearer forms (docs/security.md):

- ``kvcm_<key id>.<secret>``, an API key (createApiKey). Its record and its account come
  from the container's ``ConfigCache``, so a warm check is a SHA-256 and two dict
  lookups; a revoked key or deleted account stops working within the config refresh.
- ``<user_name>:<password>``, only for admin accounts (bootstrap: the first admin makes
  API keys with it). Checked with scrypt, slow by design, so a verified pair is remembered
  per container for ``password_ttl_s`` under a keyed hash (HMAC with a per-process random
  key, no password kept), and failed attempts are limited (``FailureLimiter``); so are
  lookups of unknown key ids, which read the table the first time a container sees them.

Missing or invalid credentials → UnauthorizedError (HTTP 401); too many failures →
TooManyAttemptsError (HTTP 429); a role without the permission → ForbiddenError (HTTP
403). Messages name at most the user or key id, never a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from collections import deque
from collections.abc import Mapping

from ..clock import Clock
from ..control.api_keys import key_id_of, matches
from ..control.config_cache import ConfigCache
from ..control.plane import ControlPlane
from ..control.records import AccountRecord
from ..protocol.errors import TooManyAttemptsError, UnauthorizedError
from .policy import Action, Principal, Scope, Target, check_action, check_target

_SCHEME = "bearer"
#: The one name the key-lookup limiter counts under (its node-wide bound is what matters).
_KEY_LOOKUPS = "unknown key ids"
_USAGE = "the Authorization header must be 'Bearer <api key>' (or 'Bearer <user_name>:<password>' of an admin)"


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lowered), None)


def parse_bearer(headers: Mapping[str, str]) -> str:
    """The bearer token of the Authorization header, or UnauthorizedError."""
    value = _header(headers, "Authorization")
    if not value:
        raise UnauthorizedError(f"missing Authorization header: {_USAGE}")
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != _SCHEME or not token:
        raise UnauthorizedError(_USAGE)
    return token


def principal_of(account: AccountRecord, key_id: str = "") -> Principal:
    """The caller an account (and the key it used) stands for."""
    return Principal(
        account.user_name, account.role, Scope(frozenset(account.groups), account.instance_prefixes), key_id
    )


class FailureLimiter:
    """Bounds guessing per container: a name (account) with ``per_user`` failures in
    ``window_s`` is locked until they age out, and all failures together may not exceed
    ``per_window`` in ``window_s`` (each cost a scrypt check or a table read). Thread-safe."""

    def __init__(
        self,
        clock: Clock,
        per_user: int = 5,
        per_window: int = 60,
        window_s: float = 60.0,
        max_users: int = 10_000,
        what: str = "password attempts",
    ) -> None:
        self._clock = clock
        self._what = what
        self._per_user = per_user
        self._per_window = per_window
        self._window_s = window_s
        self._max_users = max_users
        self._lock = threading.Lock()
        self._all: deque[float] = deque()
        self._users: dict[str, deque[float]] = {}

    def _prune(self, times: deque[float], now: float) -> deque[float]:
        while times and times[0] <= now - self._window_s:
            times.popleft()
        return times

    def check(self, user_name: str) -> None:
        """TooManyAttemptsError if attempts for ``user_name`` are suspended now."""
        now = self._clock.now()
        with self._lock:
            if len(self._prune(self._all, now)) >= self._per_window:
                raise TooManyAttemptsError(f"too many failed {self._what} on this node: retry later")
            if len(self._prune(self._users.get(user_name, deque()), now)) >= self._per_user:
                raise TooManyAttemptsError(
                    f"too many failed {self._what} for '{user_name}': retry in {self._window_s:.0f} s"
                )

    def failed(self, user_name: str) -> None:
        now = self._clock.now()
        with self._lock:
            self._all.append(now)
            if user_name not in self._users and len(self._users) >= self._max_users:
                self._users = {u: t for u, t in self._users.items() if self._prune(t, now)}
            self._users.setdefault(user_name, deque()).append(now)

    def succeeded(self, user_name: str) -> None:
        with self._lock:
            self._users.pop(user_name, None)


class Authorizer:
    """Authenticates callers and checks their role. Thread-safe; one per container.

    ``config`` serves accounts and API keys (``ConfigCache``), ``control`` verifies
    passwords (``ControlPlane.verify_account``)."""

    def __init__(
        self,
        config: ConfigCache,
        control: ControlPlane,
        clock: Clock,
        password_ttl_s: float = 10.0,
        max_entries: int = 1024,
        limiter: FailureLimiter | None = None,
        key_limiter: FailureLimiter | None = None,
    ) -> None:
        self._config = config
        self._control = control
        self._clock = clock
        self._password_ttl_s = password_ttl_s
        self._max_entries = max_entries
        self._limiter = limiter or FailureLimiter(clock)
        # Unknown key ids cost a table read each the first time a container sees them.
        self._key_limiter = key_limiter or FailureLimiter(clock, per_user=600, per_window=600, what="API key lookups")
        self._key = os.urandom(32)
        self._lock = threading.Lock()
        self._verified: dict[bytes, tuple[Principal, float]] = {}

    def authorize(
        self, headers: Mapping[str, str], action: Action, api_name: str, target: Target | None = None
    ) -> Principal:
        """The caller, if its role allows ``action`` (on ``target``, when given; the
        dispatcher checks the target once the body is parsed); else Unauthorized/
        Forbidden/TooManyAttempts."""
        principal = self.authenticate(headers)
        check_action(principal, action, api_name)
        if target is not None:
            check_target(principal, target, api_name)
        return principal

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """The caller named by the bearer token, or UnauthorizedError."""
        token = parse_bearer(headers)
        user_name, colon, password = token.partition(":")
        if colon:
            if not user_name or not password:
                raise UnauthorizedError("a password bearer token must be '<user_name>:<password>'")
            return self._password(user_name, password)
        return self._api_key(token)

    def _api_key(self, token: str) -> Principal:
        key_id = key_id_of(token)
        if key_id is None:
            raise UnauthorizedError("malformed API key (expected kvcm_<key id>.<secret>)")
        record = self._config.api_key(key_id, before_load=lambda: self._key_limiter.check(_KEY_LOOKUPS))
        if record is None:
            self._key_limiter.failed(_KEY_LOOKUPS)
        if record is None or not matches(token, record):
            raise UnauthorizedError(f"invalid API key '{key_id}'")
        if record.expired(int(self._clock.now() * 1e6)):
            raise UnauthorizedError(f"API key '{key_id}' has expired")
        account = self._config.account(record.user_name)
        if account is None:
            raise UnauthorizedError(f"API key '{key_id}' belongs to no account")
        return principal_of(account, key_id)

    def _password(self, user_name: str, password: str) -> Principal:
        cache_key = hmac.new(self._key, f"{user_name}:{password}".encode(), hashlib.sha256).digest()
        now = self._clock.now()
        with self._lock:
            cached = self._verified.get(cache_key)
        if cached is not None and cached[1] > now:
            return cached[0]
        self._limiter.check(user_name)
        account = self._control.verify_account(user_name, password)
        if account is None:
            self._limiter.failed(user_name)
            raise UnauthorizedError(
                f"invalid credentials for user '{user_name}' (passwords are accepted for "
                f"admin accounts only; others use API keys)"
            )
        self._limiter.succeeded(user_name)
        principal = principal_of(account)
        with self._lock:
            if len(self._verified) >= self._max_entries:
                self._verified = {k: v for k, v in self._verified.items() if v[1] > now}
                if len(self._verified) >= self._max_entries:
                    self._verified.clear()
            self._verified[cache_key] = (principal, now + self._password_ttl_s)
        return principal
