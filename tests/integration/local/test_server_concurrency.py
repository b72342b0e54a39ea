"""Issue 22 item 9: the local stack's HTTP server under the concurrency of upstream's
suites (24-thread pools and more), through its real socket."""

from __future__ import annotations

import http.client
import json
import logging
import threading

import pytest

from chalicelib.observability.logging import logger
from local_stack.server import ApiServer, chalice_config

FRESH_CONNECTIONS = 96


@pytest.fixture
def server(runtime):
    import app

    api = ApiServer(app.app, chalice_config(), "127.0.0.1", 0)
    api.start()
    yield api
    api.stop()


def _post(port: int, method: str, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", f"/api/{method}", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def _at_once(count: int, call) -> list[object]:
    """``call(i)`` from ``count`` threads released together; what each returned or raised."""
    barrier = threading.Barrier(count)
    results: list[object] = [None] * count

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = call(i)
        except OSError as exc:  # a reset or refused connection: what the test counts
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_the_listen_backlog_holds_a_burst_of_fresh_connections(server):
    results = _at_once(FRESH_CONNECTIONS, lambda i: _post(server.port, "checkHealth", {"trace_id": f"b{i}"}))
    failed = [r for r in results if isinstance(r, OSError)]
    assert failed == [] and all(status == 200 for status, _ in results), failed[:3]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(logger.registered_formatter.format(record)))


def test_each_access_line_carries_its_own_requests_correlation_id(server):
    records, kvcm = _Records(), logging.getLogger(logger.name)
    kvcm.addHandler(records)
    try:
        results = _at_once(48, lambda i: _post(server.port, "checkHealth", {"trace_id": f"trace-{i}"}))
        assert _post(server.port, "checkHealth", {})[0] == 200
    finally:
        kvcm.removeHandler(records)
    assert all(status == 200 for status, _ in results)
    access = [line for line in records.lines if line["message"] == "access"]
    assert len(access) == 49
    # The last request had no trace id: it carries none, whatever its thread served before.
    wrong = [line for line in access if line.get("correlation_id") != (line["trace_id"] or None)]
    assert wrong == [], wrong[:3]
