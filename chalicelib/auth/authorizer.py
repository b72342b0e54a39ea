"""Request authentication: ``Authorization: Bearer <api key>`` (or an admin's password).

Two bearer forms (docs/security.md):

- ``kvcm_<key id>.<secret>``, an API key (createApiKey). Its record and its account come
  from the container's ``ConfigCache``, so a warm check is a SHA-256 and two dict
  lookups; a revoked key or deleted account stops working within the config refresh.
- ``<user_name>:<password>``, only for admin accounts (bootstrap: the first admin makes
  API keys with it). Checked with scrypt, slow by design, so a verified pair is remembered
  per container for ``password_ttl_s`` under a keyed hash (HMAC with a per-process random
  key, no password kept), and failed attempts are limited per (account, source)
  (``FailureLimiter``); so are lookups of unknown key ids, per source, which read the
  table the first time a container sees them (then the miss is cached by key id).

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
    """Bounds guessing per container, per name (an account from one source, or a source):
    a name with ``per_name`` failures in ``window_s`` is locked until they age out, and
    past ``per_window`` failures of all names in ``window_s`` the names not spared are
    locked too (each failure cost a scrypt check or a table read). Spared from that
    node-wide bound: a name that succeeded within ``trust_s``, and with ``spare_clean`` a
    name without a failure in the window — so nobody else's failures lock them out.
    Thread-safe; memory bounded by ``max_names``."""

    def __init__(
        self,
        clock: Clock,
        per_name: int = 5,
        per_window: int = 60,
        window_s: float = 60.0,
        trust_s: float = 0.0,
        spare_clean: bool = False,
        max_names: int = 10_000,
        what: str = "password attempts",
    ) -> None:
        self._clock = clock
        self._what = what
        self._per_name = per_name
        self._per_window = per_window
        self._window_s = window_s
        self._trust_s = trust_s
        self._spare_clean = spare_clean
        self._max_names = max_names
        self._lock = threading.Lock()
        self._all: deque[float] = deque()
        self._names: dict[str, deque[float]] = {}
        self._trusted: dict[str, float] = {}

    def _prune(self, times: deque[float], now: float) -> deque[float]:
        while times and times[0] <= now - self._window_s:
            times.popleft()
        return times

    def check(self, name: str, label: str = "") -> None:
        """TooManyAttemptsError if attempts for ``name`` (``label`` in the message: never
        more than the caller claimed) are suspended now."""
        now = self._clock.now()
        with self._lock:
            own = len(self._prune(self._names.get(name, deque()), now))
            if own >= self._per_name:
                raise TooManyAttemptsError(
                    f"too many failed {self._what}{f' for {label!r}' if label else ''}: retry in {self._window_s:.0f} s"
                )
            spared = self._trusted.get(name, float("-inf")) > now - self._trust_s or (self._spare_clean and own == 0)
            if not spared and len(self._prune(self._all, now)) >= self._per_window:
                raise TooManyAttemptsError(f"too many failed {self._what} on this node: retry later")

    def failed(self, name: str) -> None:
        now = self._clock.now()
        with self._lock:
            self._all.append(now)
            if name not in self._names and len(self._names) >= self._max_names:
                self._names = {n: t for n, t in self._names.items() if self._prune(t, now)}
            self._names.setdefault(name, deque()).append(now)

    def succeeded(self, name: str) -> None:
        now = self._clock.now()
        with self._lock:
            self._names.pop(name, None)
            if self._trust_s > 0:
                if name not in self._trusted and len(self._trusted) >= self._max_names:
                    self._trusted = {n: t for n, t in self._trusted.items() if t > now - self._trust_s}
                self._trusted[name] = now


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
        # Per (account, source); a pair that verified within a day is never locked by others' guesses.
        self._limiter = limiter or FailureLimiter(clock, trust_s=86400.0)
        # Per source: a key id nobody knows costs a table read the first time a container
        # sees it; a source that has not missed is never refused.
        self._key_limiter = key_limiter or FailureLimiter(
            clock, per_name=60, per_window=600, spare_clean=True, what="API key lookups from this source"
        )
        self._key = os.urandom(32)
        self._lock = threading.Lock()
        self._verified: dict[bytes, tuple[Principal, float]] = {}

    def authorize(
        self,
        headers: Mapping[str, str],
        action: Action,
        api_name: str,
        target: Target | None = None,
        source: str = "",
    ) -> Principal:
        """The caller, if its role allows ``action`` (on ``target``, when given; the
        dispatcher checks the target once the body is parsed); else Unauthorized/
        Forbidden/TooManyAttempts."""
        principal = self.authenticate(headers, source)
        check_action(principal, action, api_name)
        if target is not None:
            check_target(principal, target, api_name)
        return principal

    def authenticate(self, headers: Mapping[str, str], source: str = "") -> Principal:
        """The caller named by the bearer token, or UnauthorizedError. ``source`` is the
        caller's address as the gateway saw it ("" when unknown): failures are limited per
        source, so one source's guesses never lock out another's callers."""
        token = parse_bearer(headers)
        user_name, colon, password = token.partition(":")
        if colon:
            if not user_name or not password:
                raise UnauthorizedError("a password bearer token must be '<user_name>:<password>'")
            return self._password(user_name, password, source)
        return self._api_key(token, source)

    def _api_key(self, token: str, source: str) -> Principal:
        key_id = key_id_of(token)
        if key_id is None:
            raise UnauthorizedError("malformed API key (expected kvcm_<key id>.<secret>)")
        loaded = False

        def gate() -> None:
            nonlocal loaded
            self._key_limiter.check(source)
            loaded = True

        record = self._config.api_key(key_id, before_load=gate)
        if record is None and loaded:
            self._key_limiter.failed(source)  # a real miss: the table was read for nothing
        if record is None or not matches(token, record):
            raise UnauthorizedError(f"invalid API key '{key_id}'")
        if record.expired(int(self._clock.now() * 1e6)):
            raise UnauthorizedError(f"API key '{key_id}' has expired")
        account = self._config.account(record.user_name)
        if account is None:
            raise UnauthorizedError(f"API key '{key_id}' belongs to no account")
        return principal_of(account, key_id)

    def _password(self, user_name: str, password: str, source: str) -> Principal:
        cache_key = hmac.new(self._key, f"{user_name}:{password}".encode(), hashlib.sha256).digest()
        now = self._clock.now()
        with self._lock:
            cached = self._verified.get(cache_key)
        if cached is not None and cached[1] > now:
            return cached[0]
        pair = f"{user_name}\n{source}"
        self._limiter.check(pair, user_name)
        account = self._control.verify_account(user_name, password)
        if account is None:
            self._limiter.failed(pair)
            raise UnauthorizedError(
                f"invalid credentials for user '{user_name}' (passwords are accepted for "
                f"admin accounts only; others use API keys)"
            )
        self._limiter.succeeded(pair)
        principal = principal_of(account)
        with self._lock:
            if len(self._verified) >= self._max_entries:
                self._verified = {k: v for k, v in self._verified.items() if v[1] > now}
                if len(self._verified) >= self._max_entries:
                    self._verified.clear()
            self._verified[cache_key] = (principal, now + self._password_ttl_s)
        return principal
