"""The meta API's runtime (debug routes on), a file storage in tmp, and an HTTP client."""

from __future__ import annotations

import json
import threading

import pytest
from chalice.test import Client

from chalicelib.protocol.models import InstanceGroup, StorageConfig
from tests.helpers import post_api
from tests.integration.meta.harness import ER_SPECS, L1, L2, LIVENESS, code, register


@pytest.fixture
def runtime_settings():
    """The meta tests' runtime: a table of its own, the debug routes served."""
    return {"node_id": "test-node", "debug_service": True}


@pytest.fixture
def nfs_root(tmp_path):
    return tmp_path / "nfs"


@pytest.fixture
def group(runtime, nfs_root):
    nfs_root.mkdir()
    runtime.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": str(nfs_root), "key_count_per_file": 4}}
        )
    )
    return runtime.control.create_group(
        InstanceGroup.model_validate({"name": "g1", "storage_candidates": ["nfs_01"], "quota": {"capacity": 1 << 30}})
    )


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
                call.status, answer = post_api(client, method, raw=raw)
            return answer

        yield call


@pytest.fixture
def instance(http, group):
    return register(http)


@pytest.fixture
def er(http, group):
    """Instance e1 of group ger, which has both event-report storages; e2 in gl1 (L1P5 only)."""
    for name, kind in (("er_l1p5", L1), ("er_l2", L2)):
        resp = http(
            "addStorage", {"storage": {"global_unique_name": name, "storage_type": kind, "event_report": LIVENESS}}
        )
        assert code(resp) == "OK", resp
    for name, candidates in (("ger", ["er_l1p5", "er_l2"]), ("gl1", ["er_l1p5"])):
        resp = http(
            "createInstanceGroup",
            {
                "instance_group": {
                    "name": name,
                    "storage_candidates": ["nfs_01"],
                    "event_report_storage_candidates": candidates,
                    "extra_info": '{"zone":"a"}',
                }
            },
        )
        assert code(resp) == "OK", resp
    for instance, group_name in (("e1", "ger"), ("e2", "gl1")):
        resp = http(
            "registerInstance",
            {
                "instance_group": group_name,
                "instance_id": instance,
                "block_size": 4,
                "location_spec_infos": ER_SPECS,
                "model_deployment": {"model_name": "m", "dtype": "fp16"},
                "location_spec_groups": [
                    {"name": "F0", "spec_names": ["full_0"]},
                    {"name": "L0", "spec_names": ["linear_0"]},
                ],
            },
        )
        assert code(resp) == "OK", resp
    return "e1"
