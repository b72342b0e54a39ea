"""Sweeps, the cost model, reports and their plots."""

from __future__ import annotations

import json

import pytest

from chalicelib.optimizer.cost import CostModel
from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.mrc import lru_curve
from chalicelib.optimizer.replay import replay
from chalicelib.optimizer.report import build_report, write_report
from chalicelib.optimizer.sweep import PointResult, SweepSettings, TraceSpec, TraceSummary, sweep
from tests.helpers import CONVERSATION, EVENT_LOG


def test_parallel_sweep_matches_sequential():
    spec = TraceSpec(str(EVENT_LOG))
    caps, policies = [50, 400], ["lru", "leaf_aware_lru"]
    settings = SweepSettings(mode="instance_rough", batch_size=8)
    parallel = sweep(spec, caps, policies, settings=settings, workers=2)
    sequential = sweep(spec, caps, policies, settings=settings, workers=1)
    assert [p.totals for p in parallel.points] == [p.totals for p in sequential.points]
    assert {p.method for p in parallel.points} == {"replay"}  # rough mode: no curve
    with pytest.raises(ConfigError):
        sweep(spec, caps, policies, settings=SweepSettings(mode="group_rough"), split_instances=True, workers=1)


def test_report_on_the_conversation_trace(conversation, tmp_path):
    settings = SweepSettings(block_size=512)
    caps = [2000, 10000, 40000]
    points = []
    for policy in ("lru", "lfu"):
        for c in caps:
            t = replay(conversation, settings.replay_config(policy, c)).totals
            points.append(PointResult(policy, c, None, t, "replay", 0.0))
    curve = lru_curve(conversation, block_size=512)
    summary = TraceSummary.of(conversation)
    cost = CostModel()
    report = build_report(
        trace={"name": CONVERSATION.name},
        settings=settings.to_dict(),
        points=points,
        duration_s=summary.duration_s,
        target=0.3,
        cost=cost,
        curve=curve,
    )
    smallest = report["smallest_capacity"]
    assert smallest["lru"] == {
        "capacity": curve.smallest_capacity(0.3),
        "block_hit_ratio": pytest.approx(0.3, abs=1e-4),
        "exact": True,
    }
    assert smallest["lfu"]["capacity"] == 40000 and not smallest["lfu"]["exact"]
    rec = report["recommendation"]
    assert rec["policy"] == "lru" and rec["capacity"] == smallest["lru"]["capacity"]
    expected = cost.savings(curve.totals(rec["capacity"]).external_hit_tokens, summary.duration_s)
    assert rec["gpus"] == pytest.approx(expected["gpus"])
    timeseries = replay(conversation, settings.replay_config("lru", rec["capacity"]))
    files = write_report(report, tmp_path, timeseries=timeseries)
    names = {f.name for f in files}
    assert names == {"report.json", "timeseries.csv", "hit_ratio_vs_capacity.png", "hit_rate_over_time.png"}
    for png in ("hit_ratio_vs_capacity.png", "hit_rate_over_time.png"):
        data = (tmp_path / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 20_000
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["plots"] == ["hit_ratio_vs_capacity.png", "hit_rate_over_time.png"]
    assert saved["timeseries"]["capacity"] == rec["capacity"]
    assert len(saved["savings"]) == 6 and saved["curve"]["exact"] is True
