"""Issue 22 item 6: upstream's ``local`` storage spec (ST_DUMMY, ``local {root_path,
key_count_per_file}``) as its pruning and multi-location cases add it, served as a file
backend on KVCM's own disk; through the app on real Valkey and moto."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from .harness import code


def _setup(http, root: str) -> None:
    resp = http(
        "addStorage",
        {"storage": {"global_unique_name": "test_storage_01", "local": {"root_path": root, "key_count_per_file": 1}}},
    )
    assert code(resp) == "OK", resp
    resp = http(
        "createInstanceGroup",
        {
            "instance_group": {
                "name": "local_group",
                "storage_candidates": ["test_storage_01"],
                "quota": {"capacity": 1024 * 32, "quota_config": [{"storage_type": 6, "capacity": 1024 * 32}]},
                "cache_config": {
                    "reclaim_strategy": {
                        "storage_unique_name": "test_storage_01",
                        "reclaim_policy": 1,
                        "trigger_strategy": {"used_percentage": 3.2},
                    }
                },
            }
        },
    )
    assert code(resp) == "OK", resp
    resp = http(
        "registerInstance",
        {
            "instance_group": "local_group",
            "instance_id": "local_1",
            "block_size": 128,
            "location_spec_infos": [{"name": "tp0", "size": 1024}],
            "model_deployment": {"model_name": "m", "dtype": "FP8"},
        },
    )
    assert code(resp) == "OK", resp


def test_a_local_storage_is_a_file_backend_on_kvcms_disk(http, runtime, tmp_path):
    root = f"{tmp_path}/test_storage_01/data/"
    _setup(http, root)
    [listed] = [s for s in http("listStorage", {})["storage"] if s["global_unique_name"] == "test_storage_01"]
    assert listed["local"] == {"root_path": root, "key_count_per_file": 1} and listed["storage_type"] == "ST_DUMMY"

    keys = [100, 101, 102]
    start = http("startWriteCache", {"instance_id": "local_1", "block_keys": keys, "write_timeout_seconds": 30})
    assert code(start) == "OK" and len(start["locations"]) == 3, start
    paths = []
    for loc in start["locations"]:
        assert loc["type"] == "ST_DUMMY"
        [spec] = loc["location_specs"]
        assert spec["uri"].startswith("file://test_storage_01/") and "blkid" not in spec["uri"]
        path = urlparse(spec["uri"]).path
        # A file per block location below the root (named by its placement group, not by the
        # key as upstream's: docs/api-v2.md).
        assert path.startswith(os.path.normpath(root) + "/local_1/tp0/")
        paths.append(path)
    assert len(set(paths)) == 3
    for path in paths:  # the engine writes the data
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "x").close()
    finish = {
        "instance_id": "local_1",
        "write_session_id": start["write_session_id"],
        "success_blocks": {"bool_masks": {"values": [True] * 3}},
    }
    assert code(http("finishWriteCache", finish)) == "OK"
    found = http(
        "getCacheLocation",
        {"instance_id": "local_1", "query_type": "QT_PREFIX_MATCH", "block_keys": keys, "block_mask": {"offset": 0}},
    )
    assert [urlparse(loc["location_specs"][0]["uri"]).path for loc in found["locations"]] == paths
    storages = http(
        "registerInstance",
        {
            "instance_group": "local_group",
            "instance_id": "local_1",
            "block_size": 128,
            "location_spec_infos": [{"name": "tp0", "size": 1024}],
            "model_deployment": {"model_name": "m", "dtype": "FP8"},
        },
    )["storage_configs"]
    assert '"global_unique_name":"test_storage_01"' in storages.replace(" ", "")


def test_a_local_storage_needs_an_absolute_root_path(http, runtime):
    resp = http("addStorage", {"storage": {"global_unique_name": "bad_local", "local": {"root_path": "data"}}})
    assert code(resp) == "INVALID_ARGUMENT" and "local.root_path" in resp["header"]["status"]["message"]
    assert all(s["global_unique_name"] != "bad_local" for s in http("listStorage", {})["storage"])


def test_st_dummy_goes_with_the_local_spec_only(http, runtime):
    body = {"global_unique_name": "x1", "storage_type": "ST_DUMMY", "nfs": {"root_path": "/mnt/x"}}
    resp = http("addStorage", {"storage": body})
    assert code(resp) == "INVALID_ARGUMENT" and "does not match the nfs spec" in resp["header"]["status"]["message"]
    body = {"global_unique_name": "x2", "storage_type": "ST_DUMMY", "local": {"root_path": "/mnt/x"}}
    assert code(http("addStorage", {"storage": body})) == "OK"
