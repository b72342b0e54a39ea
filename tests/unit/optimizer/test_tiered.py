"""The tiered replay: hand-computed small traces, and properties against the single-tier replay."""

from __future__ import annotations

import json

import pytest

from chalicelib.optimizer.cli import main
from chalicelib.optimizer.cost import CostModel
from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.planner import GIB, CapacityPlan
from chalicelib.optimizer.policies import make_policy
from chalicelib.optimizer.replay import ReplayConfig, replay
from chalicelib.optimizer.tiered import (
    Strategy,
    TieredCache,
    TieredConfig,
    TierSpec,
    equal_cost_capacity,
    parse_size,
    tier_costs,
    tiered_replay,
)
from chalicelib.optimizer.traces import Op, Query, Record
from tests.unit.optimizer.synth import random_trace, write_mooncake_trace


def _writes(*chains: list[int]) -> list[Record]:
    return [Record("i", t, Op.WRITE, keys) for t, keys in enumerate(chains)]


def _two(first: int, second: int, strategy: Strategy = Strategy.DEMOTE, promote: bool = True) -> TieredConfig:
    return TieredConfig((TierSpec("mem", first), TierSpec("s3", second)), strategy, promote, block_size=1)


def test_demote_keeps_the_block_one_tier_drops_and_promotes_it_on_a_hit():
    records = [*_writes([1], [2], [3]), Record("i", 3, Op.READ, [1]), Record("i", 4, Op.READ, [2])]
    single = replay(records, ReplayConfig(capacity=2, block_size=1)).totals
    assert single.external_hit_blocks == 1  # 1 was evicted by 3; reading 1 refreshed nothing, 2 hits

    result = tiered_replay(records, _two(2, 2))
    mem, s3 = result.tiers
    # 3 evicted 1 from mem into s3: reading 1 hits s3 and copies 1 back into mem, whose
    # LRU victim 2 goes down to s3, where the read of 2 finds it; copying 2 up sends 3 down
    assert result.replay.totals.external_hit_blocks == 2
    assert (mem.hit_blocks, s3.hit_blocks) == (0, 2)
    assert (mem.promoted_blocks, s3.demoted_blocks) == (2, 3)  # 1, 2 up; 1, 2, 3 down
    assert (mem.stored_blocks, s3.stored_blocks) == (3 + 2, 3)
    assert mem.hit_ratio == 0 and s3.hit_ratio == 1.0
    assert (mem.cached_blocks, s3.cached_blocks) == (2, 2)  # mem {1, 2}; s3 {2, 3}, 1 evicted

    kept = tiered_replay(records, _two(2, 2, promote=False))
    assert [t.hit_blocks for t in kept.tiers] == [1, 1]  # 1 stays in s3 only, 2 is in mem
    assert [t.cached_blocks for t in kept.tiers] == [2, 1]


def test_a_block_leaves_only_when_no_tier_holds_it():
    cache = TieredCache([make_policy("lru"), make_policy("lru")], [1, 1], Strategy.DEMOTE, promote=True)
    for key in (1, 2, 3):
        cache.insert([key], None, None)
    assert (cache.tier(0).keys(), cache.tier(1).keys()) == ({3}, {2})
    assert 1 not in cache and 2 in cache and len(cache) == 2
    assert cache.fastest_holder(3) == 0 and cache.fastest_holder(2) == 1 and cache.fastest_holder(1) is None
    assert cache.evict(1) == 1  # tier 0's victim moves down, and pushes 2 out of the tree
    assert cache.keys() == {3} and cache.tier(0).keys() == set()


def test_prefix_rule_over_the_union_of_tiers():
    # mem holds one block: writing the chain 1-2-3 keeps 1 (the most recent) and demotes
    # 3 then 2 to s3, coldest first
    records = [
        Record("i", 0, Op.WRITE, [1, 2, 3]),
        Record("i", 1, Op.READ, [1, 2, 3]),  # all hit: 1 in mem, 2 and 3 in s3
        Record("i", 2, Op.READ, [1, 9, 3]),  # 9 is in no tier: 3 does not hit behind it
        Record("i", 3, Op.READ, [9, 2, 3], 0, 0, Query.BATCH_GET),  # no prefix needed
    ]
    result = tiered_replay(records, _two(1, 10, promote=False))
    totals = result.replay.totals
    assert totals.external_hit_blocks == 3 + 1 + 2
    assert [t.hit_blocks for t in result.tiers] == [1 + 1, 2 + 2]
    assert result.tiers[1].demoted_blocks == 2


