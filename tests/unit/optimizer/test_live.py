"""The live curve (fixed-size SHARDS over the pre-sampled hit feed) against the same
model unsampled, on generated traces of several sizes and shapes; and its saved state."""

from __future__ import annotations

import pytest

from chalicelib.observability.hit_feed import HASH_RANGE, KEYWISE, PREFIX, READ, WRITE, FeedEntry, HitFeed, threshold_of
from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.live import LiveCurve
from chalicelib.optimizer.tracegen import TraceShape, generate_records


def entries(shape: TraceShape, feed: HitFeed):
    """Each request as the service feeds it: its prefix read, then its write."""
    for record in generate_records(shape):
        for entry in (feed.read("i", PREFIX, record.keys), feed.write(record.keys)):
            if entry is not None:
                yield entry


def grid(curve, top: int, points: int = 40) -> list[float]:
    return [curve.block_hit_ratio(max(1, top * i // points)) or 0.0 for i in range(1, points + 1)]


SHAPES = [
    TraceShape(distinct_blocks=100_000, seed=1),
    TraceShape(distinct_blocks=200_000, seed=2, reuse_skew=1.0, fork=0.3),
    pytest.param(TraceShape(distinct_blocks=300_000, seed=3, system_prompts=0, live=500), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("shape", SHAPES, ids=["100k", "200k-skewed-forks", "300k-no-system-prompts"])
def test_sampled_live_curve_is_within_0_01_of_the_unsampled_one(shape):
    exact = LiveCurve(threshold=HASH_RANGE, s_max=10**9)
    for entry in entries(shape, HitFeed(HASH_RANGE, 0)):
        exact.feed(entry)
    sampled = LiveCurve(threshold=threshold_of(1 / 8), s_max=8192)
    for entry in entries(shape, HitFeed(threshold_of(1 / 8), 0)):
        sampled.feed(entry)
    assert sampled.kept <= 8192
    assert sampled.sample_rate < 1 / 8  # the sample outgrew s_max: the rate went down
    want, got = grid(exact.curve(), shape.distinct_blocks), grid(sampled.curve(), shape.distinct_blocks)
    error = max(abs(a - b) for a, b in zip(want, got, strict=True))
    print(f"{shape.distinct_blocks}: max error {error:.4f}")
    assert error <= 0.01, (error, want, got)
    assert max(want) > 0.2  # the traces reuse blocks: the curve is not flat at 0


def test_a_prefix_read_stops_at_its_first_block_never_written_and_a_keywise_one_does_not():
    curve = LiveCurve(threshold=HASH_RANGE)
    curve.feed(FeedEntry(WRITE, PREFIX, [3, 1]))  # 3 on top
    curve.feed(FeedEntry(READ, PREFIX, [1, 2, 3], asked=3))  # 1 hits, 2 never written: 3 does not count
    assert curve.curve().block_hit_ratio(10) == pytest.approx(1 / 3)
    assert curve.curve().block_hit_ratio(1) == 0  # 1 was at distance 2
    curve.feed(FeedEntry(READ, KEYWISE, [1, 2, 3], asked=3))  # 1 (touched: on top) and 3 hit
    assert curve.curve().block_hit_ratio(10) == pytest.approx(3 / 6)
    assert curve.curve().block_hit_ratio(1) == pytest.approx(1 / 6)  # 1 at distance 1 now, 3 at 2


def test_the_saved_state_continues_exactly_where_it_stopped():
    shape = TraceShape(distinct_blocks=20_000, seed=4)
    feed = HitFeed(threshold_of(1 / 4), 0)
    stream = list(entries(shape, feed))
    whole = LiveCurve(threshold=feed.threshold, s_max=1024)
    for entry in stream:
        whole.feed(entry)
    resumed = LiveCurve(threshold=feed.threshold, s_max=1024)
    for n, entry in enumerate(stream):
        if n % 5000 == 0:
            resumed = LiveCurve.from_bytes(resumed.to_bytes())
        resumed.feed(entry)
    caps = range(1, 20_000, 500)
    assert whole.curve().at(caps) == resumed.curve().at(caps)
    assert resumed.kept == whole.kept <= 1024
    assert len(resumed.to_bytes()) < 64 * 1024  # bounded by s_max, not by the trace


def test_lowering_the_feed_rate_drops_the_keys_above_it():
    curve = LiveCurve(threshold=HASH_RANGE)
    curve.feed(FeedEntry(WRITE, PREFIX, list(range(1000))))
    curve.lower(threshold_of(0.1))
    assert 50 < curve.kept < 150
    with pytest.raises(ConfigError, match="s_max"):
        LiveCurve(threshold=1, s_max=0)


def lru_counts(stream, capacity: int) -> tuple[int, int]:
    """Peak size and evictions of an LRU cache of ``capacity`` blocks touched as the live
    curve's model touches (a write its keys, a read the keys it finds; the first key on top)."""
    from collections import OrderedDict

    cache: OrderedDict[int, None] = OrderedDict()
    seen: set[int] = set()
    peak = evictions = 0
    for entry in stream:
        keys = list(dict.fromkeys(entry.keys))
        if entry.op == READ:
            found = []
            for key in keys:
                if key not in seen:
                    if entry.query == PREFIX:
                        break
                    continue
                found.append(key)
            keys = found
        for key in reversed(keys):
            seen.add(key)
            cache[key] = None
            cache.move_to_end(key)
            if len(cache) > capacity:
                cache.popitem(last=False)
                evictions += 1
        peak = max(peak, len(cache))
    return peak, evictions


def test_unique_keys_and_evictions_match_an_lru_cache_fed_the_same_touches():
    shape = TraceShape(distinct_blocks=20_000, seed=5)
    stream = list(entries(shape, HitFeed(HASH_RANGE, 0)))
    exact = LiveCurve(threshold=HASH_RANGE, s_max=10**9)
    for entry in stream:
        exact.feed(entry)
    sampled = LiveCurve(threshold=threshold_of(1 / 8), s_max=8192)
    for entry in entries(shape, HitFeed(threshold_of(1 / 8), 0)):
        sampled.feed(entry)
    assert exact.unique_keys == lru_counts(stream, 10**9)[0]
    assert sampled.unique_keys == pytest.approx(exact.unique_keys, rel=0.05)
    for capacity in (1_000, 4_000, 12_000):
        peak, evictions = lru_counts(stream, capacity)
        assert min(capacity, exact.unique_keys) == peak
        print(f"{capacity}: {evictions} evictions, sampled {sampled.evictions(capacity)}")
        assert exact.evictions(capacity) == evictions
        assert sampled.evictions(capacity) == pytest.approx(evictions, rel=0.1)
