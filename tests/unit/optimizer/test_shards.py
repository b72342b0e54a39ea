"""Fixed-size SHARDS: the sample stack, the bounded sample, the exact top, and the error
against the exact curve on generated traces of many sizes and shapes (issue #26)."""

from __future__ import annotations

import os
import random

import pytest

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.mrc import lru_curve, shards_error
from chalicelib.optimizer.report import shards_grid
from chalicelib.optimizer.shards import _MASK, DEFAULT_S_MAX, SampledCurveBuilder, _SampleStack
from chalicelib.optimizer.tracegen import TraceShape, generate_records, write_mooncake
from chalicelib.optimizer.traces import Op, Query, Record, read_trace

from .synth import random_trace

TARGET = 0.01  # issue #26: max absolute error at every capacity of the 40-point grid


def _sampled(records, block_size=16, **settings):
    builder = SampledCurveBuilder(block_size=block_size, **settings)
    for record in records:
        builder.add(record)
    return builder, builder.curve()


def test_sample_stack_counts_match_a_list_through_removals_and_compactions():
    rng = random.Random(3)
    stack = _SampleStack()
    order: list[int] = []  # most recent last
    for _ in range(20_000):  # far more touches than live keys: compacts several times
        keys = list(dict.fromkeys(rng.randrange(300) for _ in range(rng.randint(1, 4))))
        if rng.random() < 0.05 and order:
            gone = rng.choice(order)
            stack.remove(gone)
            order.remove(gone)
        if rng.random() < 0.3 and order:
            probe = rng.choice(order)
            assert stack.count_since(probe) == len(order) - order.index(probe)
        stack.write(keys)
        for key in reversed(keys):  # keys[0] ends on top
            if key in order:
                order.remove(key)
            order.append(key)
        assert stack.clock <= 2 * len(stack.last) + 4096 + len(keys)
    assert stack.count_since(10**9) is None


def test_the_sample_is_every_key_under_the_threshold_and_never_more_than_s_max():
    records = list(generate_records(TraceShape(distinct_blocks=30_000, seed=1)))
    seen = {k for r in records for k in r.keys}
    builder, curve = _sampled(records, s_max=500)
    salt, threshold = builder._salt, builder._threshold
    under = {k for k in seen if hash((k, salt)) & _MASK < threshold}
    assert builder.kept == len(under) <= 500
    assert builder._stacks["default"].members == under
    assert curve.sample_rate == threshold / (_MASK + 1) < 500 / 30_000 * 1.5
    assert curve.kept_keys == builder.kept and curve.s_max == 500 and not curve.exact


@pytest.mark.parametrize("seed", range(3))
def test_a_trace_within_the_exact_top_gives_the_exact_curve_at_any_rate(seed):
    # mixed records: masks, batch-get and sliding-window reads, writes with holes
    records = random_trace(40 + seed, requests=600, mixed=True)
    exact = lru_curve(records, block_size=4)
    for settings in ({"s_max": DEFAULT_S_MAX}, {"s_max": None, "sample_rate": 0.01}):
        _, sampled = _sampled(records, 4, **settings)
        caps = range(0, exact.saturation_capacity + 5)
        assert [sampled.block_hit_ratio(c) for c in caps] == [pytest.approx(exact.block_hit_ratio(c)) for c in caps]
        assert sampled.read_blocks == exact.read_blocks and sampled.internal_hit_blocks == exact.internal_hit_blocks


def test_the_issue_finding_a_42k_block_mooncake_trace_at_rate_0_01(tmp_path):
    # issue #26: on a Mooncake-format trace of ~42,000 distinct blocks, --sample-rate 0.01
    # (about 420 sampled keys) was off the exact curve by up to 0.078; this generated one
    # was off by 0.205 (at 18 blocks) before the exact top and fixed-size sampling
    path = tmp_path / "generated_42k.jsonl"
    write_mooncake(TraceShape(distinct_blocks=42_000), path)
    records = list(read_trace(path, "mooncake"))
    assert len({k for r in records for k in r.keys}) == 42_000
    exact = lru_curve(records, block_size=512)
    grid = shards_grid(exact)
    for settings in ({"sample_rate": 0.01}, {"s_max": DEFAULT_S_MAX}, {"s_max": 2048}):
        sampled = lru_curve(records, block_size=512, **settings)
        assert shards_error(exact, sampled, grid)["max_abs_error"] <= TARGET, settings


SHAPES = {
    "default": {},  # 4 Zipf system prompts of 32 blocks, 2,000 live conversations
    "no-sharing-skewed": {"system_prompts": 0, "reuse_skew": 1.2},
    "forks-long-prompts": {"fork": 0.3, "system_prompts": 16, "system_blocks": 100},
    "few-long-conversations": {"live": 200, "followup": 0.9},
}


HEAVY = {"forks-long-prompts", "few-long-conversations"}  # at 100k: 5-20 s each, in the slow tier