def test_write_through_writes_every_tier_and_evicts_each_on_its_own():
    records = [*_writes([1], [2], [3]), Record("i", 3, Op.READ, [1, 2, 3])]
    result = tiered_replay(records, _two(1, 3, Strategy.WRITE_THROUGH, promote=False))
    mem, s3 = result.tiers
    assert (mem.stored_blocks, s3.stored_blocks, s3.demoted_blocks) == (3, 3, 0)
    # 1 and 2 left mem only: the read finds them in s3; 3 is in both, credited to mem
    assert (mem.hit_blocks, s3.hit_blocks) == (1, 2)


@pytest.mark.parametrize("seed", range(6))
def test_write_through_equals_one_tier_at_the_larger_capacity(seed):
    records = random_trace(seed, mixed=True)
    single = replay(records, ReplayConfig(capacity=25, block_size=4)).totals
    config = TieredConfig((TierSpec("mem", 6), TierSpec("s3", 25)), Strategy.WRITE_THROUGH, block_size=4)
    result = tiered_replay(records, config)
    assert result.replay.totals == single
    assert sum(t.hit_blocks for t in result.tiers) == single.external_hit_blocks


POLICY_PARAMS = {"random_lru": {"samples": 3}, "kvcm": {"round_s": 10.0, "period_s": 1}}


@pytest.mark.parametrize("policy", ["lru", "random_lru", "leaf_aware_lru", "lfu", "kvcm"])
@pytest.mark.parametrize("strategy", list(Strategy))
@pytest.mark.parametrize("read_refresh", [True, False])
def test_a_second_tier_of_capacity_zero_is_the_single_tier_replay(policy, strategy, read_refresh):
    params = POLICY_PARAMS.get(policy, {})
    for seed in range(8):
        records = random_trace(seed, mixed=True)
        single = ReplayConfig(
            capacity=12, policy=policy, block_size=4, seed=seed, read_refresh=read_refresh, policy_params=params
        )
        expected = replay(records, single)
        tiers = (TierSpec("mem", 12, policy, params), TierSpec("s3", 0, "lru"))
        config = TieredConfig(tiers, strategy, block_size=4, seed=seed, read_refresh=read_refresh)
        result = tiered_replay(records, config)
        assert result.replay.totals == expected.totals, seed
        assert result.replay.instances == expected.instances, seed
        assert [(w.instance, w.totals, w.cached_blocks) for w in result.replay.windows] == [
            (w.instance, w.totals, w.cached_blocks) for w in expected.windows
        ], seed
        mem, s3 = result.tiers
        assert mem.hit_blocks == expected.totals.external_hit_blocks and s3.hit_blocks == 0
        assert s3.cached_blocks == 0


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="tiers: give at least one tier"):
        TieredConfig(())
    with pytest.raises(ConfigError, match="tiers: names must be unique"):
        TieredConfig((TierSpec("mem", 1), TierSpec("mem", 2)))
    with pytest.raises(ConfigError, match="tier s3: capacity must be >= 0"):
        TierSpec("s3", -1)
    with pytest.raises(ConfigError, match="unknown policy"):
        TierSpec("s3", 1, "fifo")
    with pytest.raises(ConfigError, match="strategy: unknown 'copy'"):
        Strategy.parse("copy")
    assert Strategy.parse("cascading") is Strategy.DEMOTE and Strategy.parse("write-through") is Strategy.WRITE_THROUGH


