"""SHARDS estimates: the weighted stack, the whole-sampled roots, and the bias on traces
whose first block is shared by every request."""

from __future__ import annotations

import random
import statistics

import pytest

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.mrc import lru_curve, shards_error
from chalicelib.optimizer.shards import SampledCurveBuilder, _WeightedStack
from chalicelib.optimizer.traces import Op, Query, Record

from .synth import random_trace


def _estimate(records, rate, seed=0, block_size=1):
    builder = SampledCurveBuilder(block_size=block_size, sample_rate=rate, seed=seed)
    for record in records:
        builder.add(record)
    return builder.curve()


def test_weighted_stack_distances_match_a_list_through_compactions():
    rng = random.Random(3)
    stack = _WeightedStack()
    order: list[int] = []  # most recent last
    weight = {}
    for _ in range(5000):  # more touches than the first array holds: compacts and grows
        key = rng.randrange(700)
        weight.setdefault(key, rng.choice([1, 5, 100]))
        if rng.random() < 0.3 and key in order:
            probe = rng.choice(order)
            behind = order[order.index(probe) + 1 :]
            assert stack.distance(probe, 7) == 7 + sum(weight[k] for k in behind)
        stack.touch(key, weight[key])
        if key in order:
            order.remove(key)
        order.append(key)
    assert stack.distance(10**9, 1) is None


def _shared_root_conversations(seed, conversations=1500, turns=4):
    """Multi-turn conversations that all start with block 0 (a shared system prompt)."""
    rng = random.Random(seed)
    fresh = iter(range(1, 10**9))
    live: list[list[int]] = []
    records = []
    for t in range(conversations * turns):
        if live and rng.random() < 0.7:
            keys = rng.choice(live)
            keys.extend(next(fresh) for _ in range(rng.randint(1, 4)))
        else:
            keys = [0, *(next(fresh) for _ in range(rng.randint(2, 8)))]
            live.append(keys)
            if len(live) > 200:
                live.pop(0)
        records.append(Record("a", t, Op.REQUEST, list(keys)))
    return records


def test_a_root_shared_by_every_request_is_counted_whole():
    # no other reuse: every hit is the root's, at any capacity, whatever the sample draws
    fresh = iter(range(1, 10**9))
    records = [Record("a", t, Op.REQUEST, [0, *(next(fresh) for _ in range(9))]) for t in range(2000)]
    exact = lru_curve(records, block_size=1)
    for seed in range(3):
        estimate = _estimate(records, 0.01, seed)
        for capacity in (100, 1000, 10**6):
            assert estimate.block_hit_ratio(capacity) == pytest.approx(exact.block_hit_ratio(capacity))
            assert exact.block_hit_ratio(capacity) == pytest.approx(1999 / 20000)


def test_estimates_are_unbiased_on_a_shared_root_workload():
    records = _shared_root_conversations(1)
    exact = lru_curve(records, block_size=1)
    caps = [200, 1000, 3000, 10_000]
    signed = {c: [] for c in caps}
    for seed in range(12):
        estimate = _estimate(records, 0.05, seed)
        for c in caps:
            signed[c].append(estimate.block_hit_ratio(c) - exact.block_hit_ratio(c))
    for c in caps:
        # the root is ~1/9 of all reads: sampling it or not used to move the curve that much
        assert abs(statistics.mean(signed[c])) < 0.01, (c, signed[c])
        assert max(map(abs, signed[c])) < 0.04, (c, signed[c])


@pytest.mark.parametrize("seed", range(4))
def test_mixed_records_give_a_monotone_curve_close_to_the_exact_one(seed):
    records = random_trace(40 + seed, requests=600, mixed=True)
    exact = lru_curve(records, block_size=4)
    estimate = lru_curve(records, block_size=4, sample_rate=0.5)
    caps = list(range(0, exact.saturation_capacity + 50, 25))
    ratios = [estimate.block_hit_ratio(c) for c in caps]
    assert ratios == sorted(ratios) and 0 <= ratios[0] and ratios[-1] <= 1
    assert estimate.read_blocks == exact.read_blocks  # counted unsampled
    assert estimate.internal_hit_blocks == exact.internal_hit_blocks
    assert shards_error(exact, estimate, caps)["mean_abs_error"] < 0.08


def test_capacity_queries_invert_the_binning():
    records = _shared_root_conversations(2, conversations=300)
    estimate = _estimate(records, 0.1)
    target = estimate.block_hit_ratio(2000)
    capacity = estimate.smallest_capacity(target)
    assert capacity <= 2000 and estimate.block_hit_ratio(capacity) >= target
    assert estimate.block_hit_ratio(capacity - 10) < target  # bins are 1/rate = 10 blocks
    assert estimate.block_hit_ratio(estimate.saturation_capacity) == estimate.block_hit_ratio(10**9)


def test_bad_rates_are_config_errors():
    for rate in (0, 1, 1.5):
        with pytest.raises(ConfigError):
            SampledCurveBuilder(block_size=1, sample_rate=rate)
    with pytest.raises(ConfigError):
        SampledCurveBuilder(block_size=0, sample_rate=0.5)


def test_sliding_window_reads_use_the_windows_share_of_kept_keys():
    keys = list(range(1, 41))
    records = [Record("a", 0, Op.WRITE, keys), Record("a", 1, Op.READ, keys, 0, 0, Query.REVERSE_ROLL_SW_MATCH, 8)]
    exact = lru_curve(records, block_size=1)
    estimate = lru_curve(records, block_size=1, sample_rate=0.5)
    assert exact.block_hit_ratio(100) == 8 / 40
    assert estimate.block_hit_ratio(100) == pytest.approx(8 / 40, abs=0.1)


def test_shards_error_names_the_capacity_of_the_largest_error_and_its_sign():
    records = _shared_root_conversations(3, conversations=300)
    exact = lru_curve(records, block_size=1)
    estimate = _estimate(records, 0.1)
    caps = list(range(0, exact.saturation_capacity + 50, 50))
    error = shards_error(exact, estimate, caps)
    signed = {c: estimate.block_hit_ratio(c) - exact.block_hit_ratio(c) for c in caps}
    worst = max(caps, key=lambda c: abs(signed[c]))
    assert error["max_at_capacity"] == worst and error["error_at_max"] == signed[worst] != 0
    assert error["max_abs_error"] == abs(signed[worst]) >= error["mean_abs_error"] > 0
    with pytest.raises(ConfigError):
        shards_error(exact, estimate, [])