@pytest.mark.parametrize(
    ("distinct", "s_max", "shape"),
    [(10_000, 2048, shape) for shape in SHAPES]
    + [pytest.param(100_000, 4096, shape, marks=[pytest.mark.slow] if shape in HEAVY else []) for shape in SHAPES],
)
def test_sampled_curves_are_within_0_01_on_generated_traces(distinct, s_max, shape):
    # the default s_max holds traces this small in its exact top (see the test above); a
    # smaller one samples them, at a rate ~s_max / distinct behind an exact top of s_max keys
    records = list(generate_records(TraceShape(distinct_blocks=distinct, **SHAPES[shape])))
    assert len({k for r in records for k in r.keys}) == distinct
    builder, sampled = _sampled(records, s_max=s_max)
    assert builder.far_reads > 0 and sampled.sample_rate < 2 * s_max / distinct
    exact = lru_curve(records, block_size=16)
    error = shards_error(exact, sampled, shards_grid(exact))
    assert error["max_abs_error"] <= TARGET, error


#: 10M distinct blocks take about an hour of one core here (exact curve and sample): beyond
#: CI's budget, so that case runs when asked (`make test-huge`).
HUGE = pytest.mark.skipif(not os.environ.get("KVCM_HUGE_TESTS"), reason="10M blocks: make test-huge")


@pytest.mark.slow  # 1M..10M distinct blocks: the exact curve and the sample, a minute or more each
@pytest.mark.timeout(7200)
@pytest.mark.parametrize(
    ("distinct", "shape"),
    [(1_000_000, "default"), (1_000_000, "no-sharing-skewed"), pytest.param(10_000_000, "default", marks=HUGE)],
)
def test_sampled_curves_are_within_0_01_on_large_generated_traces(distinct, shape):
    def records():
        return generate_records(TraceShape(distinct_blocks=distinct, live=20_000, **SHAPES[shape]))

    exact = lru_curve(records(), block_size=16)
    sampled = lru_curve(records(), block_size=16, s_max=DEFAULT_S_MAX)
    assert sampled.sample_rate < 2 * DEFAULT_S_MAX / distinct and sampled.kept_keys <= DEFAULT_S_MAX
    error = shards_error(exact, sampled, shards_grid(exact))
    assert error["max_abs_error"] <= TARGET, error


def test_both_corrections_bring_the_far_hits_to_the_exact_far_read_count():
    records = list(generate_records(TraceShape(distinct_blocks=60_000, seed=2)))
    exact = lru_curve(records, block_size=16)
    grid = shards_grid(exact)
    for correction in ("ratio", "adj"):
        builder, sampled = _sampled(records, s_max=1024, correction=correction)
        assert builder.far_reads > 0 and builder.sampled_far_reads != builder.far_reads
        assert shards_error(exact, sampled, grid)["max_abs_error"] <= 2 * TARGET, correction


def test_capacity_queries_invert_the_binning():
    records = list(generate_records(TraceShape(distinct_blocks=60_000, seed=3)))
    _, estimate = _sampled(records, s_max=1024)
    target = estimate.block_hit_ratio(20_000)
    capacity = estimate.smallest_capacity(target)
    assert capacity <= 20_000 and estimate.block_hit_ratio(capacity) >= target
    assert estimate.block_hit_ratio(capacity - 1) < target
    assert estimate.block_hit_ratio(estimate.saturation_capacity) == estimate.block_hit_ratio(10**9)
    ratios = [estimate.block_hit_ratio(c) for c in range(0, 80_000, 97)]
    assert ratios == sorted(ratios) and ratios[0] == 0


def test_bad_settings_are_config_errors():
    for rate in (0, 1.5):
        with pytest.raises(ConfigError, match="sample_rate"):
            SampledCurveBuilder(block_size=1, sample_rate=rate)
    with pytest.raises(ConfigError, match="s_max"):
        SampledCurveBuilder(block_size=1, s_max=0)
    with pytest.raises(ConfigError, match="correction"):
        SampledCurveBuilder(block_size=1, correction="nope")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="block_size"):
        SampledCurveBuilder(block_size=0)


def test_sliding_window_reads_past_the_top_use_the_windows_share_of_kept_keys():
    keys = list(range(1, 401))
    records = [
        Record("a", 0, Op.WRITE, keys),
        Record("a", 1, Op.WRITE, list(range(1000, 1100))),  # pushes keys past a top of 16..32
        Record("a", 2, Op.READ, keys, 0, 0, Query.REVERSE_ROLL_SW_MATCH, 80),
    ]
    exact = lru_curve(records, block_size=1)
    _, estimate = _sampled(records, 1, s_max=16, sample_rate=0.5)
    assert exact.block_hit_ratio(10**6) == 80 / 400
    assert estimate.block_hit_ratio(10**6) == pytest.approx(80 / 400, abs=0.1)


def test_shards_error_names_the_capacity_of_the_largest_error_and_its_sign():
    records = list(generate_records(TraceShape(distinct_blocks=30_000, seed=4)))
    exact = lru_curve(records, block_size=16)
    _, estimate = _sampled(records, s_max=256)
    caps = shards_grid(exact)
    error = shards_error(exact, estimate, caps)
    signed = {c: estimate.block_hit_ratio(c) - exact.block_hit_ratio(c) for c in caps}
    worst = max(caps, key=lambda c: abs(signed[c]))
    assert error["max_at_capacity"] == worst and error["error_at_max"] == signed[worst] != 0
    assert error["max_abs_error"] == abs(signed[worst]) >= error["mean_abs_error"] > 0
    with pytest.raises(ConfigError):
        shards_error(exact, estimate, [])
