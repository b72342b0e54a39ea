"""Sweeps, the cost model, reports and their plots."""

from __future__ import annotations

import json

import pytest

from chalicelib.optimizer.cost import CostModel
from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.replay import ReplayConfig, replay
from chalicelib.optimizer.report import build_report, flatten_results, log_capacities
from chalicelib.optimizer.sweep import PointResult, SweepSettings, TraceSpec, grid, sweep
from chalicelib.optimizer.traces import Op, Record

from .synth import random_trace


def write_trace(path, records):
    """Upstream-schema JSONL of ``records`` (so a sweep can read them back)."""
    kinds = {Op.READ: "get", Op.WRITE: "write", Op.REQUEST: "request"}
    with open(path, "w") as handle:
        for r in records:
            handle.write(
                json.dumps(
                    {
                        "type": kinds[r.op],
                        "instance_id": r.instance,
                        "timestamp_us": r.timestamp_us,
                        "keys": list(r.keys),
                    }
                )
                + "\n"
            )
    return path


def test_grid():
    points = grid([5, 1, 5], ["lru", "LFU"], ["a", "b"])
    assert [(p.policy, p.capacity, p.instance) for p in points[:3]] == [
        ("lru", 1, "a"),
        ("lru", 1, "b"),
        ("lru", 5, "a"),
    ]
    assert len(points) == 8
    with pytest.raises(ConfigError):
        grid([], ["lru"])
    with pytest.raises(ConfigError):
        grid([1], ["nope"])


def test_sweep_in_process_equals_replays(tmp_path):
    records = random_trace(3, requests=200, instances=("a", "b", "c"))
    path = write_trace(tmp_path / "t.jsonl", records)
    settings = SweepSettings(block_size=4)
    result = sweep(
        TraceSpec(str(path), block_size=4),
        [3, 12, 40],
        ["lru", "lfu", "random_lru"],
        settings=settings,
        workers=1,
        split_instances=True,
    )
    assert len(result.points) == 3 * 3 * 3
    assert sorted(result.summary.instances) == ["a", "b", "c"]  # in order of appearance
    for point in result.points:
        expected = replay(
            [r for r in records if r.instance == point.instance], settings.replay_config(point.policy, point.capacity)
        ).totals
        assert point.totals == expected
        assert point.method == ("curve" if point.policy == "lru" else "replay")


def test_point_result_round_trip():
    records = random_trace(1, requests=30)
    totals = replay(records, ReplayConfig(capacity=5, block_size=4)).totals
    point = PointResult("lfu", 5, None, totals, "replay", 0.5)
    assert PointResult.from_dict(json.loads(json.dumps(point.to_dict()))) == point


def test_cost_model_arithmetic():
    model = CostModel(model_params=7e9, gpu_flops=1e15, mfu=0.5, gpu_hour_price=3.0)
    saved = model.savings(1e9, duration_s=7200)
    # 1e9 tokens x 1.4e10 FLOPs / 5e14 FLOP/s = 28,000 GPU-seconds
    assert saved["gpu_seconds"] == pytest.approx(28_000)
    assert saved["gpus"] == pytest.approx(28_000 / 7200)
    assert saved["cost"] == pytest.approx(28_000 / 3600 * 3.0)
    assert saved["cost_per_hour"] == pytest.approx(saved["cost"] / 2)
    assert CostModel(flops_per_token=10.0).token_flops == 10.0
    assert model.savings(5, duration_s=0)["gpus"] is None
    with pytest.raises(ConfigError):
        CostModel(mfu=1.5)


def test_default_target_and_flatten():
    records = [Record("i", t, Op.REQUEST, [1, 2]) for t in range(4)]
    t = replay(records, ReplayConfig(capacity=2, block_size=1)).totals  # 6 of 8 blocks hit
    report = build_report(
        trace={},
        settings={},
        points=[PointResult("lfu", 2, None, t, "replay", 0)],
        duration_s=3e-6,
        target=None,
        cost=CostModel(),
    )
    assert report["target_hit_ratio"] == pytest.approx(0.9 * 0.75)
    assert report["recommendation"]["capacity"] == 2
    assert flatten_results([[{"a": 1}, [{"b": 2}]], {"c": 3}, "x"]) == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert log_capacities(1, 1000, 4) == [1, 10, 100, 1000]
