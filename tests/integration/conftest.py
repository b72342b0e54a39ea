"""The runtime under test: one ``runtime`` fixture on moto + Valkey, its settings chosen
per directory or module by overriding ``runtime_settings``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import build_runtime, serialize_transactions
from tests.integration.control.harness import TABLE


@pytest.fixture
def runtime_settings() -> dict[str, Any]:
    """Settings of ``runtime`` beyond ``build_runtime``'s defaults. The default is the
    control plane's: a fixed table (the control CLI finds it by name), the metrics prefix
    the admin tests read and the config refresh period of production. Override this
    fixture where a test needs others (the meta API's debug routes, an event log)."""
    return {"control_table": TABLE, "key_prefix": "kvcmtest", "node_id": "node-a", "config_refresh_s": 2.0}


@pytest.fixture
def runtime(aws, valkey, valkey_url, clock, monkeypatch, runtime_settings):
    """A Runtime on moto + Valkey, installed for the app (``set_runtime``)."""
    from chalicelib.runtime import set_runtime

    serialize_transactions(monkeypatch)
    yield build_runtime(valkey, valkey_url, clock, **runtime_settings)
    set_runtime(None)


@pytest.fixture
def other_container(runtime, valkey, valkey_url, clock, runtime_settings):
    """Another container beside ``runtime`` (node ``node-b``): same settings, table and
    Valkey, its own caches; not installed."""
    return build_runtime(valkey, valkey_url, clock, install=False, **{**runtime_settings, "node_id": "node-b"})


@pytest.fixture
def index(valkey, clock):
    """The block index on the session's (flushed) Valkey, key prefix ``t``, on the manual clock."""
    from chalicelib.index import BlockIndex

    return BlockIndex(valkey, "t", clock)


@pytest.fixture
def control(runtime):
    return runtime.control


@pytest.fixture
def client(runtime):
    """chalice.test.Client over the real app."""
    from chalice.test import Client

    from app import app

    with Client(app) as test_client:
        yield test_client


@pytest.fixture
def round_trips(monkeypatch):
    """How many times a client sent commands (a pipeline sends all of its own at once)."""
    from redis.connection import AbstractConnection

    sent = [0]
    send = AbstractConnection.send_packed_command

    def counted(self, command, check_health=True):
        sent[0] += 1
        return send(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    return lambda: sent[0]
