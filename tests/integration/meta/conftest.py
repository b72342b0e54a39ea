"""A runtime on real Valkey + moto DynamoDB, a file storage in tmp, and an HTTP client."""
from __future__ import annotations

import json
import threading

import pytest
from chalice.test import Client

from tests.conftest import build_runtime
from chalicelib.protocol.models import InstanceGroup, StorageConfig
from chalicelib.runtime import set_runtime

SPECS = [{"name": "tp0", "size": 1024}, {"name": "tp1", "size": 1024}]


@pytest.fixture
def runtime(valkey, valkey_url, aws, clock):
    yield build_runtime(valkey, valkey_url, clock, node_id="test-node", debug_service=True)
    set_runtime(None)


@pytest.fixture
def nfs_root(tmp_path):
    return tmp_path / "nfs"


@pytest.fixture
def group(runtime, nfs_root):
    nfs_root.mkdir()
    runtime.control.add_storage(StorageConfig.model_validate(
        {"global_unique_name": "nfs_01", "nfs": {"root_path": str(nfs_root), "key_count_per_file": 4}}))
    return runtime.control.create_group(InstanceGroup.model_validate(
        {"name": "g1", "storage_candidates": ["nfs_01"], "quota": {"capacity": 1 << 30}}))


@pytest.fixture
def http(runtime):
    import app

    # Chalice's test client patches the process environment around each request: calls
    # from several threads (a relay's sender beside the test) must not interleave, or a
    # racing restore leaks the stage's variables into every later test.
    lock = threading.RLock()  # reentrant: a test may call the API from inside a handler
    with Client(app.app) as client:
        def call(method: str, body) -> dict:
            raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
            with lock:
                resp = client.http.post(f"/api/{method}", body=raw, headers={"Content-Type": "application/json"})
            call.status = resp.status_code
            return json.loads(resp.body) if resp.body else {}
        yield call


def code(resp: dict) -> str:
    return resp["header"]["status"]["code"]


@pytest.fixture
def instance(http, group):
    resp = http("registerInstance", {"instance_group": "g1", "instance_id": "i1", "block_size": 4,
                                     "location_spec_infos": SPECS,
                                     "model_deployment": {"model_name": "m", "dtype": "fp16"}})
    assert code(resp) == "OK", resp
    return "i1"


def write(http, keys, instance="i1", success=None, **extra):
    """start + finish; returns the start response."""
    start = http("startWriteCache", {"instance_id": instance, "block_keys": keys, **extra})
    assert code(start) == "OK", start
    n = len(start["locations"])
    mask = {"bool_masks": {"values": success}} if success is not None else {"offset": n}
    fin = http("finishWriteCache", {"instance_id": instance, "write_session_id": start["write_session_id"],
                                    "success_blocks": mask})
    assert code(fin) == "OK", fin
    return start
