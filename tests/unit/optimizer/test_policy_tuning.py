"""The reclaim parameter a group's policy needs (optimizer/policy_tuning.py): reuse times,
the TTL that keeps the hit ratio within the tolerance of no expiry, and the lowest
watermark that holds ideal LRU's hit ratio at the whole quota, both by replaying the
``kvcm`` policy."""

from __future__ import annotations

import pytest

from chalicelib.optimizer.policy_tuning import (
    HIT_RATIO_TOLERANCE,
    MAX_TTL_FACTOR,
    MAX_WATERMARK_STEP,
    ReclaimSettings,
    recommend_ttl,
    recommend_watermark,
    reuse_times,
    simulate,
)
from chalicelib.optimizer.traces import Op, Record
from chalicelib.optimizer.tuning import evaluate, instance_curves

SECOND = 1_000_000


def _settings(**changes) -> ReclaimSettings:
    base = {"order": "lru", "used_percentage": 0.9, "step_percentage": 10, "period_s": 1, "ttl_s": 0, "round_s": 1.0}
    return ReclaimSettings(**{**base, **changes})


def test_reuse_times_run_from_the_last_access_a_write_never_refreshes():
    records = [
        Record("a", 0, Op.WRITE, [1, 2]),
        Record("a", 5 * SECOND, Op.READ, [1, 2, 3, 2]),  # 3 was never written: the prefix ends
        Record("b", 6 * SECOND, Op.READ, [1]),  # another instance's block
        Record("a", 7 * SECOND, Op.READ, [1]),
        Record("a", 8 * SECOND, Op.WRITE, [1]),
        Record("a", 10 * SECOND, Op.REQUEST, [1, 4]),
        Record("a", 11 * SECOND, Op.READ, [4]),
    ]
    assert reuse_times(records) == [5.0, 5.0, 2.0, 3.0, 1.0]


def _two_loops(fast_chains: int, slow_chains: int, cycles: int) -> list[Record]:
    """One request a second: ``fast_chains`` 4-block chains each read every ``fast_chains``
    seconds, and every 10th second one of ``slow_chains`` chains (reused every 10 x
    ``slow_chains`` seconds)."""
    records = []
    t = 0
    for n in range(cycles * 10 * slow_chains):
        if n % 10 == 9:
            chain = 1000 + (n // 10) % slow_chains
        else:
            chain = n % fast_chains
        records.append(Record("a", t, Op.REQUEST, [chain * 10 + b for b in range(4)]))
        t += SECOND
    return records


def test_the_ttl_is_the_shortest_reuse_quantile_within_the_tolerance_of_no_expiry():
    records = _two_loops(fast_chains=5, slow_chains=6, cycles=6)  # reuses after ~5 s and 60 s
    limits = {"a": 1000}  # room for everything: only the TTL loses hits
    rec = recommend_ttl(records, limits, _settings(order="ttl"), block_size=16)
    assert rec is not None and rec["parameter"] == "ttl_seconds" and rec["current"] == 0
    by_ttl = {c["value"]: c["hit_ratio"] for c in rec["candidates"]}
    reference = rec["reference"]["hit_ratio"]
    assert reference > 0.8
    # the median reuse (the fast loop) would drop the slow loop's tenth of the reads
    short = min(by_ttl)
    assert short < 60 and by_ttl[short] < reference - 0.05
    # the recommendation keeps the slow loop: the shortest candidate within the tolerance
    assert 60 <= rec["optimum"] < 120 and by_ttl[rec["optimum"]] >= reference - HIT_RATIO_TOLERANCE
    assert all(v < reference - HIT_RATIO_TOLERANCE for ttl, v in by_ttl.items() if ttl < rec["optimum"])
    assert rec["recommended"] == rec["optimum"]  # no TTL yet: nothing to step from


def test_a_ttl_moves_at_most_a_factor_per_run():
    records = _two_loops(fast_chains=5, slow_chains=6, cycles=6)
    rec = recommend_ttl(records, {"a": 1000}, _settings(order="ttl", ttl_s=10), block_size=16)
    assert rec is not None and rec["optimum"] >= 60
    assert rec["recommended"] == 10 * MAX_TTL_FACTOR and rec["expected_gain"] >= 0


def _loop_and_stream(cycles: int = 30, chains: int = 12) -> list[Record]:
    """A 48-block loop (4-block chains, one a second) beside a stream of new blocks."""
    records = []
    fresh = 10**6
    for n in range(cycles * chains):
        records.append(Record("a", n * SECOND, Op.REQUEST, [(n % chains) * 10 + b for b in range(4)]))
        records.append(Record("a", n * SECOND + SECOND // 2, Op.REQUEST, [fresh + n]))
    return records


def test_the_watermark_is_the_lowest_that_holds_ideal_lru_at_the_whole_quota():
    records = _loop_and_stream()
    limits = {"a": 100}  # the loop's reuse distance is ~59 blocks: it fits in 100, not in 50
    reference = evaluate(instance_curves(records, 16), limits, used_fraction=1.0).hit_ratio
    rec = recommend_watermark(records, limits, _settings(used_percentage=0.5), 16, reference)
    by_used = {c["value"]: c["hit_ratio"] for c in rec["candidates"]}
    # rounds trimming to half the quota cut the loop; a watermark over its working set holds it
    assert by_used[0.5] < reference - 0.2
    assert 0.5 < rec["optimum"] < 0.95 and by_used[rec["optimum"]] >= reference - HIT_RATIO_TOLERANCE
    assert all(v < reference - HIT_RATIO_TOLERANCE for u, v in by_used.items() if u < rec["optimum"])
    assert rec["recommended"] == pytest.approx(0.5 + MAX_WATERMARK_STEP) and rec["expected_gain"] > 0
    # from above, it comes down toward the same optimum (room for writes between rounds)
    high = recommend_watermark(records, limits, _settings(used_percentage=0.95), 16, reference)
    assert high["optimum"] == rec["optimum"] and high["recommended"] == pytest.approx(0.95 - MAX_WATERMARK_STEP)


def test_simulate_counts_the_group_over_its_instances():
    records = _loop_and_stream(cycles=3) + [Record("b", 0, Op.REQUEST, [1, 2])]
    alone = simulate([r for r in records if r.instance == "a"], {"a": 100}, _settings(), 16)
    both = simulate(records, {"a": 100}, _settings(), 16)  # b has no limit: not simulated
    assert both == alone and 0 < alone.hit_ratio < 1
