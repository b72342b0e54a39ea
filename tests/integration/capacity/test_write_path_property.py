"""One property over random groups, quotas and request sizes (issue #23 item 3), on the
data plane of a full runtime (real Valkey, moto DynamoDB), a seeded generator with a
fixed number of cases:

* a refused start has no side effect: every record, usage counter and deletion queue is
  as before it;
* a granted start gets a leading run of its keys, its evictions take only blocks of its
  own instance that it does not name, no more bytes than it was granted, and the least
  recently used first (the order the reclaimer's policy takes them in);
* usage equals the bytes held (per instance, and the group's counter is their sum), after
  every start and after the reclaimer's round;
* nothing a refused start touched is lost.
"""

from __future__ import annotations

import random

import pytest

from chalicelib.index import Status
from chalicelib.index.records import decode_record
from chalicelib.index.types import MODE_RAW
from chalicelib.protocol.errors import CapacityExceededError
from chalicelib.protocol.models import (
    BlockMask,
    FinishWriteCacheRequest,
    GetCacheLocationRequest,
    InstanceGroup,
    QueryType,
    RegisterInstanceRequest,
    StartWriteCacheRequest,
    StorageConfig,
)
from tests.helpers import SPECS

BLOCK = 2048
CASES = 12
KEY_SPACE = 40


@pytest.fixture
def runtime_settings():
    return {"node_id": "property-node"}


@pytest.fixture
def storage(runtime, tmp_path):
    runtime.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": str(tmp_path / "nfs"), "key_count_per_file": 1}}
        )
    )


def _group(runtime, name: str, quota_blocks: int, policy: str) -> None:
    runtime.control.create_group(
        InstanceGroup.model_validate(
            {
                "name": name,
                "storage_candidates": ["nfs_01"],
                "quota": {"capacity": quota_blocks * BLOCK},
                "cache_config": {
                    "reclaim_strategy": {"reclaim_policy": policy, "trigger_strategy": {"used_percentage": 1.0}}
                },
            }
        )
    )


def _register(runtime, group: str, instance_id: str) -> None:
    runtime.meta_service.register_instance(
        RegisterInstanceRequest.model_validate(
            {
                "instance_group": group,
                "instance_id": instance_id,
                "block_size": 4,
                "location_spec_infos": SPECS,
                "model_deployment": {"model_name": "m", "dtype": "fp16"},
            }
        )
    )


def _snapshot(runtime, instance_ids: list[str]) -> dict[str, object]:
    """Every record (raw), usage hash and deletion queue of the instances."""
    out: dict[str, object] = {}
    for instance_id in instance_ids:
        layout = runtime.contexts(instance_id).layout
        out[instance_id] = sorted(runtime.index.scan(layout))
        out[instance_id + ":u"] = runtime.valkey.hgetall(layout.key("u"))
        out[instance_id + ":dq"] = runtime.valkey.lrange(layout.key("dq"), 0, -1)
    return out


def _statuses(runtime, instance_id: str) -> dict[int, tuple[Status, int, int]]:
    """Block key -> (status, last access s, child count) of the instance's records (one
    location each: one storage)."""
    layout = runtime.contexts(instance_id).layout
    keys = list(range(0, 3000))
    out = {}
    for key, raw in zip(keys, runtime.index.read_raw(layout, keys, MODE_RAW), strict=True):
        record = decode_record(raw) if raw is not None else None
        if record is not None and record.locations:
            out[key] = (record.locations[0].status, record.last_access_s, record.children)
    return out


def _assert_usage_is_bytes_held(runtime, group: str, instance_ids: list[str]) -> None:
    total = 0
    for instance_id in instance_ids:
        layout = runtime.contexts(instance_id).layout
        records = _statuses(runtime, instance_id).values()
        held = BLOCK * len(records)
        usage = runtime.index.usage([layout])[0]
        deleting = BLOCK * sum(s == Status.DELETING for s, *_ in records)
        assert (usage.bytes, usage.deleting_bytes) == (held, deleting), instance_id
        total += usage.bytes
    assert runtime.index.group_usage([group])[0].bytes == total


def _start(runtime, instance_id: str, keys: list[int]):
    try:
        return runtime.cache.start_write_cache(StartWriteCacheRequest(instance_id=instance_id, block_keys=keys))
    except CapacityExceededError:
        return None


def _finish(runtime, instance_id: str, start) -> None:
    runtime.cache.finish_write_cache(
        FinishWriteCacheRequest(
            instance_id=instance_id,
            write_session_id=start.write_session_id,
            success_blocks=BlockMask(offset=len(start.locations)),
        )
    )