def test_sizes_and_costs_per_tier():
    assert parse_size("8GiB") == 8 * GIB and parse_size("1.5 kib") == 1536 and parse_size("2GB") == 2 * 10**9
    assert parse_size("20k") is None and parse_size("500") is None
    # one block = one GiB; mem at 0.01/GiB-h, s3 at 0.001
    plan = CapacityPlan(block_size=1, kv_bytes_per_token=GIB, model="given")
    prices = {"dram": 0.01, "s3": 0.001}
    records = [Record(name, n * 600_000_000, Op.REQUEST, [n % 3]) for n in range(12) for name in "ab"]
    result = tiered_replay(records, TieredConfig((TierSpec("mem", 1), TierSpec("s3", 4)), block_size=1))
    costs = tier_costs(result, plan, CostModel(flops_per_token=1e12, gpu_flops=1e12, mfu=1.0), prices)
    mem, s3 = costs["tiers"]
    assert (mem["storage_tier"], s3["storage_tier"]) == ("dram", "s3")
    assert (mem["capacity_gib"], s3["capacity_gib"]) == (2, 8)  # two instances
    assert mem["storage_cost_per_hour"] == pytest.approx(0.02) and s3["storage_cost_per_hour"] == pytest.approx(0.008)
    assert costs["storage_cost_per_month"] == pytest.approx(0.028 * 730)
    # every hit token saves one GPU-second at 2.5/GPU-h, over the trace's 6,600 s
    hours = result.replay.duration_s / 3600
    assert mem["gpu_cost_saved_per_hour"] == pytest.approx(mem["hit_blocks"] * 2.5 / 3600 / hours)
    assert costs["net_per_hour"] == pytest.approx(costs["gpu_cost_saved_per_hour"] - 0.028)
    tiers = [TierSpec("mem", 1), TierSpec("s3", 4)]
    assert equal_cost_capacity(tiers, plan, "mem", prices) == 1  # 0.014/h buys 1.4 mem blocks
    assert equal_cost_capacity(tiers, plan, "s3", prices) == 14
    with pytest.raises(ConfigError, match="tier tape: unknown storage tier"):
        equal_cost_capacity(tiers, plan, "tape", prices)


