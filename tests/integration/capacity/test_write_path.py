"""The write path under quota, through the HTTP meta API on a full runtime (real Valkey,
moto DynamoDB): a start evicts only what its grant uses, grants the longest leading run
that fits (issue #23 items 1 and 2), and a start that ends refused changes nothing."""

from __future__ import annotations

import json
import threading

import pytest

from chalicelib.protocol.errors import CapacityExceededError
from chalicelib.protocol.models import StartWriteCacheRequest
from tests.helpers import build_runtime
from tests.integration.capacity.harness import full_group_api

#: A block of every spec; a block of spec group "H" (tp0 only) is half of it.
BLOCK = 2048
HALF = 1024


@pytest.fixture
def runtime_settings():
    return {"node_id": "write-path-node"}


@pytest.fixture
def http(runtime, tmp_path):
    # full at 10 blocks; a watermark of 100 %: only the write path evicts
    with full_group_api(
        runtime, tmp_path / "nfs", "gw", 10 * BLOCK, ("i1", "i2"), [{"name": "H", "spec_names": ["tp0"]}]
    ) as call:
        yield call


def code(resp: dict) -> str:
    return resp["header"]["status"]["code"]


def write(http, instance_id: str, keys: list[int], **extra) -> dict:
    start = http("startWriteCache", {"instance_id": instance_id, "block_keys": keys, **extra})
    assert code(start) == "OK", start
    fin = http(
        "finishWriteCache",
        {
            "instance_id": instance_id,
            "write_session_id": start["write_session_id"],
            "success_blocks": {"offset": len(start["locations"])},
        },
    )
    assert code(fin) == "OK", fin
    return start


def statuses(http, instance_id: str, keys: list[int]) -> list[str]:
    metas = http("getCacheMeta", {"instance_id": instance_id, "block_keys": keys})["metas"]
    return [json.loads(m)["status"] for m in metas]


def live_bytes(runtime, instance_id: str | None = None) -> int:
    if instance_id is None:
        return runtime.index.group_usage(["gw"])[0].live().bytes
    return runtime.index.usage([runtime.contexts(instance_id).layout])[0].live().bytes


def prefix_hits(http, instance_id: str, keys: list[int]) -> int:
    resp = http("getCacheLocation", {"instance_id": instance_id, "query_type": "QT_PREFIX_MATCH", "block_keys": keys})
    return len(resp["locations"])


def test_a_start_too_big_for_the_group_gets_the_leading_run_its_evictions_make_room_for(runtime, http, clock):
    """i1 holds 5 of a full 10-block group, i2 the other 5. A start of 20 new keys by i1
    was refused after marking all of i1's blocks (a prefix read found 0, usage showed 0).
    Now i1's 5 make room for the first 5 keys, granted, the other 15 masked."""
    write(http, "i1", [1, 2, 3, 4, 5])
    write(http, "i2", [101, 102, 103, 104, 105])
    clock.advance(1)
    keys = list(range(1000, 1020))
    start = http("startWriteCache", {"instance_id": "i1", "block_keys": keys})
    assert code(start) == "OK", start
    assert len(start["locations"]) == 5
    assert start["block_mask"] == {"bool_masks": {"values": [False] * 5 + [True] * 15}}
    assert live_bytes(runtime) == 10 * BLOCK
    assert statuses(http, "i2", [101, 102, 103, 104, 105]) == ["CLS_SERVING"] * 5
    fin = http(
        "finishWriteCache",
        {"instance_id": "i1", "write_session_id": start["write_session_id"], "success_blocks": {"offset": 5}},
    )
    assert code(fin) == "OK", fin
    assert prefix_hits(http, "i1", keys) == 5


def test_eviction_frees_only_the_shortfall(runtime, http, clock):
    """Room for 2 blocks, a start of 4 new keys: 2 of i1's 5 blocks go, 3 stay serving."""
    write(http, "i1", [1, 2, 3, 4, 5])
    write(http, "i2", [101, 102, 103])
    clock.advance(1)
    start = write(http, "i1", [1000, 1001, 1002, 1003])
    assert start["block_mask"] == {"offset": 0} and len(start["locations"]) == 4
    assert statuses(http, "i1", [1, 2, 3, 4, 5]).count("CLS_SERVING") == 3
    assert live_bytes(runtime) == 10 * BLOCK


def test_a_partial_grant_masks_the_keys_present_and_the_keys_after_the_run(runtime, http, clock):
    """The existing prefix stays masked, then the run that fits, then the rest masked:
    the bool-list shape upstream's connectors read as "save these indices"."""
    write(http, "i2", list(range(101, 108)))  # 7 blocks: room for 3
    write(http, "i1", [1, 2])  # the request's prefix, protected from its own eviction
    clock.advance(1)
    start = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2, *range(1000, 1005)]})
    assert code(start) == "OK", start
    assert start["block_mask"] == {"bool_masks": {"values": [True, True, False, True, True, True, True]}}
    assert len(start["locations"]) == 1
    assert statuses(http, "i1", [1, 2]) == ["CLS_SERVING"] * 2
    assert live_bytes(runtime) == 10 * BLOCK


