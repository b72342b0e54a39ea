"""The one-pass curve equals replays on random traces (the real traces: tests/integration)."""

from __future__ import annotations

import pytest

from chalicelib.optimizer.mrc import lru_curve
from chalicelib.optimizer.replay import ReplayConfig, replay

from .synth import random_trace


@pytest.mark.parametrize("seed", range(6))
def test_curve_equals_replays_on_random_traces(seed):
    mixed = seed % 2 == 1
    records = random_trace(900 + seed, requests=160, mixed=mixed)
    curve = lru_curve(records, block_size=4)
    top = curve.saturation_capacity + 2
    for capacity in range(0, top + 1):
        # reads that are not followed by a write of their keys need read_refresh off;
        # request-only traces give the same answer either way
        for refresh in (False,) if mixed else (False, True):
            result = replay(records, ReplayConfig(capacity=capacity, block_size=4, read_refresh=refresh))
            assert curve.totals(capacity) == result.totals, (capacity, refresh)


def test_long_requests_and_many_instances():
    from chalicelib.optimizer.traces import Op, Record

    long = list(range(5000))
    records = [
        Record("a", 0, Op.REQUEST, long),
        Record("b", 1, Op.REQUEST, long[:10]),
        Record("a", 2, Op.REQUEST, long + [9999]),
        Record("a", 3, Op.REQUEST, long[:3]),
    ]
    curve = lru_curve(records, block_size=1)
    for capacity in (0, 3, 4999, 5000, 5001, 6000):
        assert curve.totals(capacity) == replay(records, ReplayConfig(capacity=capacity, block_size=1)).totals
