"""Issue 22 item 8: a watermark lowered by updateInstanceGroup is reclaimed down to, through
the API and the reclaim job (real Valkey, moto's table)."""

from __future__ import annotations

import json

import pytest
from chalice.test import Client

from tests.helpers import api_caller

BLOCK = 1024


@pytest.fixture
def http(runtime):
    import app

    with Client(app.app) as client:
        yield api_caller(client)


def code(resp: dict) -> str:
    return resp["header"]["status"]["code"]


def group_body(used_percentage: float, version: int) -> dict:
    return {
        "name": "wm",
        "storage_candidates": ["nfs_wm"],
        "quota": {"capacity": 8 * BLOCK},
        "cache_config": {
            "reclaim_strategy": {
                "reclaim_policy": 1,
                "trigger_strategy": {"used_percentage": used_percentage},
                "reclaim_step_percentage": 10,
            }
        },
        "version": version,
    }


def serving(http, keys: list[int]) -> int:
    resp = http("getCacheMeta", {"instance_id": "wm1", "block_keys": keys})
    assert code(resp) == "OK", resp
    return sum(1 for meta in resp["metas"] if json.loads(meta)["status"] == "CLS_SERVING")


def test_a_lowered_watermark_is_reclaimed_down_to(http, runtime, clock, tmp_path):
    root = tmp_path / "nfs_wm"
    root.mkdir()
    assert (
        code(http("addStorage", {"storage": {"global_unique_name": "nfs_wm", "nfs": {"root_path": str(root)}}})) == "OK"
    )
    assert code(http("createInstanceGroup", {"instance_group": group_body(10.0, 1)})) == "OK"
    resp = http(
        "registerInstance",
        {
            "instance_group": "wm",
            "instance_id": "wm1",
            "block_size": 4,
            "location_spec_infos": [{"name": "tp0", "size": BLOCK}],
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    assert code(resp) == "OK", resp
    keys = list(range(1, 9))
    start = http("startWriteCache", {"instance_id": "wm1", "block_keys": keys})
    assert code(start) == "OK" and len(start["locations"]) == 8, start
    finish = {"instance_id": "wm1", "write_session_id": start["write_session_id"], "success_blocks": {"offset": 8}}
    assert code(http("finishWriteCache", finish)) == "OK"
    job = runtime.reclaim_job
    for _ in range(3):  # 10.0 (above 1) never triggers: a full group stays full
        clock.advance(1)
        job.run()
    assert serving(http, keys) == 8

    update = {"instance_group": group_body(0.5, 2), "current_version": 1}
    assert code(http("updateInstanceGroup", update)) == "OK"
    rounds = 0
    while serving(http, keys) > 4 and rounds < 6:  # the watermark: 50 % of 8 KiB
        clock.advance(1)
        job.run()
        rounds += 1
    assert serving(http, keys) <= 4, f"still {serving(http, keys)} blocks serving after {rounds} rounds"