def test_a_start_refused_after_its_eviction_changes_nothing(runtime, http, clock):
    """i1's only block is half a block; the group is full; i1 starts one whole block.
    The eviction frees the half, which the whole block cannot use: the start is refused,
    and i1's block serves again, its bytes still counted (it was left DELETING)."""
    write(http, "i2", list(range(101, 110)))
    write(http, "i2", [110], location_spec_group_names=["H"])
    write(http, "i1", [1], location_spec_group_names=["H"])
    assert live_bytes(runtime) == 10 * BLOCK
    clock.advance(1)
    refused = http("startWriteCache", {"instance_id": "i1", "block_keys": [50]})
    assert code(refused) == "REACH_MAX_ENTITY_CAPACITY", refused
    assert statuses(http, "i1", [1, 50]) == ["CLS_SERVING", "CLS_NOT_FOUND"]
    assert prefix_hits(http, "i1", [1]) == 1
    assert live_bytes(runtime, "i1") == HALF
    assert live_bytes(runtime) == 10 * BLOCK
    usage = runtime.index.usage([runtime.contexts("i1").layout])[0]
    assert (usage.bytes, usage.deleting_bytes, usage.keys, usage.deleting_keys) == (HALF, 0, 1, 0)
    assert runtime.reclaim_job.run()["handed_over"] == 0  # nothing was queued for deletion
    assert statuses(http, "i1", [1]) == ["CLS_SERVING"]


def test_a_start_whose_prefix_fills_the_instance_evicts_none_of_it(runtime, http, clock):
    """The writer's own blocks that the request names are never evicted for its later keys."""
    write(http, "i1", [1, 2, 3, 4, 5])
    write(http, "i2", [101, 102, 103, 104, 105])
    clock.advance(1)
    refused = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2, 3, 4, 5, 6]})
    assert code(refused) == "REACH_MAX_ENTITY_CAPACITY", refused
    assert statuses(http, "i1", [1, 2, 3, 4, 5]) == ["CLS_SERVING"] * 5
    assert live_bytes(runtime) == 10 * BLOCK


def test_one_sequential_client_cannot_pass_the_group_quota(runtime, http, clock):
    """The group usage a start reads may be this container's copy of up to 100 ms ago,
    which missed the client's own previous grants: one-key starts in a row were granted
    past the quota (issue #28 item 7: 2x). The container's copy now follows its grants."""
    starts = [http("startWriteCache", {"instance_id": "i2", "block_keys": list(range(101, 107))})]
    assert code(starts[0]) == "OK"
    codes = [code(http("startWriteCache", {"instance_id": "i1", "block_keys": [k]})) for k in range(1, 8)]
    assert codes == ["OK"] * 4 + ["REACH_MAX_ENTITY_CAPACITY"] * 3
    assert live_bytes(runtime) == 10 * BLOCK


def test_across_containers_the_group_quota_is_passed_by_at_most_one_window(runtime, http, valkey, valkey_url, clock):
    """Issue #28 item 7, the bound README and docs/security.md state: each container
    keeps the group under its quota as its copy of the usage (at most 100 ms old, plus
    its own grants) shows it, so N containers racing keep it under N x the quota, and
    once the copies are 100 ms old none grants past it. The clock stands still while
    two containers' threads race: their copies never refresh (the worst case)."""
    cap = 10 * BLOCK
    settings = runtime.settings
    other_container = build_runtime(
        valkey, valkey_url, clock, install=False, control_table=settings.control_table, node_id="write-path-b"
    )
    containers = [(runtime, "i1"), (runtime, "i1"), (other_container, "i2"), (other_container, "i2")]
    granted: list[int] = []

    def writer(rt, instance_id: str, first: int) -> None:
        for key in range(first, first + (12 if first else 1)):
            request = StartWriteCacheRequest(instance_id=instance_id, block_keys=[key], write_timeout_seconds=600)
            try:
                granted.append(len(rt.cache.start_write_cache(request).locations))
            except CapacityExceededError:
                pass

    for rt, instance_id in containers[::2]:  # each container's copy read before the race
        writer(rt, instance_id, 0)
    threads = [
        threading.Thread(target=writer, args=(rt, instance_id, 1000 * (n + 1)))
        for n, (rt, instance_id) in enumerate(containers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert live_bytes(runtime, "i1") <= cap and live_bytes(runtime, "i2") <= cap
    assert live_bytes(runtime) == sum(granted) * BLOCK <= 2 * cap
    clock.advance(0.1)
    for rt, instance_id in containers[::2]:
        with pytest.raises(CapacityExceededError):
            rt.cache.start_write_cache(StartWriteCacheRequest(instance_id=instance_id, block_keys=[99]))
    assert live_bytes(runtime) == sum(granted) * BLOCK
