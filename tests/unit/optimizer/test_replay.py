"""The replay engine on the real trace and on hand-made cases."""

from __future__ import annotations

import pytest

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.replay import EvictionMode, ReplayConfig, replay
from chalicelib.optimizer.traces import Op, Query, Record


def test_internal_and_external_hits_with_masks():
    block = 16
    records = [
        Record("i", 0, Op.WRITE, [1, 2, 3, 4]),
        # blocks 0-1 are on the engine already (offset mask): internal; 2-3 come from KVCM
        Record("i", 1, Op.READ, [1, 2, 3, 4, 5], 2, 70),
        # a bool mask: block 1 internal, 0 and 2 external, 3 missing stops the prefix
        Record("i", 2, Op.READ, [1, 2, 3, 9, 4], (False, True, False, False, False)),
        # batch_get ignores the mask and needs no prefix
        Record("i", 3, Op.READ, [9, 2, 4], 3, 0, Query.BATCH_GET),
        # sliding window of 2: the right-most fully cached run
        Record("i", 4, Op.READ, [1, 9, 3, 4, 8], 0, 0, Query.REVERSE_ROLL_SW_MATCH, 2),
    ]
    t = replay(records, ReplayConfig(capacity=100, block_size=block)).totals
    assert (t.reads, t.read_blocks) == (4, 18)
    assert t.internal_hit_blocks == 2 + 1
    assert t.external_hit_blocks == 2 + 2 + 2 + 2
    # read 1: min(4 blocks * 16, 70) = 64 tokens, 32 of them internal
    assert t.hit_tokens == 64 + 3 * 16 + 2 * 16 + 2 * 16
    assert t.external_hit_tokens == t.hit_tokens - 2 * 16 - 16
    assert t.input_tokens == 70 + 5 * 16 + 3 * 16 + 5 * 16


def test_read_refresh_changes_lru_order():
    records = [
        Record("i", 0, Op.WRITE, [1]),
        Record("i", 1, Op.WRITE, [2]),
        Record("i", 2, Op.READ, [1]),
        Record("i", 3, Op.WRITE, [3]),
        Record("i", 4, Op.READ, [1]),
    ]
    refresh = replay(records, ReplayConfig(capacity=2, block_size=1)).totals
    stale = replay(records, ReplayConfig(capacity=2, block_size=1, read_refresh=False)).totals
    assert refresh.external_hit_blocks == 2  # the read kept 1 recent; 2 was evicted
    assert stale.external_hit_blocks == 1  # 1 was the oldest write, evicted by 3


def test_eviction_modes():
    a = [Record("a", t, Op.REQUEST, [100 + t]) for t in range(10)]
    b = [Record("b", t, Op.REQUEST, [200 + t]) for t in range(10)]
    both = [r for pair in zip(a, b, strict=True) for r in pair]
    precise = replay(both, ReplayConfig(capacity=3, block_size=1))
    assert precise.instances["a"].inserted_blocks == 10
    # instance rough: at 4 blocks (over 3) a batch of 2 goes, so the cache swings 2..3
    # and the tenth write leaves {108, 109}
    rough = replay(a, ReplayConfig(capacity=3, block_size=1, mode="instance_rough", batch_size=2))
    assert [w.cached_blocks for w in rough.windows] == [2]
    result = replay(
        a + [Record("a", 11, Op.READ, [109, 108, 107])],
        ReplayConfig(capacity=3, block_size=1, mode="instance_rough", batch_size=2),
    )
    assert result.totals.external_hit_blocks == 2
    # group: 4 blocks shared by both instances
    group = replay(
        both + [Record("a", 20, Op.READ, [109]), Record("b", 20, Op.READ, [209])],
        ReplayConfig(capacity=4, block_size=1, mode="group_rough", batch_size=1),
    )
    assert group.totals.external_hit_blocks == 2


def test_config_validation():
    with pytest.raises(ConfigError):
        ReplayConfig(capacity=-1)
    with pytest.raises(ConfigError):
        ReplayConfig(capacity=1, mode="sometimes")
    with pytest.raises(ConfigError):
        ReplayConfig(capacity=1, batch_size=0)
    with pytest.raises(ConfigError):
        ReplayConfig(capacity=1, mode="group_rough", instance_capacities={"a": 2})
    with pytest.raises(ConfigError):
        ReplayConfig.from_dict({"capacity": 1, "colour": "red"})
    config = ReplayConfig(capacity=5, policy="Leaf-Aware-LRU", mode="INSTANCE-ROUGH")
    assert (config.policy, config.mode) == ("leaf_aware_lru", EvictionMode.INSTANCE_ROUGH)
    assert ReplayConfig.from_dict(config.to_dict()) == config


def test_instance_capacities():
    records = [Record(name, t, Op.REQUEST, [t]) for t in range(5) for name in ("a", "b")]
    result = replay(records, ReplayConfig(capacity=1, instance_capacities={"b": 5}, block_size=1))
    assert result.windows[0].cached_blocks == 1  # a
    assert [w.cached_blocks for w in result.windows if w.instance == "b"] == [5]


def test_gc_is_paused_only_during_a_pass():
    import gc

    from chalicelib.optimizer.perf import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
