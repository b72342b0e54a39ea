"""``KvcmClient``: the API over HTTP with pooled connections, timeouts, retries and leader discovery.

Retries: a call of an idempotent method (``methods.IDEMPOTENT``: reads and the writes that
may be applied twice) is tried again, with exponential backoff and jitter, when it got no
answer (connection error, timeout, a proxy's 502/503/504) or answered SERVICE_NOT_READY.
Other methods are sent once: their answer may have been lost after they were applied.

Leader discovery follows upstream's Python client (``auto_discover_leader``): the seed URL is
asked ``/api/getClusterInfo``; an OK answer with ``leader_endpoint.host`` and
``meta_http_port`` moves the client there, anything else (404 from a server without it, an
error, no endpoint) keeps the seed. A SERVER_NOT_LEADER answer makes it discover again
and retry, up to ``leader_retry_count`` times. A KVCM deployment has no leader-only method
(every API container serves everything), so against KVCM the seed URL simply stays.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import urllib3

from chalicelib.protocol.codes import ErrorCode
from chalicelib.protocol.wire import render

from .errors import AuthError, KvcmError, ProtocolError, TransportError
from .methods import IDEMPOTENT, OPERATIONS, Methods

DEFAULT_URL = "http://127.0.0.1:8000"
#: Answers that mean "try again later", not "this request is wrong".
RETRYABLE_CODES = frozenset({ErrorCode.SERVICE_NOT_READY})
RETRYABLE_HTTP = frozenset({502, 503, 504})
#: No or an unknown bearer, a role that may not call this, too many failed attempts.
AUTH_REFUSALS = frozenset({401, 403, 429})
DISCOVERY_TIMEOUT_S = 5.0  # upstream's fixed discovery timeout


class KvcmClient(Methods):
    """A KVCM API client; thread-safe, one connection pool per host.

    ``client.get_cache_location(instance_id="i", query_type="QT_PREFIX_MATCH", block_keys=[1, 2])``
    returns a ``GetCacheLocationResponse``; an error code raises ``KvcmError`` (``check=False``:
    the response is returned as it is).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str = "",
        *,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 3.0,
        retries: int = 3,
        backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
        pool_size: int = 8,
        check: bool = True,
        auto_discover_leader: bool = False,
        leader_retry_count: int = 1,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self.seed_url = url.rstrip("/")
        self.url = self.seed_url
        self.token = token
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.check = check
        self.auto_discover_leader = auto_discover_leader
        self.leader_retry_count = leader_retry_count
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._timeout = urllib3.Timeout(connect=connect_timeout_s, read=timeout_s)
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=pool_size, block=False, retries=False)
        self._lock = threading.Lock()
        if auto_discover_leader:
            self.discover_leader()

    # ------------------------------------------------------------ plumbing

    def close(self) -> None:
        """Close the pooled connections."""
        self._pool.clear()

    def __enter__(self) -> KvcmClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        timeout: urllib3.Timeout | None = None,
        base_url: str | None = None,
    ) -> tuple[int, bytes, str]:
        """One HTTP exchange: (status, body, content type). TransportError when there is no answer."""
        try:
            response = self._pool.request(
                method,
                (base_url or self.url) + path,
                body=body,
                headers=self._headers(),
                timeout=timeout or self._timeout,
                redirect=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise TransportError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        return response.status, response.data, response.headers.get("Content-Type", "")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (1-based): exponential, capped, full jitter."""
        return self._rng.uniform(0, min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))

    # ------------------------------------------------------------ calls

    def call(self, api_name: str, request: Any = None, fields: Mapping[str, Any] | None = None) -> Any:
        """Call ``api_name`` with a request model or its fields; returns the response model."""
        request_model, response_model, _ = OPERATIONS[api_name]
        if request is None:
            request = request_model.model_validate(dict(fields or {}))
        elif fields:
            raise TypeError("pass a request model or keyword fields, not both")
        body = render(request).encode()
        attempts = 1 + (self.retries if api_name in IDEMPOTENT else 0)
        leader_retries = self.leader_retry_count if self.auto_discover_leader else 0
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._exchange(api_name, response_model, body)
            except TransportError:
                if attempt >= attempts:
                    raise
                self._sleep(self.backoff(attempt))
                continue
            except KvcmError as exc:
                if exc.code == ErrorCode.SERVER_NOT_LEADER and leader_retries > 0:
                    leader_retries -= 1
                    self._sleep(self.backoff(1))
                    self.discover_leader()
                    attempt -= 1  # a move to the leader is not a retry of a lost answer
                    continue
                if exc.code in RETRYABLE_CODES and attempt < attempts:
                    self._sleep(self.backoff(attempt))
                    continue
                if self.check or isinstance(exc, AuthError) or exc.response is None:
                    raise
                return exc.response
            return response

    def _exchange(self, api_name: str, response_model: Any, body: bytes) -> Any:
        status, raw, _ = self.request("POST", f"/api/{api_name}", body)
        if status in RETRYABLE_HTTP:
            raise TransportError(f"{api_name}: HTTP {status}")
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            raise ProtocolError(f"{api_name}: HTTP {status}, not JSON: {raw[:120]!r}") from None
        header = data.get("header") if isinstance(data, dict) else None
        reported: dict[str, Any] = header.get("status", {}) if isinstance(header, dict) else {}
        code_name = reported.get("code", "")
        if code_name not in ErrorCode.__members__:
            raise ProtocolError(f"{api_name}: HTTP {status}, no protocol status in {raw[:120]!r}")
        code = ErrorCode[code_name]
        message = reported.get("message", "")
        if status in AUTH_REFUSALS:
            raise AuthError(api_name, code, message, status)
        if status != 200:
            raise ProtocolError(f"{api_name}: HTTP {status}: {code_name}: {message}")
        response = response_model.model_validate(data)
        if code != ErrorCode.OK:
            raise KvcmError(api_name, code, message, status, response)
        return response

    # ------------------------------------------------------------ leader discovery

    def discover_leader(self) -> str:
        """Ask the seed URL for the leader (upstream's ``getClusterInfo``); returns the URL now used."""
        body = json.dumps({"trace_id": f"leader_discovery_{time.monotonic_ns()}"}).encode()
        try:
            status, raw, _ = self.request(
                "POST",
                "/api/getClusterInfo",
                body,
                timeout=urllib3.Timeout(DISCOVERY_TIMEOUT_S),
                base_url=self.seed_url,
            )
            data = json.loads(raw) if status == 200 else {}
        except (TransportError, ValueError):
            return self.url
        endpoint = data.get("leader_endpoint") if isinstance(data, dict) else None
        code = (data.get("header") or {}).get("status", {}).get("code") if isinstance(data, dict) else None
        if code == "OK" and isinstance(endpoint, dict) and endpoint.get("host") and endpoint.get("meta_http_port"):
            with self._lock:
                self.url = f"http://{endpoint['host']}:{int(endpoint['meta_http_port'])}"
        return self.url

    # ------------------------------------------------------------ endpoints beside the API

    def _get_text(self, path: str) -> str:
        status, raw, _ = self.request("GET", path)
        if status in AUTH_REFUSALS:
            raise AuthError(path, ErrorCode.UNSPECIFIED, raw.decode(errors="replace").strip(), status)
        if status != 200:
            raise ProtocolError(f"GET {path}: HTTP {status}: {raw[:200]!r}")
        return raw.decode()

    def prometheus_metrics(self) -> str:
        """``GET /metrics``: the service metrics in the Prometheus text format."""
        return self._get_text("/metrics")

    def openapi(self) -> dict[str, Any]:
        """``GET /openapi.json``: the API's OpenAPI document."""
        document: dict[str, Any] = json.loads(self._get_text("/openapi.json"))
        return document
