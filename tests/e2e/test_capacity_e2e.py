"""Over HTTP against the running local stack (reclaim every second, deletion through the
batched_delete state machine): a full group with reclaim switched off (used_percentage
above 1, as upstream's reclaim cases do) refuses writes; once its watermark is lowered to
50 % it takes writes again within 2 s, and its usage settles under the watermark."""

import json
import time

from .harness import Api

BLOCK = 1024
CAPACITY_BLOCKS = 8


def _group(percentage: float, version: int = 0) -> dict:
    return {
        "name": "cap",
        "storage_candidates": ["nfs_01"],
        "version": version,
        "quota": {"capacity": CAPACITY_BLOCKS * BLOCK},
        "cache_config": {
            "reclaim_strategy": {
                "reclaim_policy": "POLICY_LRU",
                "reclaim_step_percentage": 50,
                "trigger_strategy": {"used_percentage": percentage},
            }
        },
    }


def _code(body: dict) -> str:
    return body["header"]["status"]["code"]


def _write(api: Api, key: int) -> str:
    _, start = api.call("startWriteCache", {"instance_id": "cap-1", "block_keys": [key]})
    if _code(start) == "OK":
        _, fin = api.call(
            "finishWriteCache",
            {
                "instance_id": "cap-1",
                "write_session_id": start["write_session_id"],
                "success_blocks": {"offset": len(start["locations"])},
            },
        )
        assert _code(fin) == "OK", fin
    return _code(start)


def _stored(api: Api, keys: list[int]) -> int:
    _, meta = api.call("getCacheMeta", {"instance_id": "cap-1", "block_keys": keys})
    return sum(json.loads(m)["status"] != "CLS_NOT_FOUND" for m in meta["metas"])


def test_lowered_watermark_frees_space_within_two_seconds(api: Api):
    assert _code(api.call("createInstanceGroup", {"instance_group": _group(3.2)})[1]) == "OK"
    assert (
        _code(
            api.call(
                "registerInstance",
                {
                    "instance_group": "cap",
                    "instance_id": "cap-1",
                    "block_size": 16,
                    "location_spec_infos": [{"name": "tp0", "size": BLOCK}],
                    "model_deployment": {"model_name": "m", "dtype": "bf16"},
                },
            )[1]
        )
        == "OK"
    )
    keys = list(range(1, CAPACITY_BLOCKS + 1))
    for key in keys:  # unrelated keys: every block is a leaf
        assert _write(api, key * 7919) == "OK"
    assert _write(api, 99) == "REACH_MAX_ENTITY_CAPACITY"

    _, group = api.call("getInstanceGroup", {"name": "cap"})
    updated = api.call(
        "updateInstanceGroup",
        {
            "instance_group": _group(0.5, int(group["instance_group"]["version"]) + 1),
            "current_version": group["instance_group"]["version"],
        },
    )[1]
    assert _code(updated) == "OK", updated
    lowered = time.monotonic()
    while _write(api, 99) != "OK":
        assert time.monotonic() - lowered < 2.0, "writes still refused 2 s after lowering the watermark"
        time.sleep(0.1)

    written = [key * 7919 for key in keys] + [99]
    deadline = time.monotonic() + 15
    while _stored(api, written) * BLOCK > CAPACITY_BLOCKS * BLOCK * 0.5:
        assert time.monotonic() < deadline, "usage did not settle under the watermark"
        time.sleep(0.2)