def test_refused_starts_change_nothing_and_evictions_follow_the_policy(runtime, storage, clock):
    rng = random.Random(23)
    for case in range(CASES):
        group, quota = f"pg{case}", rng.randint(4, 16)
        policy = rng.choice(["POLICY_LRU", "POLICY_LRU", "POLICY_LFU"])
        _group(runtime, group, quota, policy)
        instances = [f"p{case}a", f"p{case}b"]
        for instance_id in instances:
            _register(runtime, group, instance_id)
        base = {instances[0]: 0, instances[1]: 1000}
        # Fill to about the quota: chains of a few keys, some left WRITING, reads between.
        for _ in range(rng.randint(2, 6)):
            clock.advance(rng.randint(1, 5))
            instance_id = rng.choice(instances)
            first = base[instance_id] + rng.randrange(KEY_SPACE)
            keys = list(range(first, first + rng.randint(1, 4)))
            start = _start(runtime, instance_id, keys)
            if start is not None and rng.random() < 0.8:
                _finish(runtime, instance_id, start)
            if rng.random() < 0.5:
                runtime.cache.get_cache_location(
                    GetCacheLocationRequest(
                        instance_id=instance_id, query_type=QueryType.QT_PREFIX_MATCH, block_keys=keys[:1]
                    )
                )
        _assert_usage_is_bytes_held(runtime, group, instances)
        # The start under test: often past the quota, sometimes naming an existing prefix.
        clock.advance(rng.randint(1, 5))
        writer = rng.choice(instances)
        held = sorted(_statuses(runtime, writer))
        prefix = held[: rng.randint(0, min(3, len(held)))] if held and rng.random() < 0.4 else []
        first_new = base[writer] + 500 + case * 50
        keys = prefix + list(range(first_new, first_new + rng.randint(1, 2 * quota)))
        before = _snapshot(runtime, instances)
        statuses_before = {i: _statuses(runtime, i) for i in instances}
        start = _start(runtime, writer, keys)
        if start is None:
            assert _snapshot(runtime, instances) == before, f"case {case}: a refused start changed something"
            for instance_id in instances:
                now = _statuses(runtime, instance_id)
                for key, (status, *_) in statuses_before[instance_id].items():
                    if status == Status.SERVING:
                        assert now.get(key, (None,))[0] == Status.SERVING, f"case {case}: {key} lost"
        else:
            flags = [False] * len(keys)
            mask = start.block_mask
            if mask.offset is not None:
                flags = [i < mask.offset for i in range(len(keys))]
            elif mask.bool_masks is not None:
                flags = list(mask.bool_masks.values)
            written = [i for i, masked in enumerate(flags) if not masked]
            # one run: the keys written follow one another, every key before it present
            if written:
                assert written == list(range(written[0], written[0] + len(written))), f"case {case}: {flags}"
                assert all(keys[i] in statuses_before[writer] for i in range(written[0])), f"case {case}"
            assert len(start.locations) == len(written)
            assert all(keys[i] not in statuses_before[writer] for i in written), f"case {case}"
            after = _statuses(runtime, writer)
            evicted = [
                k
                for k, (s, *_) in statuses_before[writer].items()
                if s == Status.SERVING and after.get(k, (Status.DELETING,))[0] == Status.DELETING
            ]
            assert not set(evicted) & set(keys), f"case {case}: the write evicted a key it names"
            assert len(evicted) <= len(written), f"case {case}: evicted more than the grant uses"
            other = next(i for i in instances if i != writer)
            assert _statuses(runtime, other) == statuses_before[other], f"case {case}: another instance touched"
            if evicted and policy == "POLICY_LRU":
                # Leaves first, least recently used first: no leaf the write could take
                # (SERVING, not named) is kept that was used before a victim.
                kept_leaves = [
                    access
                    for k, (s, access, children) in statuses_before[writer].items()
                    if s == Status.SERVING and children == 0 and k not in keys and k not in evicted
                ]
                newest_victim = max(statuses_before[writer][k][1] for k in evicted)
                assert all(access >= newest_victim for access in kept_leaves), (
                    f"case {case}: a leaf used at {min(kept_leaves)} kept, one used at {newest_victim} evicted"
                )
            live = runtime.index.group_usage([group])[0].live().bytes
            assert live <= quota * BLOCK, f"case {case}: {live} live bytes over a {quota * BLOCK} quota"
        _assert_usage_is_bytes_held(runtime, group, instances)
        runtime.reclaim_job.run()
        _assert_usage_is_bytes_held(runtime, group, instances)