def test_the_tiers_command(tmp_path, capsys):
    trace = write_mooncake_trace(tmp_path / "trace.jsonl", seed=3)
    base = [
        "tiers",
        "--trace",
        str(trace),
        "--format",
        "mooncake",
        "--block-size",
        "16",
        "--kv-bytes-per-token",
        "1024",
    ]
    # a block is 16 KiB: 1MiB of mem is 64 blocks
    args = [*base, "--tier", "mem:1MiB:lru", "--tier", "s3:500:leaf_aware_lru", "--compare", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    mem, s3 = data["tiers"]
    assert (mem["capacity"], s3["capacity"], s3["policy"]) == (64, 500, "leaf_aware_lru")
    assert data["config"]["strategy"] == "demote" and data["config"]["promote"] is True
    assert mem["hit_blocks"] + s3["hit_blocks"] == data["replay"]["totals"]["external_hit_blocks"]
    alone = data["equal_cost_single_tier"]["tiers"]
    assert (
        len(alone) == 1
        and alone[0]["capacity"] > 64
        and alone[0]["storage_cost_per_hour"] <= data["storage_cost_per_hour"]
    )
    assert main([*base, "--tier", "mem:64", "--tier", "s3:500", "--strategy", "write_through", "--no-promote"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("write_through, no promotion: 1 instance(s)") and "\ns3 " in out and "\ntotal " in out


@pytest.mark.parametrize(
    ("tier", "message"),
    [
        ("mem", "--tier: expected NAME:CAPACITY[:POLICY], got 'mem'"),
        ("mem:lots", "--tier mem:lots: not a capacity"),
        ("mem:10:fifo", "--tier mem:10:fifo: unknown policy 'fifo'"),
        ("tape:10", "tier tape: unknown storage tier 'tape'"),
    ],
)
def test_the_tiers_command_names_a_bad_tier(tmp_path, capsys, tier, message):
    trace = write_mooncake_trace(tmp_path / "trace.jsonl", seed=1, requests=5)
    assert main(["tiers", "--trace", str(trace), "--tier", tier]) == 2
    assert message in capsys.readouterr().err


def test_three_tiers_a_hit_in_the_slowest_is_copied_into_every_faster_one():
    # a, b hold one block each, c five: after writing 1, 2, 3 a = {3}, b = {2}, c = {1}
    records = [*_writes([1], [2], [3]), Record("i", 3, Op.READ, [1])]
    tiers = (TierSpec("mem", 1), TierSpec("ssd", 1), TierSpec("s3", 5))
    result = tiered_replay(records, TieredConfig(tiers, Strategy.DEMOTE, block_size=1))
    # 1 is credited to c, then copied into a (3 goes down to b, 2 down to c) and into b
    # (3 goes down to c)
    assert [t.hit_blocks for t in result.tiers] == [0, 0, 1]
    assert [t.promoted_blocks for t in result.tiers] == [1, 1, 0]
    assert [t.demoted_blocks for t in result.tiers] == [0, 3, 3]
    assert [t.cached_blocks for t in result.tiers] == [1, 1, 3]
    assert result.replay.windows[-1].cached_blocks == 3  # the union: {1, 2, 3}


def test_the_tiers_command_replays_every_combination_of_capacities(tmp_path, capsys):
    trace = write_mooncake_trace(tmp_path / "trace.jsonl", seed=4)
    base = ["tiers", "--trace", str(trace), "--tier", "mem:10,40", "--tier", "s3:0,100,400"]
    assert main([*base, "--json"]) == 0
    grid = json.loads(capsys.readouterr().out)["grid"]
    assert [[t["capacity"] for t in run["tiers"]] for run in grid] == [
        [10, 0],
        [10, 100],
        [10, 400],
        [40, 0],
        [40, 100],
        [40, 400],
    ]
    ratios = [run["hit_ratio"] for run in grid]
    assert ratios[0] < ratios[1] <= ratios[2] and ratios[3] < ratios[4] <= ratios[5]  # a cold tier adds hits
    assert ratios[3] == grid[3]["tiers"][0]["hit_ratio"]  # s3 of 0 blocks serves nothing
    assert main(base) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 6 and "hit mem" in lines[0] and lines[1].split()[:2] == ["10", "0"]
    assert main([*base, "--compare"]) == 2
    assert "--compare: give one capacity per tier" in capsys.readouterr().err


@pytest.mark.parametrize("moves", [False, True])
def test_kvcm_tiers_demote_a_rounds_victims_and_the_write_path_drops_its_own(moves):
    """KVCM demotes what its reclaim rounds take (demote_on_reclaim); the write path's
    eviction in a start deletes, so its victims leave the tree unless
    ``write_path_victims_move`` (upstream's cascading moves every victim)."""
    hot = make_policy("kvcm", round_s=1.0, write_path_victims_move=moves)
    cache = TieredCache([hot, make_policy("kvcm", round_s=1.0)], [10, 10], Strategy.DEMOTE, promote=False)
    cache.advance(0)
    cache.insert(list(range(1, 11)))  # the hot tier full
    cache.insert([20])  # the write path makes room: the chain's leaf 10 goes
    assert 10 not in hot and (10 in cache.tier(1)) is moves
    cache.advance(1_000_000)  # a round: 10 blocks over the trigger of 9, one step: leaf 9
    assert 9 not in hot and 9 in cache.tier(1)
    assert cache.demoted_blocks == [0, 1 + moves]


def test_kvcm_tiers_never_drop_a_block_whose_child_a_slower_tier_holds():
    """A record counts its children whatever their tier: the hot tier's write path may not
    drop a parent whose child was demoted (the cold block would no longer match any
    prefix), while a round of the demoting tier may hand that parent on."""
    hot = make_policy("kvcm", round_s=1.0)
    cache = TieredCache([hot, make_policy("kvcm", round_s=1.0)], [3, 10], Strategy.DEMOTE, promote=False)
    cache.advance(0)
    cache.insert([1, 2, 3])  # the hot tier full
    cache.advance(1_000_000)  # a round: over the trigger of 2 by 1, leaf 3 demoted
    assert set(hot.keys()) == {1, 2} and 3 in cache.tier(1)
    # a new chain of two: the write path finds no block it may drop (2's child is cold,
    # 1's is 2), so the write gets the leading block that fits
    assert cache.insert([10, 11]) == 1
    assert set(hot.keys()) == {1, 2, 10} and cache.match_prefix([1, 2, 3]) == 3
    cache.advance(2_000_000)  # a round: the least recent of the hot tier's own leaves, 2, goes down
    assert set(hot.keys()) == {1, 10} and {2, 3} <= cache.tier(1).keys()
    assert cache.match_prefix([1, 2, 3]) == 3
